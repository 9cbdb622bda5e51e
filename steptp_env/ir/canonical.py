"""A program's text up to fresh names: what "the same program" means to `identify` and to the
environment's revisit mask.

Strategies invent names (intermediate tensors, split loops), so two routes to one program can differ in
nothing else. The canonical text renames, in one pass over the canonical LEIR text, every loop variable
in the order of the loop headers (a bound loop keeps its hardware-axis prefix, `bya` binds blockIdx.y:
another axis is another program) and every intermediate tensor in the order of first appearance.
Signature tensors keep their names. Every use of a loop variable follows its header in the text, so
one left-to-right pass with the latest header's renaming is exact.
"""
from __future__ import annotations

import re

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
