"""The fixed action catalog of index mode: `Discrete(1 + 43 * SLOTS)`.

Index 0 is "stop". Index `1 + s * SLOTS + r` is strategy number `s` of `STRATEGY_NAMES` (the Step-TP
order, fixed for all time, implemented or not) and rank `r`: the r-th candidate of that strategy in its
enumeration order, which is the same rule in every state: nests in program order, loops outer to inner,
then the strategy's parameter menu in its documented order (factors ascending, ...). So an index always
means the same strategy, and within it "the r-th site/parameter choice". Candidates beyond rank
`SLOTS - 1` are reachable in text mode only.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..strategies import REGISTRY, STRATEGY_NAMES, Action
from ..ir.program import Program

SLOTS = 32
STOP = 0
GROUPS_CACHE_SIZE = 1024
_GROUPS: OrderedDict[tuple, dict[str, list[Action]]] = OrderedDict()


def candidate_groups(program: Program, target: str) -> dict[str, list[Action]]:
    """Candidates of every implemented strategy, by name, remembered per process by program (LEIR and
    signature) and target: episodes revisit their start program, tree searches and forks revisit states,
    and a replay meets the programs its recording enumerated. Callers must not mutate the lists."""
    key = (program.leir, program.signature, target)
    found = _GROUPS.get(key)
    if found is None:
        found = {name: REGISTRY[name].candidates(program, target) for name in STRATEGY_NAMES if name in REGISTRY}
        _GROUPS[key] = found
        if len(_GROUPS) > GROUPS_CACHE_SIZE:
            _GROUPS.popitem(last=False)
    else:
        _GROUPS.move_to_end(key)
    return found


class ActionCatalog:
    """Maps indices to actions of one program's candidate lists (`groups`, by strategy name)."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.slots = slots
        self.size = 1 + len(STRATEGY_NAMES) * slots

    def groups(self, program: Program, target: str) -> dict[str, list[Action]]:
        """Candidates of every implemented strategy, by name, in enumeration order."""
        return candidate_groups(program, target)

    def describe(self, index: int) -> str:
        """What an index means, in words (`stop`, `loop_split#3`)."""
        if index == STOP:
            return "stop"
        strategy, rank = divmod(index - 1, self.slots)
        return f"{STRATEGY_NAMES[strategy]}#{rank}"

    def decode(self, index: int, groups: dict[str, list[Action]]) -> Action | None:
        """The action at `index` in this state; None for stop or an index whose slot is empty here."""
        if index == STOP:
            return None
        strategy, rank = divmod(index - 1, self.slots)
        found = groups.get(STRATEGY_NAMES[strategy], [])
        return found[rank] if rank < len(found) else None

    def encode(self, action: Action, groups: dict[str, list[Action]]) -> int | None:
        """The index of `action` in this state, or None when it has no slot."""
        found = groups.get(action.strategy, [])
        if action not in found or found.index(action) >= self.slots:
            return None
        return 1 + STRATEGY_NAMES.index(action.strategy) * self.slots + found.index(action)

    def mask(self, groups: dict[str, list[Action]]) -> np.ndarray:
        """Boolean mask of the legal indices (stop always legal)."""
        mask = np.zeros(self.size, dtype=bool)
        mask[STOP] = True
        for name, found in groups.items():
            start = 1 + STRATEGY_NAMES.index(name) * self.slots
            mask[start:start + min(len(found), self.slots)] = True
        return mask
