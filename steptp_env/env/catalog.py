"""The fixed action catalog of index mode: `Discrete(1 + 43 * SLOTS)`, versioned with the environment id.

Index 0 is "stop". Index `1 + s * SLOTS + r` is strategy number `s` of `STRATEGY_NAMES` (the Step-TP
order, fixed for all time, implemented or not) and rank `r`: the r-th candidate of that strategy in its
enumeration order, which is the same rule in every state: nests in program order, loops outer to inner,
then the strategy's parameter menu in its documented order (factors ascending, ...). So an index always
means the same strategy, and within it "the r-th site/parameter choice". Candidates beyond rank
`SLOTS - 1` are reachable in text mode only.

The meaning of a rank is the strategies' menus, so a change of menu is a new catalog version and a new
environment id. v0 (32 slots) had the narrow loop menus of the first release; v1 (64 slots) has independent
tile pairs, splits up to 64, unrolling up to 64 and "move a loop anywhere" reorders
(strategies/loops.py and loop_kinds.py), local accumulator tiles (`cache_read_write` with `at`, listed after the
strategy's whole-nest forms), blocked layouts (`layout_transformation`: the innermost loop's dimension
as vector lanes, packed or in place) and padded copies (listed after a nest's other layouts); v1 is
unreleased until 0.4.0, so it grows with that release. A v0 id is refused with this explanation rather
than silently giving its indices new meanings.
"""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

import numpy as np

from ..errors import StepTPError
from ..ir.program import Program
from ..measure import ResultStore
from ..strategies import REGISTRY, STRATEGY_NAMES, Action, code_digest

CATALOG_VERSION = "v1"
SLOTS = 64
STOP = 0
GROUPS_CACHE_SIZE = 1024
_GROUPS: OrderedDict[tuple, dict[str, list[Action]]] = OrderedDict()


def candidate_groups(program: Program, target: str, store: ResultStore | None = None) -> dict[str, list[Action]]:
    """Candidates of every implemented strategy, by name, remembered per process by program (LEIR and
    signature) and target: episodes revisit their start program, tree searches and forks revisit states,
    and a replay meets the programs its recording enumerated. With a `store`, lists are also read from and
    written to it (under a key that includes `code_digest`), so a fresh process replaying stored programs
    does not enumerate them again. Callers must not mutate the lists."""
    key = (program.leir, program.signature, target)
    found = _GROUPS.get(key)
    if found is not None:
        _GROUPS.move_to_end(key)
        return found
    text = stored_key = None
    if store is not None:
        stored_key = _stored_key(program, target)
        text = store.get_candidates(stored_key)
    if text is not None:
        found = {name: [Action(name, tuple((k, _tuples(v) if type(v) is list else v) for k, v in params))
                        for params in actions] for name, actions in json.loads(text).items()}
    else:
        found = {name: REGISTRY[name].candidates(program, target) for name in STRATEGY_NAMES if name in REGISTRY}
        if store is not None:
            store.put_candidates(stored_key, json.dumps({name: [a.params for a in found[name]] for name in found}))
    _GROUPS[key] = found
    if len(_GROUPS) > GROUPS_CACHE_SIZE:
        _GROUPS.popitem(last=False)
    return found


def _stored_key(program: Program, target: str) -> str:
    signature = json.dumps(program.signature.to_json(), sort_keys=True)
    text = "\0".join((program.leir, signature, target, code_digest()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _tuples(value: list) -> tuple:
    """A JSON list back to the tuple an action parameter was."""
    return tuple(_tuples(v) if type(v) is list else v for v in value)


class ActionCatalog:
    """Maps indices to actions of one program's candidate lists (`groups`, by strategy name)."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.slots = slots
        self.size = 1 + len(STRATEGY_NAMES) * slots

    def groups(self, program: Program, target: str, store: ResultStore | None = None) -> dict[str, list[Action]]:
        """Candidates of every implemented strategy, by name, in enumeration order (see `candidate_groups`)."""
        return candidate_groups(program, target, store)

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


def retired_catalog(**_kwargs) -> None:
    """Entry point of the StepTP-v0 ids: their indices meant the first release's menus, which are gone."""
    raise StepTPError(f"the StepTP-v0 action catalog was retired: its indices named the first release's "
                      f"strategy menus (32 slots), which changed. Use steptp_env/StepTP-{CATALOG_VERSION} (or "
                      f"-measure/-model/-hybrid-{CATALOG_VERSION}); recorded v0 trajectories replay by action "
                      f"text (agents.replay), not by index.")
