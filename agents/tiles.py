"""Register-tile chains: a prior over the shape of a fast GEMM-like kernel, written as actions of the menu.

A contraction `X[..,i,j] += A[..,i,k] * B[..,k,j]` runs near the core's peak as the textbook micro-kernel:
an output tile of `rows x cols` kept in registers (a local accumulator) while the reduction loops run
outside it, `cols` made of vectors of `lanes` elements along the contiguous axis j, every operand read of
the tile unrolled. `benchmarks/menu_ceiling.py` shows the menu reaches it in seven actions, but a search paid
step by step walks away from it: the chain's middle steps (a tiling, a reorder that puts the reduction
outside the tile) are slower than the start. So the focus agent tries these chains whole, as a human
expert or MetaSchedule's multi-level tiling sketch would, before its own search of the nest.

A convolution has no such columns: its input is read at `f + i` along the contiguous axis. Its tile takes
the output channels as the vector lanes instead (the weights packed with the channels last, each input
element broadcast), and rows from the output pixels: the direct-convolution kernel of oneDNN-like
libraries, in the layouts the menu can make.

`register_tile_chains` builds them by applying each action and reading the loop names the strategies
invented (a split keeps the inner loop's name), so every chain it returns applies to the program as given;
it builds nothing for a nest that is not a single contraction with a vector axis.
"""
from __future__ import annotations

from itertools import product
from math import prod

from steptp_env.errors import StepTPError
from steptp_env.ir.analysis import reduction
from steptp_env.ir.ast import BinOp, Var, accesses, all_loops, equations, free_vars
from steptp_env.ir.program import Program
from steptp_env.strategies import apply_action, get_strategy

TILES = ((4, 64), (8, 32), (4, 32), (2, 64), (8, 16), (4, 16))
"""(rows, cols) of the output tile, in order of preference; the first `CHAINS` that fit are tried. Rows x
cols / lanes accumulator vectors must fit the register file with room for the operands: 16 of 32 zmm
registers at 4 x 64 with 16 lanes."""
CHAINS = 2
"""How many tile shapes a nest gets: the best tile depends on the extents and the cache, so two, not one."""
COLUMNS = 64
"""The widest tile of a channel tile's columns (4 vectors of 16)."""
ACCUMULATORS = 16
"""Accumulator vectors a tile may keep in registers: half of AVX-512's 32, the rest for the operands."""
LANES = (16, 8)
"""Vector lanes of float32: an AVX-512 register, then an AVX2 one (the first that divides the columns)."""


def _contraction(program: Program, n: int):
    """(loops, equation, output rows var, output cols var) of nest n when it is one `+=` reduction of a
    product whose last two output subscripts are plain loop variables (the tile's rows and columns)."""
    found = list(equations(program.nests[n]))
    if len(found) != 1:
        return None
    loops, eq = found[0]
    red = reduction(loops, eq)
    if red is None or red.op != "+" or not (isinstance(red.operand, BinOp) and red.operand.op == "*") \
            or len(loops) != len(program.nests[n].loops):
        return None
    indices = eq.lhs.indices
    if len(indices) < 2 or not all(isinstance(i, Var) for i in indices[-2:]):
        return None
    return loops, eq, indices[-2].name, indices[-1].name


def _needs_transpose(eq, cols: str) -> list[tuple[str, tuple[int, ...]]]:
    """(tensor, layout) copies that make every read indexed by the column variable contiguous along it
    (the column variable alone in the last dimension); a read that cannot be fixed so returns None."""
    copies = []
    for access in accesses(eq.rhs):
        if access == eq.lhs:
            continue
        dims = [d for d, index in enumerate(access.indices) if cols in free_vars(index)]
        if not dims:
            continue
        last = len(access.indices) - 1
        if dims == [last] and access.indices[last] == Var(cols):
            continue
        if len(dims) != 1 or access.indices[dims[0]] != Var(cols):
            return None
        copies.append((access.name, tuple(d for d in range(last + 1) if d != dims[0]) + (dims[0],)))
    return copies


def _new_loops(before: Program, after: Program, n: int) -> list[str]:
    """The loop variables of nest n (inner nests included) that the last action made."""
    old = {loop.var for loop in all_loops(before.nests[n])}
    return [loop.var for loop in all_loops(after.nests[n]) if loop.var not in old]


def _outer_of(program: Program, n: int, inner: str, new: list[str]) -> str:
    """The new loop that the tiling of `inner` made (the one that shares its output subscript)."""
    (_, eq), = equations(program.nests[n])
    for index in eq.lhs.indices:
        names = free_vars(index)
        if inner in names:
            return next(v for v in new if v in names)
    raise StepTPError(f"no split of {inner}")


def _chain(program: Program, n: int, rows: tuple[tuple[str, int], ...], j: str, cols: int) -> list[str]:
    """The actions of one register tile on nest n (raises StepTPError where an action does not apply): the
    output variables of `rows` split by their factors into the tile's rows, `cols` elements of output
    variable j as its vector columns."""
    loops, eq, _, _ = _contraction(program, n)
    texts: list[str] = []

    def play(text: str) -> Program:
        nonlocal program
        before, program = program, apply_action(program, text)
        texts.append(text)
        return before

    reduced = set(reduction(loops, eq).reduced_vars)
    splits = [(v, f) for v, f in rows + ((j, cols),) if f < program.nests[n].loop(v).extent]
    names = program.nests[n].loop_vars
    if len(splits) == 2 and abs(names.index(splits[0][0]) - names.index(splits[1][0])) == 1:
        (first, f1), (second, f2) = splits
        before = play(f"loop_tiling(nest={n}, loops=[{first},{second}], factors=[{f1},{f2}])")
        new = _new_loops(before, program, n)
        tiles = [_outer_of(program, n, first, new), _outer_of(program, n, second, new)]
    else:  # one variable split (the tile spans the other's whole extent), or two that are not adjacent
        tiles = []
        for var, factor in splits:
            before = play(f"loop_split(nest={n}, loop={var}, factor={factor})")
            tiles += _new_loops(before, program, n)
    inner = [v for v, _ in rows] + [j]
    names = program.nests[n].loop_vars
    outer = [v for v in names if v not in reduced and v not in (*inner, *tiles)]
    order = outer + tiles + [v for v in names if v in reduced] + inner
    for step in _reorders(program, n, order):
        play(f"loop_reorder(nest={n}, order=[{','.join(step)}])")
    for tensor, layout in _needs_transpose(eq, j):  # on the menu once j is the innermost loop (loop order)
        play(f"layout_transformation(nest={n}, tensor={tensor}, layout=[{','.join(map(str, layout))}])")
        n += 1
    before = play(f"cache_read_write(nest={n}, tensor={eq.lhs.name}, mode=write, scope=l, at={tiles[-1]})")
    columns = [index.name for index in eq.lhs.indices].index(j)
    if columns != len(eq.lhs.indices) - 1:  # the accumulator's lanes must be its last dimension
        local, = (name for name in program.tensors if name not in before.tensors)
        layout = [d for d in range(len(eq.lhs.indices)) if d != columns] + [columns]
        play(f"set_storage_layout(tensor={local}, layout=[{','.join(map(str, layout))}])")
    lanes = next(l for l in LANES if cols % l == 0)
    vectors = None
    if cols > lanes:
        before = play(f"loop_split(nest={n}, loop={j}, factor={lanes})")
        vectors, = _new_loops(before, program, n)
    play(f"loop_vectorization(nest={n}, loop={j})")
    if vectors is not None:
        play(f"loop_unrolling(nest={n}, loop={vectors})")
    for var, _ in rows:
        play(f"loop_unrolling(nest={n}, loop={var})")
    return texts


def _reorders(program: Program, n: int, order: list[str]) -> list[list[str]]:
    """Menu reorders of nest n's loops that end in `order`: the order itself where the menu offers it (one
    loop moved), else each loop after the longest prefix of `order` the nest already keeps in sequence
    moved innermost in turn (the menu offers every such move first)."""
    names = list(program.nests[n].loop_vars)
    if names == order:
        return []
    offered = {action.text for action in get_strategy("loop_reorder").nest_candidates(program, n, "llvm")}
    if f"loop_reorder(nest={n}, order=[{','.join(order)}])" in offered:
        return [order]
    kept, position = 0, 0
    for var in order:
        while position < len(names) and names[position] != var:
            position += 1
        if position == len(names):
            break
        kept, position = kept + 1, position + 1
    steps = []
    for var in order[kept:]:
        names = [v for v in names if v != var] + [var]
        steps.append(names)
    return steps


def is_contraction(program: Program, n: int) -> bool:
    """Nest n is one `+=` reduction of a product with two plain output subscripts (a GEMM-like nest)."""
    return _contraction(program, n) is not None


def _row_tiles(found) -> list[tuple[tuple[tuple[str, int], ...], str, int]]:
    """GEMM tiles: rows of the second-last output variable, columns of the last (`TILES`)."""
    loops, eq, i, j = found
    if _needs_transpose(eq, j) is None:
        return []
    extent = {loop.var: loop.extent for loop in loops}
    return [(((i, rows),), j, cols) for rows, cols in TILES
            if not (extent[i] % rows or extent[j] % cols or rows >= extent[i] or cols > extent[j]
                    or not any(cols % lanes == 0 for lanes in LANES))]


def _channel_tiles(found) -> list[tuple[tuple[tuple[str, int], ...], str, int]]:
    """Convolution tiles: the widest output variable other than the last (the output channels) as the
    vector columns, its reads packed with it last (the weights as [in, kh, kw, out]), rows from the other
    output variables (pixels, and the batch where the pixels' extents have no larger divisors, as 62 = 2 x 31
    has: a 2x2 pixel tile is 4 accumulator chains, half of what two FMA units of 4 cycles' latency need): as
    many as `ACCUMULATORS` allows, then at most half as many; among tiles of as many rows, the one with the
    most along the innermost variables. A variable may enter the tile whole, but one at least is split (the
    accumulator's position). A convolution's last output variable cannot be the columns: its input reads
    `f + i` or `2f + i`."""
    loops, eq, _, _ = found
    if not all(isinstance(index, Var) for index in eq.lhs.indices):
        return []
    outputs = [index.name for index in eq.lhs.indices]
    extent = {loop.var: loop.extent for loop in loops}
    for j in sorted(outputs[:-1], key=lambda v: -extent[v]):
        lanes = next((l for l in LANES if extent[j] % l == 0), None)
        if lanes is None or _needs_transpose(eq, j) is None:
            continue
        cols = max(c for c in range(lanes, min(extent[j], COLUMNS) + 1, lanes) if extent[j] % c == 0)
        room = ACCUMULATORS // (cols // lanes)
        pixels = [v for v in outputs if v != j]
        choices = [factors for factors in product((1, 2, 4, 8), repeat=len(pixels))
                   if all(f == 1 or extent[v] % f == 0 for v, f in zip(pixels, factors)) and 1 < prod(factors)
                   and any(1 < f < extent[v] for v, f in zip(pixels, factors))]
        tiles = []
        for limit in (room, room // 2):  # the most rows, then the most along the innermost pixel variable
            fitting = [fs for fs in choices if prod(fs) <= limit]
            rows = tuple((v, f) for v, f in zip(pixels, max(fitting, key=lambda fs: (prod(fs), fs[::-1])))
                         if f > 1) if fitting else None
            if rows is not None and (rows, j, cols) not in tiles:
                tiles.append((rows, j, cols))
        return tiles
    return []


def register_tile_chains(program: Program, n: int) -> list[list[str]]:
    """Up to `CHAINS` register-tile chains for nest n (see the module docstring), each a list of action
    texts that applies to `program` in order: GEMM tiles, or where there are none (a convolution) channel
    tiles; none when nest n is not a contraction with a vector axis."""
    found = _contraction(program, n)
    if found is None:
        return []
    chains = []
    for rows, j, cols in _row_tiles(found) or _channel_tiles(found):
        try:
            chains.append(_chain(program, n, rows, j, cols))
        except StepTPError:
            continue
        if len(chains) == CHAINS:
            break
    return chains
