"""Helpers shared by the strategies: looking up sites, fresh names, parameter menus."""
from __future__ import annotations

import functools

from ..errors import IllegalActionError
from ..frontend.emit import _VAR_LETTERS, _tensor_names
from ..ir.analysis import writes
from ..ir.ast import Loop, Nest, all_loops, equations
from ..ir.program import Program
from .base import Action

MAX_FACTORS = 8
VECTOR_WIDTHS = (4, 8, 16)


def nest_at(program: Program, index) -> Nest:
    if not isinstance(index, int) or not 0 <= index < len(program.nests):
        raise IllegalActionError(f"no nest {index}: the program has {len(program.nests)} nests")
    return program.nests[index]


def loop_in(nest: Nest, var) -> Loop:
    for loop in all_loops(nest):
        if loop.var == var:
            return loop
    raise IllegalActionError(f"no loop {var!r} in this nest (loops: {', '.join(l.var for l in all_loops(nest))})")


def used_tensor_names(program: Program) -> set[str]:
    names = {t.name for t in program.signature.tensors}
    for nest in program.nests:
        for _, eq in equations(nest):
            names.add(eq.lhs.name)
    return names


def fresh_tensor(program: Program, taken: set[str] | None = None) -> str:
    """The first tensor name in Step-TP order (A C D ... Z Aa Ac ...) the program does not use."""
    used = used_tensor_names(program) | (taken or set())
    return next(n for n in _tensor_names() if n not in used)


def fresh_loop_var(nest: Nest, taken: set[str] | None = None) -> str:
    """The first loop variable name (a c d f ...) the nest does not use."""
    used = {l.var for l in all_loops(nest)} | (taken or set())
    for name in _VAR_LETTERS:
        if name not in used:
            return name
    i = 0
    while f"a{i}" in used:
        i += 1
    return f"a{i}"


def factor_menu(extent: int, limit: int = MAX_FACTORS, largest: int | None = None) -> list[int]:
    """Proper divisors of `extent` (excluding 1 and extent, and above `largest` when given), at most `limit`,
    favouring powers of two, then vector-width multiples, then those nearest 16, in ascending order: the
    split/tile factors a strategy offers."""
    return list(_factor_menu(extent, limit, largest))


TILE_FACTORS = (4, 8, 16, 32, 64)
MAX_TILE_POINTS = 1024
"""`tile_menu` offers tiles of at most this many points (4 KiB of float32 per tensor a tile touches)."""


def tile_menu(x_extent: int, y_extent: int) -> list[tuple[int, int]]:
    """Tile factor pairs for two loops: every pair of TILE_FACTORS that divide the two extents (and are
    smaller), chosen independently, whose product is at most MAX_TILE_POINTS; a loop that no factor of
    TILE_FACTORS divides takes its two best `factor_menu` divisors instead. Ascending by x, then y."""
    def factors(extent: int) -> list[int]:
        return [f for f in TILE_FACTORS if f < extent and extent % f == 0] or factor_menu(extent, 2)

    return [(a, b) for a in factors(x_extent) for b in factors(y_extent) if a * b <= MAX_TILE_POINTS]


@functools.lru_cache(maxsize=4096)


def int_param(action: Action, key: str) -> int:
    """The integer parameter `key` of an action, or IllegalActionError naming it."""
    value = action[key]
    if not isinstance(value, int):
        raise IllegalActionError(f"{key} must be an integer, got {value!r}")
    return value


def flag_param(action: Action, key: str) -> int:
    """The 0/1 parameter `key` of an action, or IllegalActionError naming it."""
    value = action[key]
    if value not in (0, 1):
        raise IllegalActionError(f"{key} must be 0 or 1, got {value!r}")
    return value


def quiet(check, *args):
    """`check(*args)`, or None where it raises IllegalActionError (for candidate enumeration)."""
    try:
        return check(*args)
    except IllegalActionError:
        return None


def holds(check, *args) -> bool:
    """True when `check(*args)` raises no IllegalActionError."""
    try:
        check(*args)
    except IllegalActionError:
        return False
    return True


def is_intermediate(program: Program, name: str) -> bool:
    """`name` is none of the program's inputs and outputs."""
    return name not in program.signature


def writer_nests(program: Program, name: str) -> list[int]:
    """The indices of the nests that write `name`."""
    return [j for j, n in enumerate(program.nests) if name in writes(n)]


def _factor_menu(extent: int, limit: int, largest: int | None) -> tuple[int, ...]:
    divisors = [d for d in range(2, extent if largest is None else min(extent, largest + 1)) if extent % d == 0]
    ranked = sorted(divisors, key=lambda d: (d & (d - 1) != 0, d % 4 != 0, abs(d - 16), d))
    return tuple(sorted(ranked[:limit]))
