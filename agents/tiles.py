"""Register-tile chains: a prior over the shape of a fast GEMM-like kernel, written as actions of the menu.

A contraction `X[..,i,j] += A[..,i,k] * B[..,k,j]` runs near the core's peak as the textbook micro-kernel:
an output tile of `rows x cols` kept in registers (a local accumulator) while the reduction loops run
outside it, `cols` made of vectors of `lanes` elements along the contiguous axis j, every operand read of
the tile unrolled. `benchmarks/menu_ceiling.py` shows the menu reaches it in seven actions, but a search paid
step by step walks away from it: the chain's middle steps (a tiling, a reorder that puts the reduction
outside the tile) are slower than the start. So the focus agent tries these chains whole, as a human
expert or MetaSchedule's multi-level tiling sketch would, before its own search of the nest.

`register_tile_chains` builds them by applying each action and reading the loop names the strategies
invented (a split keeps the inner loop's name), so every chain it returns applies to the program as given;
it builds nothing for a nest that is not a single contraction with a vector axis.
"""
from __future__ import annotations

from steptp_env.errors import StepTPError
from steptp_env.ir.analysis import reduction
from steptp_env.ir.ast import BinOp, Var, accesses, all_loops, equations, free_vars
from steptp_env.ir.program import Program
from steptp_env.strategies import apply_action

TILES = ((4, 64), (8, 32), (4, 32), (2, 64), (8, 16), (4, 16))
"""(rows, cols) of the output tile, in order of preference; the first `CHAINS` that fit are tried. Rows x
cols / lanes accumulator vectors must fit the register file with room for the operands: 16 of 32 zmm
registers at 4 x 64 with 16 lanes."""
CHAINS = 2
"""How many tile shapes a nest gets: the best tile depends on the extents and the cache, so two, not one."""
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


def _chain(program: Program, n: int, rows: int, cols: int) -> list[str]:
    """The actions of one register tile on nest n (raises StepTPError where an action does not apply)."""
    loops, eq, i, j = _contraction(program, n)
    texts: list[str] = []

    def play(text: str) -> Program:
        nonlocal program
        before, program = program, apply_action(program, text)
        texts.append(text)
        return before

    for tensor, layout in _needs_transpose(eq, j):
        play(f"layout_transformation(nest={n}, tensor={tensor}, layout=[{','.join(map(str, layout))}])")
        n += 1
    reduced = set(reduction(loops, eq).reduced_vars)
    if cols < program.nests[n].loop(j).extent:
        before = play(f"loop_tiling(nest={n}, loops=[{i},{j}], factors=[{rows},{cols}])")
        new = _new_loops(before, program, n)
        tiles = [_outer_of(program, n, i, new), _outer_of(program, n, j, new)]
    else:  # the tile spans the whole row: only the rows are split
        before = play(f"loop_split(nest={n}, loop={i}, factor={rows})")
        tiles = _new_loops(before, program, n)
    names = program.nests[n].loop_vars
    outer = [v for v in names if v not in reduced and v not in (i, j, *tiles)]
    order = outer + tiles + [v for v in names if v in reduced] + [i, j]
    if list(names) != order:
        play(f"loop_reorder(nest={n}, order=[{','.join(order)}])")
    play(f"cache_read_write(nest={n}, tensor={eq.lhs.name}, mode=write, scope=l, at={tiles[-1]})")
    lanes = next(l for l in LANES if cols % l == 0)
    vectors = None
    if cols > lanes:
        before = play(f"loop_split(nest={n}, loop={j}, factor={lanes})")
        vectors, = _new_loops(before, program, n)
    play(f"loop_vectorization(nest={n}, loop={j})")
    if vectors is not None:
        play(f"loop_unrolling(nest={n}, loop={vectors})")
    play(f"loop_unrolling(nest={n}, loop={i})")
    return texts


def is_contraction(program: Program, n: int) -> bool:
    """Nest n is one `+=` reduction of a product with two plain output subscripts (a GEMM-like nest)."""
    return _contraction(program, n) is not None


def register_tile_chains(program: Program, n: int) -> list[list[str]]:
    """Up to `CHAINS` register-tile chains for nest n (see the module docstring), each a list of action
    texts that applies to `program` in order; none when nest n is not a contraction with a vector axis."""
    found = _contraction(program, n)
    if found is None or _needs_transpose(found[1], found[3]) is None:
        return []
    extent = {loop.var: loop.extent for loop in found[0]}
    rows_extent, cols_extent = extent[found[2]], extent[found[3]]
    chains = []
    for rows, cols in TILES:
        if rows_extent % rows or cols_extent % cols or rows >= rows_extent or cols > cols_extent \
                or not any(cols % l == 0 for l in LANES):
            continue
        try:
            chains.append(_chain(program, n, rows, cols))
        except StepTPError:
            continue
        if len(chains) == CHAINS:
            break
    return chains
