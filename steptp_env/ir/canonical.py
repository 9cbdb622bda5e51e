"""A program's text up to fresh names: what "the same program" means to `identify` and to the
environment's revisit mask.

Strategies invent names (intermediate tensors, split loops), so two routes to one program can differ in
nothing else. The canonical text renames, in one pass over the canonical LEIR text, every loop variable
in the order of the loop headers (a bound loop keeps its hardware-axis prefix, `bya` binds blockIdx.y:
another axis is another program) and every intermediate tensor in the order of first appearance.
Signature tensors keep their names. Every use of a loop variable follows its header in the text, so
one left-to-right pass with the latest header's renaming is exact.

`nest_renaming` compares two nests the same way and returns the renaming itself: the search agents use it
to carry a chain found on one nest over to a nest that differs from it only in names (the projections of an
attention block).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .program import Program

AXIS_PREFIXES = ("bx", "by", "bz", "tx", "ty", "tz")
"""Bound-loop name prefixes, as the lowering reads them."""

_TOKEN = re.compile(r"([A-Z])\^\{(\d+)\}_\{(\w+)=0\}"  # a loop header: kind, extent, variable
                    r"|(?<![\w.])([A-Za-z_]\w*)(\^\{[^}]*\})"  # a tensor name and its head {dtype,scope}
                    r"|(?<![\w.])([A-Za-z_]\w*)(?!\w)")  # any other name: a loop variable, a function, a constant


def canonical_text(program: Program) -> str:
    """`program.leir` with fresh names made canonical (see the module docstring)."""
    known = {t.name for t in program.signature.tensors}
    loops: dict[str, str] = {}
    tensors: dict[str, str] = {}
    headers = 0

    def rename(match: re.Match) -> str:
        nonlocal headers
        kind, extent, var, tensor, head, word = match.groups()
        if var is not None:
            prefix = var[:2] if kind == "B" and var[:2] in AXIS_PREFIXES else ""
            loops[var] = f"{prefix}z{headers}"
            headers += 1
            return f"{kind}^{{{extent}}}_{{{loops[var]}=0}}"
        if tensor is not None:
            if tensor in known:
                return match.group(0)
            return tensors.setdefault(tensor, f"Q{len(tensors)}q") + head
        return loops.get(word, word)

    return _TOKEN.sub(rename, program.leir)


@dataclass(frozen=True)
class NestRenaming:
    """How the names of one nest's text map onto another's: `tensors` (global names) and `loops` (the
    nest's own loop variables)."""

    tensors: dict[str, str]
    loops: dict[str, str]


def nest_renaming(source: str, target: str) -> NestRenaming | None:
    """The renaming of tensors and loop variables that turns nest text `source` into `target`, every other
    character equal (extents, scopes, dtypes, operators, functions, constants), or None when the two nests
    differ in more than names. A name maps to one name only, and no two names to the same one."""
    a, b = list(_TOKEN.finditer(source)), list(_TOKEN.finditer(target))
    if len(a) != len(b):
        return None
    tensors: dict[str, str] = {}
    loops: dict[str, str] = {}
    end_a = end_b = 0
    for ma, mb in zip(a, b):
        if source[end_a:ma.start()] != target[end_b:mb.start()]:
            return None
        end_a, end_b = ma.end(), mb.end()
        kind_a, extent_a, var_a, tensor_a, head_a, word_a = ma.groups()
        kind_b, extent_b, var_b, tensor_b, head_b, word_b = mb.groups()
        if (var_a is None) != (var_b is None) or (tensor_a is None) != (tensor_b is None):
            return None
        if var_a is not None:
            if (kind_a, extent_a) != (kind_b, extent_b) or loops.setdefault(var_a, var_b) != var_b:
                return None
        elif tensor_a is not None:
            if head_a != head_b or tensors.setdefault(tensor_a, tensor_b) != tensor_b:
                return None
        elif loops.get(word_a, word_a) != word_b:  # a loop variable's use, or a function or constant as is
            return None
    if source[end_a:] != target[end_b:]:
        return None
    if len(set(tensors.values())) != len(tensors) or len(set(loops.values())) != len(loops):
        return None
    return NestRenaming(tensors, loops)
