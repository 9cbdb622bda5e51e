"""Carry a chain of actions found on one nest over to a nest that differs from it only in names.

Models repeat their operators: an attention block has four projections of one shape (q, k, v and the
output), a transformer layer two such blocks. A search that optimises each copy on its own pays for the same
discovery once per copy; `transfer` rewrites the chain that a search found for one nest so that it acts on
the other, and the agent then spends one short replay (steps whose runtimes are mostly predictions, the last
one measured when it looks like a gain) instead of a search.

The rewrite is exact or refused. Before each action, every nest the chain has made or changed so far (its
region: the focus nest and what its actions created or rewrote) must match the other nest's region one to
one up to names (`nest_renaming`); the action's nest indices move to the other region's, and its loop and
tensor names are renamed. An action that does not apply to the other nest ends the transfer (None).
"""
from __future__ import annotations

from collections.abc import Sequence

from steptp_env.errors import StepTPError
from steptp_env.ir.canonical import nest_renaming
from steptp_env.ir.printer import print_nest
from steptp_env.ir.program import Program
from steptp_env.strategies import apply_action
from steptp_env.strategies.base import Action, Value

NEST_KEYS = ("nest", "other", "consumer", "nests")
"""Parameters that hold nest indices."""
NAME_KEYS = ("loop", "loops", "order", "tensor", "tensors", "at", "of", "by", "dims")
"""Parameters that hold loop variable or tensor names (an integer in them, such as `additive_split`'s
`at`, is not a name and stays)."""


def named_nests(action: Action) -> list[int]:
    """The nest indices an action names, in parameter order (none for a program-wide action)."""
    return [v for key, value in action.params if key in NEST_KEYS
            for v in (value if isinstance(value, tuple) else (value,))]


def _region(program: Program, frozen: set[str]) -> list[int]:
    """Indices of the nests whose text is not one of the `frozen` texts (the nests a chain left alone)."""
    return [i for i, nest in enumerate(program.nests) if print_nest(nest) not in frozen]


def _frozen(program: Program, nest: int) -> set[str]:
    return {print_nest(n) for i, n in enumerate(program.nests) if i != nest}


def _rename(value: Value, mapping: dict) -> Value:
    if isinstance(value, tuple):
        return tuple(_rename(v, mapping) for v in value)
    return mapping.get(value, value)


def _rewrite(action: Action, source: Program, source_region: list[int], target: Program,
             target_region: list[int]) -> Action | None:
    """`action` (on the source region) moved onto the target region, or None when the regions differ in
    more than names or the action names a nest outside its region."""
    if len(source_region) != len(target_region):
        return None
    renamings = [nest_renaming(print_nest(source.nests[s]), print_nest(target.nests[t]))
                 for s, t in zip(source_region, target_region)]
    if any(r is None for r in renamings):
        return None
    tensors: dict[str, str] = {}
    for renaming in renamings:
        for old, new in renaming.tensors.items():
            if tensors.setdefault(old, new) != new:
                return None
    index = dict(zip(source_region, target_region))
    named = named_nests(action)
    if not named or any(n not in index for n in named):
        return None
    loops = renamings[source_region.index(named[0])].loops  # loop names are those of the action's first nest
    names = {**tensors, **loops}
    params = []
    for key, value in action.params:
        if key in NEST_KEYS:
            value = _rename(value, index)
        elif key in NAME_KEYS:
            value = _rename(value, names)
        params.append((key, value))
    return Action(action.strategy, tuple(params))


def transfer(source: Program, nest: int, chain: Sequence[str], target: Program, other: int) -> list[str] | None:
    """The action texts that do to nest `other` of `target` what `chain` did to nest `nest` of `source`, or
    None when the chain does not carry over (the nests differ in more than names at some step, or a
    rewritten action does not apply). The returned chain applies to `target` in order."""
    frozen_source, frozen_target = _frozen(source, nest), _frozen(target, other)
    source_region, target_region = [nest], [other]
    texts = []
    for text in chain:
        moved = _rewrite(Action.parse(text), source, source_region, target, target_region)
        if moved is None:
            return None
        try:
            source, target = apply_action(source, text), apply_action(target, moved)
        except StepTPError:
            return None
        source_region, target_region = _region(source, frozen_source), _region(target, frozen_target)
        texts.append(moved.text)
    return texts


def twins(program: Program, nest: int) -> list[int]:
    """The other nests of `program` that differ from nest `nest` only in names, in program order."""
    text = print_nest(program.nests[nest])
    return [i for i, n in enumerate(program.nests) if i != nest and nest_renaming(text, print_nest(n)) is not None]
