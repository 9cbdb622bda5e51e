"""Actions and strategies: the vocabulary of program transformations.

An `Action` is a strategy name with explicit parameters and a canonical text form,
`loop_split(nest=0, loop=c, factor=32)`, that parses back to an equal object. A `Strategy` enumerates the
actions legal on a program (`candidates`), applies one (`apply`, pure; `IllegalActionError` with the reason
when it does not apply), and explains a step in words grounded in the analysis (`explain`).
"""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable, Union

from ..errors import IllegalActionError
from ..ir.program import Program

Value = Union[int, str, tuple]

STRATEGY_NAMES = (
    "operator_fusion", "operator_fission", "compute_inline", "expression_splitting",
    "tensor_concat_to_fuse_operators", "tensor_split_to_decouple_operators", "common_subexpression_elimination",
    "dead_code_elimination", "expression_reorder", "loop_reorder", "loop_tiling", "loop_split", "loop_fusion",
    "loop_unrolling", "loop_parallelization", "loop_vectorization", "loop_binding", "reduction_factorization",
    "cache_read_write", "layout_transformation", "set_storage_scope", "set_storage_layout", "precompute_indices",
    "factorization", "expand_factorization", "cancellation", "expand_cancellation", "apart", "together",
    "powsimp", "expand_powsimp", "expand_log", "logsimp", "collect", "expand_collect",
    "partially_equivalent_then_correct", "normal_loop_max_to_prefix_max", "exponential_split",
    "multiplicative_split", "additive_split", "normal_loop_summation_on_exp_to_prefix_summation_on_exp",
    "online_softmax", "flashattention_wo_tiling",
)
"""The 43 atomic strategies of Step-TP, in its order."""

_VALUE = re.compile(r"-?\d+|[A-Za-z_][A-Za-z0-9_]*")


def _format(value: Value) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(_format(v) for v in value) + "]"
    return str(value)


def _parse_value(text: str) -> Value:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return tuple(_parse_value(t) for t in _split(inner)) if inner else ()
    if not _VALUE.fullmatch(text):
        raise IllegalActionError(f"malformed parameter value {text!r}")
    return int(text) if text.lstrip("-").isdigit() else text


def _split(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0:
            raise IllegalActionError(f"unbalanced brackets in {text!r}")
        current += ch
    if depth:
        raise IllegalActionError(f"unbalanced brackets in {text!r}")
    parts.append(current)
    return parts


@functools.lru_cache(maxsize=1 << 17)
def _action_text(strategy: str, params: tuple[tuple[str, Value], ...]) -> str:
    """`Action.text`, remembered: every step lists the texts of all candidates of the new state, and most
    of them are the previous state's."""
    return f"{strategy}(" + ", ".join(f"{k}={_format(v)}" for k, v in params) + ")"


@dataclass(frozen=True, slots=True)
class Action:
    """One strategy application: a name and its parameters in the strategy's declared order."""

    strategy: str
    params: tuple[tuple[str, Value], ...] = ()

    @classmethod
    def of(cls, strategy: str, **params: Value) -> Action:
        return cls(strategy, tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))

    def __getitem__(self, key: str) -> Value:
        for name, value in self.params:
            if name == key:
                return value
        raise KeyError(key)

    def get(self, key: str, default: Value | None = None) -> Value | None:
        try:
            return self[key]
        except KeyError:
            return default

    @property
    def text(self) -> str:
        return _action_text(self.strategy, self.params)

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str) -> Action:
        """Inverse of `text`; `IllegalActionError` for anything malformed."""
        match = re.fullmatch(r"\s*([a-z_]+)\s*\((.*)\)\s*", text, re.S)
        if match is None:
            raise IllegalActionError(f"not an action: {text!r} (expected name(key=value, ...))")
        name, body = match.groups()
        params = []
        if body.strip():
            for part in _split(body):
                key, sep, value = part.partition("=")
                if not sep or not re.fullmatch(r"\s*[a-z_]+\s*", key):
                    raise IllegalActionError(f"malformed parameter {part.strip()!r} in {text!r}")
                params.append((key.strip(), _parse_value(value)))
        return cls(name, tuple(params))


class Strategy:
    """Base class of the strategies; subclasses set `name` and implement the three methods.

    Each subclass docstring states the preconditions its `apply` checks."""

    name: str = ""
    params: tuple[str, ...] = ()
    alternative_params: tuple[str, ...] = ()
    """A second parameter set `check` accepts: a form of the strategy with other parameters (e.g.
    reduction_factorization's `lanes`, cache_read_write's `at`)."""
    nest_local: bool = False
    """True when the candidates at nest i depend only on that nest (and `nest_context`): they are then
    computed per nest and cached, so a step pays only for the nests it changed."""

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        if not self.nest_local:
            raise NotImplementedError
        found: list[Action] = []
        for i, nest in enumerate(program.nests):
            key = (self.name, target, _NestKey.of(nest), self.nest_context(program, i))
            hit = _NEST_CANDIDATES.get(key)
            if hit is None:
                if len(_NEST_CANDIDATES) >= 50_000:
                    _NEST_CANDIDATES.clear()
                hit = _NEST_CANDIDATES[key] = (i, self.nest_candidates(program, i, target))
            found.extend(hit[1] if hit[0] == i else [_renumber(a, i) for a in hit[1]])
        return found

    def nest_candidates(self, program: Program, index: int, target: str) -> list[Action]:
        """The candidates at nest `index` (for `nest_local` strategies)."""
        raise NotImplementedError

    def nest_context(self, program: Program, index: int) -> Hashable:
        """What besides the nest itself its candidates depend on (hashable); default nothing."""
        return None

    def apply(self, program: Program, action: Action) -> Program:
        raise NotImplementedError

    def explain(self, before: Program, action: Action, after: Program) -> str:
        raise NotImplementedError

    def matches_spelling(self, result: Program, answer: Program) -> bool:
        """Whether this strategy's `result` is `answer` written differently, for `identify` (which first
        compares canonical texts). Default: no other spelling is the same program."""
        return False

    def infer(self, before: Program, after: Program) -> list[Action]:
        """Actions outside the candidate menu that turn `before` into `after` (e.g. a split factor the menu
        does not offer); used by `identify`. Default: none."""
        return []

    # helpers for subclasses
    def action(self, **params: Value) -> Action:
        return Action.of(self.name, **params)

    def check(self, action: Action) -> None:
        if action.strategy != self.name:
            raise IllegalActionError(f"{action.text} is not a {self.name} action")
        names = [k for k, _ in action.params]
        if sorted(names) != sorted(self.params) and sorted(names) != sorted(self.alternative_params or ("",)):
            accepted = ", ".join(self.params) + (f" or {', '.join(self.alternative_params)}"
                                                 if self.alternative_params else "")
            raise IllegalActionError(f"{self.name} takes parameters {accepted}; got {', '.join(names)}")


_NEST_CANDIDATES: dict[tuple, tuple[int, list[Action]]] = {}


class _NestKey:
    """A nest as a cache key by content, its hash computed once per nest object: strategies often rebuild
    nests equal to ones already enumerated (38% of the nest enumerations of random episodes), and hashing
    a nest tree at every lookup would cost more than the cache saves."""

    __slots__ = ("nest", "hash")
    _BY_ID: dict[int, _NestKey] = {}

    def __init__(self, nest) -> None:
        self.nest, self.hash = nest, hash(nest)

    @classmethod
    def of(cls, nest) -> _NestKey:
        key = cls._BY_ID.get(id(nest))
        if key is None or key.nest is not nest:  # the key holds its nest, so a live id is never reused
            if len(cls._BY_ID) >= 50_000:
                cls._BY_ID.clear()
            key = cls._BY_ID[id(nest)] = cls(nest)
        return key

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _NestKey) and (self.nest is other.nest or self.nest == other.nest)


def _renumber(action: Action, index: int) -> Action:
    return Action(action.strategy, tuple((k, index if k == "nest" else v) for k, v in action.params))


REGISTRY: dict[str, Strategy] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    if cls.name not in STRATEGY_NAMES:
        raise ValueError(f"{cls.name!r} is not a Step-TP strategy name")
    REGISTRY[cls.name] = cls()
    return cls


def get_strategy(name: str) -> Strategy:
    try:
        return REGISTRY[name]
    except KeyError:
        known = "implemented" if name in STRATEGY_NAMES else "known"
        raise IllegalActionError(f"strategy {name!r} is not {known} here") from None


def candidates(program: Program, target: str = "llvm") -> list[Action]:
    """Every legal action of every implemented strategy, in the order of `STRATEGY_NAMES`."""
    found: list[Action] = []
    for name in STRATEGY_NAMES:
        if name in REGISTRY:
            found.extend(REGISTRY[name].candidates(program, target))
    return found


@functools.cache
def code_digest() -> str:
    """A hash of the sources candidate enumeration depends on (the IR and strategy packages): candidate
    lists persisted under it are never served to a different version of the code."""
    digest = hashlib.sha256()
    for package in (Path(__file__).parent, Path(__file__).parent.parent / "ir"):
        for path in sorted(package.glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def apply_action(program: Program, action: Action | str) -> Program:
    """Apply one action (an `Action` or its text); `IllegalActionError` when it does not apply."""
    if isinstance(action, str):
        action = Action.parse(action)
    strategy = get_strategy(action.strategy)
    strategy.check(action)
    return strategy.apply(program, action)


def random_chain(program: Program, rng, length: int, path: list[str]) -> Program:
    """Up to `length` actions drawn with `rng` (a seeded `random.Random`) among the current candidates,
    applied in turn (fewer where none is left); each action's text is appended to `path` before it is
    applied, so a caller still knows the chain when an action fails."""
    for _ in range(length):
        actions = candidates(program)
        if not actions:
            break
        action = rng.choice(actions)
        path.append(action.text)
        program = apply_action(program, action)
    return program
