"""LEIR -> TVM TIR (s_tir blocks), built directly with TVM's IR builder.

One PrimFunc `main` per program: signature tensors are its parameters in signature order, intermediates
are buffers allocated at the root. Every equation becomes one `sblock` under the loops that enclose it;
a block iter var is spatial when the target's subscript mentions it and reduce otherwise. The
semantics implemented here are those of docs/leir.md: reductions start from their identity, stored by
a block of its own placed before the outermost reduced loop (whatever the subscript looks like; never
`T.init()`, which leaves a test of the reduction variables inside the loop), fresh accumulations read
the identity instead of the stored value, and lagging reads of a scan's own target are guarded so that
the first element reads the identity. Building objects directly costs about a millisecond, against tens of milliseconds for
printing and re-parsing TVMScript (numbers in docs/lowering.md).
"""
from __future__ import annotations

import math
import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Union

import tvm
from tvm import tirx
from tvm.ir.expr import Expr as PrimExpr
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..errors import LoweringError
from ..ir.analysis import accumulation, index_range, iteration_span, reduction, reduction_identity, scan_operator
from ..ir.ast import (Access, And, BinOp, Call, Compare, Const, Equation, Expr, Loop, Neg, Nest, Var, accesses,
                      children, equations, free_vars, map_children, walk)
from ..ir.dtypes import float_rank, is_float
from ..ir.program import Program
from . import vector_math

GPU_AXES = {"tx": "threadIdx.x", "ty": "threadIdx.y", "tz": "threadIdx.z",
            "bx": "blockIdx.x", "by": "blockIdx.y", "bz": "blockIdx.z"}
"""Prefix of a `B` loop's variable name -> the CUDA axis it binds (`tx`, `bxc`, `tya`, ...)."""

LOWERING_VERSION = "6"
"""Changes whenever the code a program lowers to changes, and is stored with every measurement (1: `T.init()`
reductions and libm math; 2: reductions initialised before their loops, float32 exp/log/erf from
`vector_math`; 3: a local intermediate whose accesses all lie under one loop is allocated inside that loop,
one iteration's tile, see `placement`; 4: `vector_math` only in statements that vectorise, libm in scalar
reductions, see `_vectorises`; 5: the same TIR, but TVM compiles a `V` loop over `vector_math`'s forms to
vector code instead of leaving the loop to LLVM, see `vector_math.ELEMENTWISE_BUILTINS`; 6: shorter
dependency chains in those forms, Estrin's scheme and erf's saturation, see `vector_math._estrin`). Store
keys hash the lowered module and the measurement context, which holds this version (`measure.context`), so
no runtime is ever reused across versions."""

LOCAL_SCOPE_LIMIT_BYTES = 64 * 1024
"""On CPU a `local` intermediate lives on the stack when it is at most this large (for one allocated inside
a loop, its tile: `placement`); larger ones stay global so deep copies cannot overflow it. The choice never
changes results."""


@dataclass(frozen=True)
class _Lit:
    """A literal (or a literal-only subexpression folded in Python) that has not been given a type yet."""

    value: Union[int, float]


_Value = Union[_Lit, PrimExpr]


def target_kind(target: str | tvm.target.Target) -> str:
    kind = target if isinstance(target, str) else target.kind.name
    kind = kind.split()[0]
    if kind not in ("llvm", "cuda"):
        raise LoweringError(f"unsupported target {kind!r}: steptp_env lowers to 'llvm' (CPU) and 'cuda'")
    return kind


def lower(program: Program, target: str | tvm.target.Target = "llvm", tvm_form: bool = False) -> tvm.IRModule:
    """Lower a program to an IRModule holding one PrimFunc `main`; deterministic for a given program.
    `tvm_form=True` gives the form TVM's own tools expect: each reduction's initialisation in its block as
    `T.init()` (MetaSchedule's rules decompose reductions themselves) and TVM's math intrinsics instead of
    `vector_math` (its analyses, e.g. the flop estimator, reject `Let`). What steptp_env builds and measures
    is always the default form."""
    builder = _FunctionBuilder(program, target_kind(target), tvm_form)
    return tvm.IRModule({"main": _rejections_as_lowering_errors(builder.build)})


def lower_by_nest(program: Program) -> list[tuple[tirx.PrimFunc, tuple[str, ...]]]:
    """The CPU lowering of `program` cut at its nests: one PrimFunc `nest` per nest, in program order, with
    the names of the tensors it takes (signature tensors and intermediates other nests touch too; an
    intermediate of this nest alone is allocated inside it, placed as `lower` places it). Run in order on
    shared arrays, the functions compute what `lower`'s `main` computes: each holds the very blocks `main`
    holds for its nest. Functions of equal structure are the same code whatever their tensors are called,
    so a program that differs from another in a few nests can reuse the compiled rest
    (`measure.nest_build.build_by_nest`)."""
    return _rejections_as_lowering_errors(_FunctionBuilder(program, "llvm").build_parts)


def _rejections_as_lowering_errors(build):
    """`build()`, with whatever TVM's IR builder raises (several error types) turned into a `LoweringError`."""
    try:
        return build()
    except LoweringError:
        raise
    except Exception as exc:
        raise LoweringError(f"TVM rejected the lowered program: {exc}") from exc


def placement(program: Program, name: str) -> tuple[tuple | None, int]:
    """Where intermediate `name` can live and how many bytes it needs there: a loop (a `_keyed_equations`
    key) inside which every iteration can have a fresh tile, and the bytes one iteration touches; (None, the
    whole tensor's bytes) where there is no such loop.

    The loop is the deepest one around every access, outside the outermost reduced loop of every reduction
    into `name` (its initialisation is emitted there). A fresh tile per iteration gives the results of the
    whole tensor when each iteration reads only what it wrote itself: every access touches the same
    elements in an iteration (the same subscript up to the names of the loops inside: `_inner_form`), and
    the first access in an iteration writes (a reduction's initialisation counts). That is the tile of
    `cache_read_write(..., at=X)`; a scan's lagging read, or a read before the write, keeps the tensor
    whole. The builder allocates such a tile inside its loop and TVM's `CompactBufferAllocation` shrinks it
    to the span computed here (outer loops held at 0; affine subscripts give the same span at every value)."""
    info = program.tensors[name]
    width = tvm.DataType(info.dtype).bits // 8
    whole = math.prod(info.shape) * width
    sites, first_is_write = [], None
    for n, nest in enumerate(program.nests):
        for keys, loops, eq in _keyed_equations(nest, (n,)):
            red = reduction(loops, eq) if eq.lhs.name == name else None
            if red is not None:
                keys = keys[:min(k for k, l in enumerate(loops) if l.var in red.reduced_vars)]
            read = [*accesses(eq.rhs), *(a for index in eq.lhs.indices for a in accesses(index))]  # index tensors too
            reads = [acc for acc in read if acc.name == name and not (red and acc == eq.lhs)]
            if first_is_write is None and (reads or eq.lhs.name == name):
                first_is_write = not reads
            sites.extend((keys, loops, acc) for acc in (eq.lhs, *reads) if acc.name == name)
    common = os.path.commonprefix([keys for keys, _, _ in sites]) if sites else ()
    if not common or not first_is_write or len({_inner_form(acc, loops, len(common)) for _, loops, acc in sites}) > 1:
        return None, whole
    spans: dict[int, tuple[int, int]] = {}
    for _, loops, acc in sites:
        found = iteration_span(acc.indices, loops, len(common))
        if found is None:
            return None, whole
        for d, (low, high) in enumerate(found):
            lo, hi = spans.get(d, (low, high))
            spans[d] = (min(lo, low), max(hi, high))
    return common[-1], min(whole, math.prod(hi - lo + 1 for lo, hi in spans.values()) * width)


def _inner_form(acc: Access, loops: tuple[Loop, ...], outer: int) -> tuple:
    """An access's subscript with the variables of the loops inside the first `outer` renamed by order of
    appearance, with their extents: two accesses with the same form touch the same elements in every
    iteration of the outer loops."""
    inner = {l.var: l.extent for l in loops[outer:]}
    names: dict[str, Var] = {}
    for index in acc.indices:
        for var in free_vars(index):
            if var in inner and var not in names:
                names[var] = Var(f"_{len(names)}")
    renamed = tuple(_rename(index, names) for index in acc.indices)
    return renamed, tuple(inner[var] for var in names)


def _rename(expr: Expr, names: dict[str, Var]) -> Expr:
    if isinstance(expr, Var):
        return names.get(expr.name, expr)
    return map_children(expr, lambda child: _rename(child, names))


def placed_bytes(program: Program, name: str) -> int:
    """The bytes of intermediate `name` that a build allocates (see `placement`)."""
    return placement(program, name)[1]


def _keyed_equations(nest: Nest, node: tuple, keys: tuple = (), loops: tuple[Loop, ...] = ()):
    """(loop keys, loops, equation) of every equation of a nest: a loop's key names its place in the nest
    tree, so two sibling inner nests' loops of the same name and extent still differ."""
    keys = keys + tuple((node, k) for k in range(len(nest.loops)))
    loops = loops + nest.loops
    for b, stmt in enumerate(nest.body):
        if isinstance(stmt, Nest):
            yield from _keyed_equations(stmt, (node, b), keys, loops)
        else:
            yield keys, loops, stmt


class _FunctionBuilder:
    def __init__(self, program: Program, kind: str, tvm_form: bool = False) -> None:
        self.program = program
        self.kind = kind
        self.tvm_form = tvm_form
        self.buffers: dict[str, tirx.Buffer] = {}
        self.iter_vars: dict[str, tirx.Var] = {}
        self.written: set[str] = set()
        self.tiles: dict[tuple, list] = {}

    # -- function and buffers ------------------------------------------------------------------------
    def build(self) -> tirx.PrimFunc:
        return self._function("main", [spec.name for spec in self.program.signature.tensors],
                              self.program.intermediates, range(len(self.program.nests)))

    def build_parts(self) -> list[tuple[tirx.PrimFunc, tuple[str, ...]]]:
        """`lower_by_nest`: one function per nest, built in order so that what one nest has written (fresh
        accumulations, `_equation`) is known to the next, as in `build`."""
        program = self.program
        touched = [{acc.name for _, eq in equations(nest)
                    for acc in (eq.lhs, *accesses(eq.rhs), *(a for i in eq.lhs.indices for a in accesses(i)))}
                   for nest in program.nests]
        nests_touching = Counter(name for names in touched for name in names)
        parts = []
        for n, names in enumerate(touched):
            params = tuple(name for name in program.tensors
                           if name in names and (name in program.signature or nests_touching[name] > 1))
            local = {name: info for name, info in program.intermediates.items()
                     if name in names and name not in params}
            parts.append((self._function("nest", params, local, [n]), params))
        return parts

    def _function(self, symbol: str, params, intermediates, nests) -> tirx.PrimFunc:
        """A function `symbol` taking `params` (tensor names), allocating `intermediates`, running `nests`."""
        self.buffers = {}
        with IRBuilder() as ib:
            with T.prim_func(s_tir=True):
                T.func_name(symbol)
                T.func_attr({"tirx.noalias": True})
                for param in params:
                    info = self.program.tensors[param]
                    self.buffers[param] = T.arg(param, T.buffer(info.shape, info.dtype))
                for name, info in intermediates.items():
                    key, size = placement(self.program, name) if self.kind == "llvm" and info.scope == "l" \
                        else (None, 0)
                    if key is not None and size <= LOCAL_SCOPE_LIMIT_BYTES:
                        self.tiles.setdefault(key, []).append((name, info))  # allocated inside its loop
                        continue
                    buf = T.alloc_buffer(info.shape, info.dtype, scope=self._scope(info))
                    IRBuilder.name(name, buf)
                    self.buffers[name] = buf
                for n in nests:
                    self._nest(n, self.program.nests[n], (), [0], (n,))
        return ib.get()

    def _scope(self, info) -> str:
        if self.kind == "cuda":
            return {"g": "global", "s": "shared", "l": "local"}[info.scope]
        if info.scope == "l":
            size = math.prod(info.shape) * tvm.DataType(info.dtype).bits // 8
            if size <= LOCAL_SCOPE_LIMIT_BYTES:
                return "local"
        return "global"

    @contextmanager
    def _tiles(self, n: int, key: tuple) -> Iterator[None]:
        """Inside the loop `key` names, an opaque block allocating the local intermediates placed there
        (`placement`): TVM keeps a root allocation whole, but shrinks one made in a block to what an
        iteration of the enclosing loops touches."""
        placed = self.tiles.get(key)
        if not placed:
            yield
            return
        with T.sblock(f"{'_'.join(name for name, _ in placed)}_n{n}_tile"):
            T.reads()  # inferred regions would name the tiles themselves, which are declared only inside
            T.writes()
            for name, info in placed:
                buf = T.alloc_buffer(info.shape, info.dtype, scope="local")
                IRBuilder.name(name, buf)
                self.buffers[name] = buf
            yield

    # -- loops ---------------------------------------------------------------------------------------
    def _nest(self, n: int, nest: Nest, outer: tuple[Loop, ...], counter: list[int], node: tuple) -> None:
        """Emit a nest; `node` names its place in the program's nest tree (`_keyed_equations`)."""
        if self.kind == "cuda" and not outer and not any(l.kind == "B" for l in nest.loops):
            # A nest that binds no GPU axis still has to run on the device: give it a 1x1 launch.
            with T.thread_binding(0, 1, thread="blockIdx.x"):
                self._loops(n, nest, outer, 0, counter, node)
        else:
            self._loops(n, nest, outer, 0, counter, node)

    def _loops(self, n: int, nest: Nest, outer: tuple[Loop, ...], depth: int, counter: list[int],
               node: tuple) -> None:
        loops = outer + nest.loops[:depth]
        if depth == len(nest.loops):
            for b, stmt in enumerate(nest.body):
                if isinstance(stmt, Nest):
                    self._nest(n, stmt, loops, counter, (node, b))
                else:
                    self._equation(n, counter, loops, stmt)
            return
        if not self.tvm_form:
            self._initialisations(n, nest, outer, depth)
        innermost = depth == len(nest.loops) - 1 and not any(isinstance(s, Nest) for s in nest.body)
        wrapped = [acc for eq in nest.body for acc in (eq.lhs, *accesses(eq.rhs))] if innermost else []
        with self._loop(nest.loops[depth], loops, wrapped), self._tiles(n, (node, depth)):
            self._loops(n, nest, outer, depth + 1, counter, node)

    @contextmanager
    def _loop(self, loop: Loop, enclosing: tuple[Loop, ...], wrapped: list[Access]) -> Iterator[None]:
        """Open `loop` and bind its variable. Where `wrapped` (the accesses of a flat nest's innermost loop)
        wraps it as `(..v..) % m`, with m dividing v's extent but smaller (one such m), the loop is emitted
        as v_outer x m so that the subscript simplifies to the inner variable; the iterations run in the
        same order. LLVM 22's loop vectorizer (inside TVM 0.27) turns `X[v % 32] = ...` over 64 iterations
        into contiguous stores of 64 elements, writing past the buffer (tests/test_lower.py)."""
        split = _wrap_modulus(loop, wrapped) if self.kind == "llvm" and loop.kind == "L" else None
        if split:
            with self._for(Loop(loop.kind, loop.extent // split, loop.var), enclosing) as var:
                IRBuilder.name(loop.var, var)
                with T.serial(0, split) as inner:
                    IRBuilder.name(f"{loop.var}_in", inner)
                    self.iter_vars[loop.var] = var * split + inner
                    yield
        else:
            with self._for(loop, enclosing) as var:
                IRBuilder.name(loop.var, var)
                self.iter_vars[loop.var] = var
                yield
        del self.iter_vars[loop.var]

    def _initialisations(self, n: int, nest: Nest, outer: tuple[Loop, ...], depth: int) -> None:
        """Emit, just before loop `nest.loops[depth]`, the initialisation of every reduction below it whose
        outermost reduced loop it is: a block of its own that stores the identity into the elements the
        reduction writes, under copies of the loops between here and the reduction that its subscript uses.
        The reduction's block then holds only the update, so LLVM sees no `if (k == 0)` inside the reduction
        loop and can keep the accumulator in registers (what TIR's `decompose_reduction` does;
        docs/lowering.md). Every loop outside this one is a variable of the subscript (this is the outermost
        reduced loop), so each element starts from the identity where `T.init()` would have started it."""
        enclosing = outer + nest.loops[:depth]
        here = nest.loops[depth].var
        for loops, eq in equations(nest, outer):
            red = reduction(loops, eq)
            if red is None or red.reduced_vars[0] != here:
                continue
            subscript_vars = {v for index in eq.lhs.indices for v in free_vars(index)}
            copies = tuple(l for l in loops[len(enclosing):] if l.var in subscript_vars)
            self._initialisation(n, eq, enclosing, copies, red.op)

    def _initialisation(self, n: int, eq: Equation, enclosing: tuple[Loop, ...], copies: tuple[Loop, ...],
                        op: str) -> None:
        if copies:
            with self._loop(copies[0], enclosing, [eq.lhs] if len(copies) == 1 else []):
                self._initialisation(n, eq, enclosing + copies[:1], copies[1:], op)
            return
        target = self.buffers[eq.lhs.name]
        with T.sblock(f"{eq.lhs.name}_n{n}_init"):
            saved = dict(self.iter_vars)
            for loop in enclosing:
                v = T.axis.spatial(loop.extent, self.iter_vars[loop.var])
                IRBuilder.name(f"v_{loop.var}", v)
                self.iter_vars[loop.var] = v
            lowering = _ExprLowering(self, eq, enclosing, None, False)
            identity = lowering.typed(_Lit(reduction_identity(op, target.dtype)), target.dtype)
            T.buffer_store(target, identity, [lowering.index(i) for i in eq.lhs.indices])
            self.iter_vars = saved

    def _for(self, loop: Loop, enclosing: tuple[Loop, ...]):
        kind = loop.kind
        if self.kind == "llvm":
            if kind == "P" and any(l.kind == "P" for l in enclosing):
                return T.serial(0, loop.extent)  # TVM's CPU runtime has no nested parallelism
            return {"L": T.serial, "B": T.serial, "P": T.parallel, "V": T.vectorized,
                    "U": T.unroll}[kind](0, loop.extent)
        if kind == "B":
            axis = GPU_AXES.get(loop.var[:2])
            if axis is None:
                raise LoweringError(f"bound loop variable {loop.var!r} names no GPU axis (tx ty tz bx by bz)")
            taken = [GPU_AXES.get(l.var[:2]) for l in enclosing if l.kind == "B"]
            if axis in taken:
                raise LoweringError(f"GPU axis {axis} is bound twice around loop {loop.var!r}")
            return T.thread_binding(0, loop.extent, thread=axis)
        if kind == "V" and loop.extent in (2, 4):
            return T.vectorized(0, loop.extent)
        if kind in ("V", "U"):
            return T.unroll(0, loop.extent)
        return T.serial(0, loop.extent)

    # -- equations -----------------------------------------------------------------------------------
    def _equation(self, n: int, counter: list[int], loops: tuple[Loop, ...], eq: Equation) -> None:
        name = f"{eq.lhs.name}_n{n}_e{counter[0]}"
        counter[0] += 1
        target = self.buffers[eq.lhs.name]
        written = set()
        for index in eq.lhs.indices:
            written.update(free_vars(index))
        red = reduction(loops, eq)
        acc = accumulation(eq)
        identity = reduction_identity(acc[0] if acc else scan_operator(eq), target.dtype)
        fresh = acc is not None and red is None and eq.lhs.name not in self.written
        with T.sblock(name):
            saved = dict(self.iter_vars)
            for loop in loops:
                axis = T.axis.spatial if loop.var in written else T.axis.reduce
                v = axis(loop.extent, self.iter_vars[loop.var])
                IRBuilder.name(f"v_{loop.var}", v)
                self.iter_vars[loop.var] = v
            lowering = _ExprLowering(self, eq, loops, identity, fresh)
            indices = [lowering.index(i) for i in eq.lhs.indices]
            if red is not None and self.tvm_form:
                with T.init():
                    T.buffer_store(target, lowering.typed(_Lit(identity), target.dtype), indices)
            value = lowering.typed(lowering.value(eq.rhs), target.dtype)
            T.buffer_store(target, value, indices)
            self.iter_vars = saved
        self.written.add(eq.lhs.name)


def _wrap_modulus(loop: Loop, wrapped: list[Access]) -> int | None:
    """m where the subscripts of `wrapped` wrap `loop`'s variable as `(..v..) % m` (one such m), with m
    dividing the loop's extent but smaller; else None."""
    moduli = {node.rhs.value for acc in wrapped for index in acc.indices for node in walk(index)
              if isinstance(node, BinOp) and node.op == "%" and isinstance(node.rhs, Const) and node.rhs.is_int
              and loop.var in free_vars(node.lhs)}
    if len(moduli) != 1:
        return None
    m = moduli.pop()
    return m if 1 < m < loop.extent and loop.extent % m == 0 else None


def _dt(expr: PrimExpr) -> str:
    return str(expr.ty.dtype)


def _cast(expr: PrimExpr, dtype: str) -> PrimExpr:
    return expr if _dt(expr) == dtype else tirx.Cast(dtype, expr)


def _imm(value: Union[int, float, bool], dtype: str) -> PrimExpr:
    if dtype == "bool":
        return tirx.IntImm("bool", int(bool(value)))
    if is_float(dtype):
        return tirx.FloatImm(dtype, float(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise LoweringError(f"{value} cannot be stored in {dtype}")
        value = int(value)
    return tirx.IntImm(dtype, value)


def _fits(value: int, dtype: str) -> bool:
    bits = tvm.DataType(dtype).bits
    if dtype.startswith("uint"):
        return 0 <= value < 2 ** bits
    return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


def _common(a: str, b: str) -> str:
    """The dtype both operands of a binary operation are converted to (NumPy-like promotion)."""
    if is_float(a) or is_float(b):
        return a if float_rank(a) >= float_rank(b) else b
    bits = max(tvm.DataType(a).bits if a != "bool" else 32, tvm.DataType(b).bits if b != "bool" else 32)
    return f"int{max(bits, 32)}"


class _ExprLowering:
    """Typed lowering of one equation's expressions inside its block."""

    def __init__(self, fb: _FunctionBuilder, eq: Equation, loops, self_identity, fresh: bool) -> None:
        self.fb = fb
        self.eq = eq
        self.bounds = {l.var: l.extent for l in loops}
        self.self_identity = self_identity
        self.fresh = fresh
        self.vector_math = _vectorises(loops, eq) and not fb.tvm_form
        self.enclosing_math = 0  # calls of vector_math.FUNCTIONS whose argument is being lowered
        target = fb.buffers[eq.lhs.name].dtype
        self.float_default = target if is_float(target) else "float64"

    # -- helpers -------------------------------------------------------------------------------------
    def typed(self, v: _Value, dtype: str) -> PrimExpr:
        return _imm(v.value, dtype) if isinstance(v, _Lit) else _cast(v, dtype)

    def materialize(self, v: _Value) -> PrimExpr:
        if isinstance(v, _Lit):
            if isinstance(v.value, float):
                return _imm(v.value, self.float_default)
            return _imm(v.value, "int64" if abs(v.value) >= 2 ** 31 else "int32")
        return v

    def unify(self, a: _Value, b: _Value) -> tuple[PrimExpr, PrimExpr]:
        """Give both operands one dtype: a literal adopts the other side's type, else NumPy-like promotion."""
        if isinstance(a, _Lit) and isinstance(b, _Lit):
            a, b = self.materialize(a), self.materialize(b)
        elif isinstance(a, _Lit):
            a = self._adopt(a, _dt(b))
        elif isinstance(b, _Lit):
            b = self._adopt(b, _dt(a))
        dtype = _common(_dt(a), _dt(b))
        return _cast(a, dtype), _cast(b, dtype)

    def _adopt(self, lit: _Lit, dtype: str) -> PrimExpr:
        if isinstance(lit.value, float) and not is_float(dtype):
            return _imm(lit.value, self.float_default)
        if dtype == "bool" or (not is_float(dtype) and not _fits(lit.value, dtype)):
            return self.materialize(lit)  # a literal too wide for its partner widens the operation
        return _imm(lit.value, dtype)

    def as_float(self, v: _Value) -> PrimExpr:
        e = self.materialize(v)
        return e if is_float(_dt(e)) else _cast(e, self.float_default)

    def as_bool(self, v: _Value) -> PrimExpr:
        e = self.materialize(v)
        return e if _dt(e) == "bool" else tirx.NE(e, _imm(0, _dt(e)))

    # -- indices -------------------------------------------------------------------------------------
    def index(self, expr: Expr) -> PrimExpr:
        v = self.value(expr)
        e = self.materialize(v)
        if is_float(_dt(e)) or _dt(e) == "bool":
            raise LoweringError(f"subscript {expr} of {self.eq.lhs.name} is not an integer")
        return _cast(e, "int32") if _dt(e) != "int64" else e

    # -- values --------------------------------------------------------------------------------------
    def value(self, expr: Expr) -> _Value:
        if isinstance(expr, Const):
            return _Lit(expr.value)
        if isinstance(expr, Var):
            return self.fb.iter_vars[expr.name]
        if isinstance(expr, Access):
            return self.load(expr)
        if isinstance(expr, Neg):
            inner = self.value(expr.operand)
            if isinstance(inner, _Lit):
                return _Lit(-inner.value)
            return tirx.Sub(_imm(0, _dt(inner)), inner) if _dt(inner) != "bool" else -_cast(inner, "int32")
        if isinstance(expr, BinOp):
            return self.binop(expr)
        if isinstance(expr, Compare):
            return self.compare(expr)
        if isinstance(expr, And):
            return tirx.And(self.as_bool(self.value(expr.lhs)), self.as_bool(self.value(expr.rhs)))
        if isinstance(expr, Call):
            return self.call(expr)
        raise LoweringError(f"cannot lower {expr!r}")

    def load(self, acc: Access) -> _Value:
        eq = self.eq
        buf = self.fb.buffers[acc.name]
        if acc.name == eq.lhs.name and acc == eq.lhs and self.fresh:
            return _imm(self.self_identity, buf.dtype)  # typed: an int64 extreme must not become int32
        indices = [self.index(i) for i in acc.indices]
        load = tirx.BufferLoad(buf, indices)
        if acc.name == eq.lhs.name and acc != eq.lhs:
            load = self._guard_lagging_read(acc, buf, indices, load)
        return _cast(load, acc.dtype)

    def _guard_lagging_read(self, acc: Access, buf, indices, load) -> PrimExpr:
        """A scan reads its own target at an earlier element; before the start it reads the identity."""
        conds = []
        for dim, (expr, idx) in enumerate(zip(acc.indices, indices)):
            rng = index_range(expr, self.bounds)
            extent = int(buf.shape[dim])
            if rng is None or rng[0] < 0:
                conds.append(tirx.GE(idx, _imm(0, _dt(idx))))
            if rng is None or rng[1] >= extent:
                conds.append(tirx.LT(idx, _imm(extent, _dt(idx))))
        if not conds:
            return load
        cond = conds[0]
        for c in conds[1:]:
            cond = tirx.And(cond, c)
        return tirx.if_then_else(cond, load, _imm(self.self_identity, buf.dtype))

    def binop(self, expr: BinOp) -> _Value:
        a, b = self.value(expr.lhs), self.value(expr.rhs)
        op = expr.op
        if isinstance(a, _Lit) and isinstance(b, _Lit):
            return _Lit(_fold(op, a.value, b.value))
        if op == "/":
            a, b = self.unify(a, b)
            if not is_float(_dt(a)):
                a, b = _cast(a, self.float_default), _cast(b, self.float_default)
            return tirx.Div(a, b)
        if op == "**":
            if isinstance(b, _Lit) and b.value in (2, 3, 4):  # small integer powers: exact products
                x = self.materialize(a)
                product = x
                for _ in range(int(b.value) - 1):
                    product = tirx.Mul(product, x)
                return product
            a, b = self.unify(a, b)
            if not is_float(_dt(a)):
                a, b = _cast(a, self.float_default), _cast(b, self.float_default)
            return tirx.power(a, b)
        a, b = self.unify(a, b)
        if _dt(a) == "bool":
            a, b = _cast(a, "int32"), _cast(b, "int32")
        if op == "+":
            return tirx.Add(a, b)
        if op == "-":
            return tirx.Sub(a, b)
        if op == "*":
            return tirx.Mul(a, b)
        if is_float(_dt(a)):
            quotient = tirx.floor(tirx.Div(a, b))
            return quotient if op == "//" else tirx.Sub(a, tirx.Mul(quotient, b))
        return tirx.floordiv(a, b) if op == "//" else tirx.floormod(a, b)

    def compare(self, expr: Compare) -> _Value:
        values = [self.value(o) for o in expr.operands]
        result = None
        for op, left, right in zip(expr.ops, values, values[1:]):
            if isinstance(left, _Lit) and isinstance(right, _Lit):
                cond = _imm(_fold(op, left.value, right.value), "bool")
            else:
                l, r = self.unify(left, right)
                cond = {"<": tirx.LT, "<=": tirx.LE, ">": tirx.GT, ">=": tirx.GE, "==": tirx.EQ,
                        "!=": tirx.NE}[op](l, r)
            result = cond if result is None else tirx.And(result, cond)
        return result

    def call(self, expr: Call) -> _Value:
        f = expr.func
        math = f in vector_math.FUNCTIONS
        self.enclosing_math += math
        try:
            args = [self.value(a) for a in expr.args]
        finally:
            self.enclosing_math -= math
        if f == "if_then_else":
            cond = self.as_bool(args[0])
            then, other = self.unify(args[1], args[2])
            return tirx.if_then_else(cond, then, other)
        if all(isinstance(a, _Lit) for a in args):
            return _Lit(_fold(f, *(a.value for a in args)))
        if f in ("max", "min"):
            a, b = self.unify(args[0], args[1])
            return tirx.max(a, b) if f == "max" else tirx.min(a, b)
        if f == "abs":
            return tirx.abs(self.materialize(args[0]))
        x = self.as_float(args[0])
        if math and _dt(x) == "float32" and self.vector_math:
            depth = _expanded_depth(expr.args[0])
            if depth < vector_math.MAX_NESTED:
                return vector_math.vector_call(f, x, short_chains=depth == 0 and not self.enclosing_math)
        return {"exp": tirx.exp, "log": tirx.log, "sqrt": tirx.sqrt, "erf": tirx.erf}[f](x)


def _vectorises(loops: tuple[Loop, ...], eq: Equation) -> bool:
    """Whether a statement's innermost loop runs as vector code: a `V` loop, or a loop over distinct stored
    elements, which LLVM's loop vectoriser takes. A statement whose innermost loop accumulates into one
    element (a reduction or scan along it, or no loop at all) stays scalar, since LLVM does not reassociate
    float operations; there glibc's table-driven expf and logf beat `vector_math`'s polynomial forms, which
    pay off only many lanes at a time (with the forms everywhere, lowering 3, kl_div_loss's start program
    ran 1.64x slower and attention's about 10%: benchmarks/results/lowering_effect.md)."""
    if not loops:
        return False
    inner = loops[-1]
    return inner.kind == "V" or any(inner.var in free_vars(index) for index in eq.lhs.indices)


def _expanded_depth(expr: Expr) -> int:
    """How many calls that `vector_math` expands are nested in `expr`, at most, along one chain."""
    if isinstance(expr, Call):
        inner = max((_expanded_depth(a) for a in expr.args), default=0)
        return inner + (expr.func in vector_math.FUNCTIONS)
    return max((_expanded_depth(c) for c in children(expr)), default=0)


def _fold(op: str, *values):
    """Evaluate an operator on literals exactly as Python would."""
    a = values[0]
    b = values[1] if len(values) > 1 else None
    try:
        return {
            "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
            "//": lambda: a // b, "%": lambda: a % b, "**": lambda: a ** b,
            "<": lambda: a < b, "<=": lambda: a <= b, ">": lambda: a > b, ">=": lambda: a >= b,
            "==": lambda: a == b, "!=": lambda: a != b,
            "max": lambda: max(a, b), "min": lambda: min(a, b), "abs": lambda: abs(a),
            "exp": lambda: math.exp(a), "log": lambda: math.log(a), "sqrt": lambda: math.sqrt(a),
            "erf": lambda: math.erf(a),
        }[op]()
    except (ZeroDivisionError, ValueError, OverflowError) as exc:
        raise LoweringError(f"constant expression {op}{values} cannot be evaluated: {exc}") from None
