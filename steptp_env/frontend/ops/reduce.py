"""Reductions: sum, mean, prod, max/min (with indices), argmax/argmin, any/all, norms, var/std, softmax,
log_softmax and logsumexp.

Every reduction is one nest whose target omits the folded loop vars (`D_{a}=D_{a}+A_{a,c}`), so by the
LEIR semantics it starts from the operator's identity; derived statistics add small nests after it in the
Step-TP order (mean: sum, then divide; softmax: max, sum of exp(x-max), output). `Axes` describes where
a reduction folds, and `reduce_over` is the one place that emits reduction nests; loss.py reuses both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...ir.ast import BinOp, Expr
from ..convert import UnsupportedOpError, handles
from ..emit import Builder, Value, add, call, cmp, const, div, select, sub
from .common import norm_dim, norm_dims, out_meta
from .shape import linear_index

INF = float("inf")


@dataclass(frozen=True)
class Axes:
    """Where a reduction folds: the input shape, the folded dims (sorted), and whether they stay as 1s."""

    shape: tuple[int, ...]
    dims: tuple[int, ...]
    keepdim: bool = False

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(1 if k in self.dims else d for k, d in enumerate(self.shape)
                     if self.keepdim or k not in self.dims)

    @property
    def extents(self) -> list[int]:
        return [self.shape[k] for k in self.dims]

    @property
    def count(self) -> int:
        """How many input elements fold into one output element."""
        return math.prod(self.extents)

    def source(self, out: Sequence[Expr], folded: Sequence[Expr]) -> list[Expr]:
        """The input element read for output element `out` at folded-loop position `folded`."""
        out, folded = iter(out), iter(folded)
        index = []
        for k in range(len(self.shape)):
            if k in self.dims:
                index.append(next(folded))
                if self.keepdim:
                    next(out)
            else:
                index.append(next(out))
        return index

    def result(self, index: Sequence[Expr]) -> list[Expr]:
        """The output element input element `index` folds into: how a statistic is read back."""
        return [const(0) if k in self.dims else e for k, e in enumerate(index)
                if self.keepdim or k not in self.dims]

    def position(self, index: Sequence[Expr]) -> Expr:
        """Row-major position of `index` among the folded elements (what argmax returns)."""
        return linear_index([index[k] for k in self.dims], self.extents) or const(0)


def axes_of(x: Value, dims: Any, keepdim: bool = False) -> Axes:
    """Axes for an ATen `dim` argument (an int, a list, or None/[] for all dims)."""
    folded = tuple(norm_dims(dims, x.rank)) if x.rank else ()
    return Axes(x.shape, folded, bool(keepdim))


def reduce_over(b: Builder, ax: Axes, dtype: str, op: str, term: Callable[[list[Expr]], Expr]) -> Value:
    """out = op over the folded dims of term(input index); `op` is + * max min. With nothing folded (a
    0-d input) the result is the term itself: a map, not an accumulation from the identity."""
    if not ax.dims:
        return b.map(ax.out_shape, dtype, lambda o: term(ax.source(o, [])))
    return b.reduce(ax.out_shape, ax.extents, dtype, op, lambda o, r: term(ax.source(o, r)))


def reader(b: Builder, x: Value) -> Callable[[list[Expr]], Expr]:
    """The element function of a tensor (broadcasting reads)."""
    return lambda i: b.read(x, i)


def stat(b: Builder, ax: Axes, value: Value, index: Sequence[Expr]) -> Expr:
    """Read the statistic `value` (reduced over `ax`) that belongs to input element `index`."""
    return b.access(value, ax.result(index))


def checked(node, ax: Axes, which: int = 0) -> str:
    """The node's output dtype, after making sure the reduction geometry gives PyTorch's shape."""
    shape, dtype = out_meta(node, which)
    if shape != ax.out_shape:
        raise UnsupportedOpError(str(node.target), why=f"result shape {ax.out_shape} != PyTorch's {shape}")
    return dtype


def square(e: Expr) -> Expr:
    return BinOp("**", e, const(2))


def finish(b: Builder, value: Value, fn: Callable[[Expr], Expr]) -> Value:
    """A map nest applying `fn` to every element of `value` (the divide after a sum, the sqrt after a
    sum of squares)."""
    return b.map(value.shape, value.dtype, lambda o: fn(b.access(value, o)))


# -- sum, mean, prod, max/min, any/all -------------------------------------------------------------------
def total(b: Builder, x: Value, ax: Axes, dtype: str) -> Value:
    return reduce_over(b, ax, dtype, "+", reader(b, x))


def mean_of(b: Builder, x: Value, ax: Axes, dtype: str) -> Value:
    """Sum, then divide by the count: two nests, as Step-TP writes a mean."""
    return finish(b, total(b, x, ax, dtype), lambda s: div(s, const(ax.count)))


@handles("aten.sum.default", "aten.sum.dim_IntList", "aten.mean.default", "aten.mean.dim", "aten.prod.default",
         "aten.prod.dim_int")
def sum_mean_prod(b: Builder, node, x: Value, dim=None, keepdim=False, dtype=None):
    target = str(node.target)
    if target.endswith(".default"):  # sum/mean/prod.default(x, *, dtype): all dims
        dim, keepdim = None, False
    ax = axes_of(x, dim, keepdim)
    out_dtype = checked(node, ax)
    if "mean" in target:
        return mean_of(b, x, ax, out_dtype)
    return reduce_over(b, ax, out_dtype, "*" if "prod" in target else "+", reader(b, x))


@handles("aten.amax.default", "aten.amin.default", "aten.max.default", "aten.min.default")
def amax(b: Builder, node, x: Value, dim=(), keepdim=False):
    ax = axes_of(x, dim, keepdim)
    op = "max" if "max" in str(node.target) else "min"
    return reduce_over(b, ax, checked(node, ax), op, reader(b, x))


@handles("aten.any.default", "aten.any.dim", "aten.any.dims", "aten.all.default", "aten.all.dim", "aten.all.dims")
def any_all(b: Builder, node, x: Value, dim=None, keepdim=False):
    """any = max of (x != 0), all = min of it, over bools."""
    ax = axes_of(x, dim, keepdim)
    op = "max" if "any" in str(node.target) else "min"
    return reduce_over(b, ax, checked(node, ax), op, lambda i: cmp(b.read(x, i), "!=", const(0)))


def first_index(b: Builder, x: Value, ax: Axes, extreme: Value, op: str, dtype: str) -> Value:
    """Position of the first element equal to `extreme` (PyTorch's tie rule): a min-reduction of the
    position where the element matches and of the count elsewhere, so no loop order matters."""
    match = ">=" if op == "max" else "<="

    def term(i):
        hit = cmp(b.read(x, i), match, stat(b, ax, extreme, i))
        return select(hit, ax.position(i), const(ax.count))

    return reduce_over(b, ax, dtype, "min", term)


@handles("aten.max.dim", "aten.min.dim")
def max_dim(b: Builder, node, x: Value, dim: int, keepdim: bool = False) -> list[Value]:
    ax = axes_of(x, dim, keepdim)
    op = "max" if "max" in str(node.target) else "min"
    values = reduce_over(b, ax, checked(node, ax), op, reader(b, x))
    return [values, first_index(b, x, ax, values, op, checked(node, ax, which=1))]


@handles("aten.argmax.default", "aten.argmin.default")
def argmax(b: Builder, node, x: Value, dim=None, keepdim: bool = False) -> Value:
    """dim=None is over the flattened tensor (keepdim then keeps every dim as 1)."""
    ax = axes_of(x, dim, keepdim)
    op = "max" if "argmax" in str(node.target) else "min"
    extreme = reduce_over(b, ax, x.dtype, op, reader(b, x))
    return first_index(b, x, ax, extreme, op, checked(node, ax))


# -- norms ---------------------------------------------------------------------------------------------
def vector_norm(b: Builder, element: Callable[[list[Expr]], Expr], ax: Axes, dtype: str, ord: float) -> Value:
    """The p-norm of `element(index)` over the folded dims: max/min of magnitudes for +-inf, the nonzero
    count for 0, otherwise a sum of |e|**p (e**2 for p=2) and then the root in its own nest."""
    magnitude = lambda i: call("abs", element(i))  # noqa: E731
    if ord in (INF, -INF):
        return reduce_over(b, ax, dtype, "max" if ord > 0 else "min", magnitude)
    if ord == 0:
        return reduce_over(b, ax, dtype, "+", lambda i: select(cmp(element(i), "!=", const(0)), const(1), const(0)))
    if ord == 1:
        return reduce_over(b, ax, dtype, "+", magnitude)
    if ord == 2:
        return finish(b, reduce_over(b, ax, dtype, "+", lambda i: square(element(i))), lambda s: call("sqrt", s))
    powered = reduce_over(b, ax, dtype, "+", lambda i: BinOp("**", magnitude(i), const(ord)))
    return finish(b, powered, lambda s: BinOp("**", s, const(1 / ord)))


def _ord(node, ord) -> float:
    if ord is None:
        return 2.0
    if isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise UnsupportedOpError(str(node.target), why=f"ord {ord!r}")
    return float(ord)


@handles("aten.linalg_vector_norm.default")
def linalg_vector_norm(b: Builder, node, x: Value, ord=2, dim=None, keepdim=False, dtype=None) -> Value:
    ax = axes_of(x, dim, keepdim)
    return vector_norm(b, reader(b, x), ax, checked(node, ax), _ord(node, ord))


@handles("aten.norm.Scalar", "aten.norm.ScalarOpt_dim", "aten.norm.ScalarOpt_dtype", "aten.norm.ScalarOpt_dim_dtype")
def norm(b: Builder, node, x: Value, p=2, dim=None, keepdim=False, dtype=None) -> Value:
    return linalg_vector_norm(b, node, x, p, dim, keepdim)


@handles("aten.frobenius_norm.dim")
def frobenius_norm(b: Builder, node, x: Value, dim, keepdim=False) -> Value:
    return linalg_vector_norm(b, node, x, 2, dim, keepdim)


def matrix_norm(b: Builder, node, x: Value, ord, dims, keepdim: bool) -> Value:
    """'fro' is the 2-norm of the entries; ord +-1 (+-inf) is the max/min over columns (rows) of the sum
    of magnitudes: one sum over the inner dim kept as size 1, then a max/min over both dims."""
    ax = axes_of(x, dims, keepdim)
    dtype = checked(node, ax)
    if ord == "fro":
        return vector_norm(b, reader(b, x), ax, dtype, 2)
    if ord not in (1, -1, INF, -INF) or len(ax.dims) != 2:
        raise UnsupportedOpError(str(node.target), why=f"matrix norm ord {ord!r} (needs singular values)")
    rows, cols = (norm_dim(d, x.rank) for d in dims)  # in the order given, not sorted
    summed = rows if ord in (1, -1) else cols
    sums = reduce_over(b, Axes(x.shape, (summed,), True), dtype, "+", lambda i: call("abs", b.read(x, i)))
    return reduce_over(b, ax, dtype, "max" if ord > 0 else "min", lambda i: b.read(sums, i))


@handles("aten.linalg_matrix_norm.default", "aten.linalg_matrix_norm.str_ord")
def linalg_matrix_norm(b: Builder, node, x: Value, ord="fro", dim=(-2, -1), keepdim=False, dtype=None) -> Value:
    return matrix_norm(b, node, x, ord, list(dim), keepdim)


@handles("aten.linalg_norm.default", "aten.linalg_norm.ord_str")
def linalg_norm(b: Builder, node, x: Value, ord=None, dim=None, keepdim=False, dtype=None) -> Value:
    """torch.linalg.norm: a vector norm unless ord is given with two dims (or a 2-D input) or is a string."""
    dims = [dim] if isinstance(dim, int) else dim
    matrix = isinstance(ord, str) or (ord is not None and (len(dims) == 2 if dims else x.rank == 2))
    if not matrix:
        return linalg_vector_norm(b, node, x, ord, dims, keepdim)
    return matrix_norm(b, node, x, ord, dims or [-2, -1], keepdim)


# -- var and std ---------------------------------------------------------------------------------------
def variance(b: Builder, x: Value, ax: Axes, dtype: str, correction: float) -> tuple[Value, Value]:
    """(variance, mean) in two passes: the mean, then the sum of squared deviations over count-correction."""
    mean = mean_of(b, x, ax, dtype)
    deviations = reduce_over(b, ax, dtype, "+", lambda i: square(sub(b.read(x, i), stat(b, ax, mean, i))))
    divisor = max(ax.count - correction, 0)
    divisor = int(divisor) if divisor == int(divisor) else divisor
    return finish(b, deviations, lambda s: div(s, const(divisor))), mean


def _correction(target: str, args: tuple, kwargs: dict) -> tuple[Any, float, bool]:
    """(dim, correction, keepdim) across the overloads var(x, unbiased), var.dim(x, dim, unbiased,
    keepdim) and var.correction(x, dim, *, correction, keepdim)."""
    if target.endswith(".default"):
        unbiased = args[0] if args else kwargs.get("unbiased", True)
        return None, 1.0 if unbiased else 0.0, False
    dim = args[0] if args else kwargs.get("dim")
    if target.endswith(".dim"):
        unbiased = args[1] if len(args) > 1 else kwargs.get("unbiased", True)
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        return dim, 1.0 if unbiased else 0.0, bool(keepdim)
    correction = kwargs.get("correction")
    return dim, 1.0 if correction is None else float(correction), bool(kwargs.get("keepdim", False))


@handles("aten.var.default", "aten.var.dim", "aten.var.correction", "aten.std.default", "aten.std.dim",
         "aten.std.correction", "aten.var_mean.default", "aten.var_mean.dim", "aten.var_mean.correction",
         "aten.std_mean.default", "aten.std_mean.dim", "aten.std_mean.correction")
def var_std(b: Builder, node, x: Value, *args, **kwargs):
    target = str(node.target)
    dim, correction, keepdim = _correction(target, args, kwargs)
    ax = axes_of(x, dim, keepdim)
    dtype = checked(node, ax)
    var, mean = variance(b, x, ax, dtype, correction)
    result = finish(b, var, lambda v: call("sqrt", v)) if "std" in target else var
    return [result, mean] if "_mean" in target else result


# -- softmax family ------------------------------------------------------------------------------------
def exp_stats(b: Builder, x: Value, ax: Axes, dtype: str) -> tuple[Value, Value]:
    """(max M, sum E of exp(x-M)) over the folded dims: the first two of Step-TP's three softmax nests.
    Shifting by the max keeps exp from overflowing."""
    top = reduce_over(b, ax, dtype, "max", reader(b, x))
    sums = reduce_over(b, ax, dtype, "+", lambda i: call("exp", sub(b.read(x, i), stat(b, ax, top, i))))
    return top, sums


def log_softmax_of(b: Builder, x: Value, dim: int, dtype: str) -> Value:
    """x - M - log(E), materialised (cross_entropy reads it at the target classes)."""
    ax = axes_of(x, dim)
    top, sums = exp_stats(b, x, ax, dtype)
    return b.map(x.shape, dtype, lambda i: sub(sub(b.read(x, i), stat(b, ax, top, i)),
                                               call("log", stat(b, ax, sums, i))))


@handles("aten.softmax.int", "aten._softmax.default")
def softmax(b: Builder, node, x: Value, dim: int, *args) -> Value:
    shape, dtype = out_meta(node)
    ax = axes_of(x, dim)
    top, sums = exp_stats(b, x, ax, dtype)
    return b.map(shape, dtype, lambda i: div(call("exp", sub(b.read(x, i), stat(b, ax, top, i))),
                                             stat(b, ax, sums, i)))


@handles("aten.log_softmax.int", "aten._log_softmax.default")
def log_softmax(b: Builder, node, x: Value, dim: int, *args) -> Value:
    return log_softmax_of(b, x, dim, out_meta(node)[1])


@handles("aten.logsumexp.default")
def logsumexp(b: Builder, node, x: Value, dim=(), keepdim: bool = False) -> Value:
    """log(E) + M."""
    ax = axes_of(x, dim, keepdim)
    top, sums = exp_stats(b, x, ax, checked(node, ax))
    return b.map(ax.out_shape, top.dtype, lambda o: add(call("log", b.access(sums, o)), b.access(top, o)))
