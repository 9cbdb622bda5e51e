"""Which candidate actions would bring an episode back to a program it already visited, or change nothing.

A policy paid per step can farm rewards in a loop: undo a step and redo it, or take an action that leaves
the program as it is, each time collecting whatever noise or model error the pair carries. Both are moves
to a program the episode has seen (a no-op goes to the current one). The environment refuses such a step
once it has applied it (one canonical text), and with `revisits="mask"` finds them all up front: every
candidate applied (the LEIR rewrite, not a build) and its result compared with the episode's programs up
to fresh names (`canonical_text`). That costs about 2 ms per candidate, hundreds per state at `small`,
so it is not the default; results are remembered per program, so a state met again costs nothing.
"""
from __future__ import annotations

from collections import OrderedDict

from ..errors import StepTPError
from ..ir.canonical import canonical_text
from ..ir.program import Program
from ..strategies import Action, apply_action

REVISITS = ("refuse", "mask", "allow")
CACHE_SIZE = 1024
_SUCCESSORS: OrderedDict[tuple, dict[Action, str | None]] = OrderedDict()


def successors(program: Program, groups: dict[str, list[Action]]) -> dict[Action, str | None]:
    """The canonical text each candidate leads to (None where it does not apply), remembered per program."""
    key = (program.leir, program.signature)
    found = _SUCCESSORS.get(key)
    if found is not None:
        _SUCCESSORS.move_to_end(key)
        return found
    found = {}
    for actions in groups.values():
        for action in actions:
            try:
                found[action] = canonical_text(apply_action(program, action))
            except StepTPError:
                found[action] = None
    _SUCCESSORS[key] = found
    if len(_SUCCESSORS) > CACHE_SIZE:
        _SUCCESSORS.popitem(last=False)
    return found


def revisiting(program: Program, groups: dict[str, list[Action]], visited: set[str]) -> set[Action]:
    """The candidates of `program` that lead to a program in `visited` (canonical texts)."""
    return {action for action, text in successors(program, groups).items() if text in visited}
