"""Losses: mse, l1, smooth_l1, huber, kl_div, soft_margin, hinge_embedding, margin_ranking, binary cross
entropy (with and without logits), nll, cross_entropy, cosine_similarity, pairwise_distance and
triplet_margin_loss.

A loss is a per-element expression plus a reduction (ATen's enum: 0 none, 1 mean, 2 sum): `none` maps
the expression, `sum` folds it in one reduction nest into a 0-d tensor, `mean` adds a nest dividing by the
count (or by the summed class weights for nll). The expressions follow ATen's formulas (xlogy for
kl_div, eps inside pairwise_distance, clamping of both norms in cosine_similarity) so that results match
PyTorch rather than the textbook.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ...ir.ast import Expr, Neg
from ...ir.dtypes import is_float
from ..convert import UnsupportedOpError, handles
from ..emit import Builder, Value, add, call, cmp, const, div, mul, select, sub
from .common import norm_dim, operand, out_meta
from .reduce import Axes, checked, finish, log_softmax_of, reduce_over, square, vector_norm

NONE, MEAN, SUM = 0, 1, 2
Element = Callable[[Sequence[Expr]], Expr]


def broadcast_shape(*values) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*(v.shape for v in values if isinstance(v, Value))))


def all_axes(shape: Sequence[int]) -> Axes:
    return Axes(tuple(shape), tuple(range(len(shape))))


def reduced(b: Builder, node, shape: Sequence[int], element: Element, reduction: int,
            denominator: Expr | None = None) -> Value:
    """Apply a loss reduction to `element(index)` over `shape`; `mean` divides by `denominator`
    (default: the element count)."""
    out_shape, dtype = out_meta(node)
    if reduction == NONE:
        return b.map(out_shape, dtype, element)
    if reduction not in (MEAN, SUM):
        raise UnsupportedOpError(str(node.target), why=f"reduction {reduction!r}")
    ax = all_axes(shape)
    summed = reduce_over(b, ax, dtype, "+", element)
    if reduction == SUM:
        return summed
    return finish(b, summed, lambda s: div(s, const(ax.count) if denominator is None else denominator))


def pointwise(fn: Callable[..., Expr]):
    """A handler for a loss of two (broadcast) tensors: fn(input element, target element, *params)."""

    def handler(b: Builder, node, x, y, reduction: int = MEAN, *params):
        element = lambda i: fn(operand(b, x, i), operand(b, y, i), *params)  # noqa: E731
        return reduced(b, node, broadcast_shape(x, y), element, reduction)

    return handler


def _smooth_l1(x: Expr, y: Expr, beta: float = 1.0) -> Expr:
    z = call("abs", sub(x, y))
    if beta == 0:
        return z
    return select(cmp(z, "<", const(beta)), div(mul(const(0.5), square(z)), const(beta)),
                  sub(z, const(0.5 * beta)))


def _huber(x: Expr, y: Expr, delta: float = 1.0) -> Expr:
    z = call("abs", sub(x, y))
    return select(cmp(z, "<", const(delta)), mul(const(0.5), square(z)), mul(const(delta), sub(z, const(0.5 * delta))))


def _soft_margin(x: Expr, y: Expr) -> Expr:
    return call("log", add(const(1), call("exp", mul(Neg(x), y))))


handles("aten.mse_loss.default")(pointwise(lambda x, y: square(sub(x, y))))
handles("aten.l1_loss.default")(pointwise(lambda x, y: call("abs", sub(x, y))))
handles("aten.smooth_l1_loss.default")(pointwise(_smooth_l1))
handles("aten.huber_loss.default")(pointwise(_huber))
handles("aten.soft_margin_loss.default")(pointwise(_soft_margin))


@handles("aten.kl_div.default")
def kl_div(b: Builder, node, x, target, reduction: int = MEAN, log_target: bool = False):
    """ATen: exp(t)*(t-x) for log targets, else xlogy(t, t) - t*x (0 where t == 0)."""
    def element(i):
        xi, t = operand(b, x, i), operand(b, target, i)
        if log_target:
            return mul(call("exp", t), sub(t, xi))
        return sub(select(cmp(t, "==", const(0)), const(0), mul(t, call("log", t))), mul(t, xi))

    return reduced(b, node, broadcast_shape(x, target), element, reduction)


@handles("aten.hinge_embedding_loss.default")
def hinge_embedding_loss(b: Builder, node, x, target, margin: float = 1.0, reduction: int = MEAN):
    """ATen: where(t != 1, max(margin - x, 0), 0) + where(t != -1, x, 0)."""
    def element(i):
        xi, t = operand(b, x, i), operand(b, target, i)
        below = select(cmp(t, "!=", const(1)), call("max", sub(const(margin), xi), const(0)), const(0))
        return add(below, select(cmp(t, "!=", const(-1)), xi, const(0)))

    return reduced(b, node, broadcast_shape(x, target), element, reduction)


@handles("aten.margin_ranking_loss.default")
def margin_ranking_loss(b: Builder, node, x1, x2, target, margin: float = 0.0, reduction: int = MEAN):
    def element(i):
        gap = mul(Neg(operand(b, target, i)), sub(operand(b, x1, i), operand(b, x2, i)))
        return call("max", add(gap, const(margin)), const(0))

    return reduced(b, node, broadcast_shape(x1, x2, target), element, reduction)


def _weighted(b: Builder, e: Expr, weight, i) -> Expr:
    return e if weight is None else mul(operand(b, weight, i), e)


@handles("aten.binary_cross_entropy.default")
def binary_cross_entropy(b: Builder, node, x, target, weight=None, reduction: int = MEAN):
    """ATen: (t-1)*max(log(1-x), -100) - t*max(log(x), -100)."""
    def element(i):
        xi, t = operand(b, x, i), operand(b, target, i)
        log_x = call("max", call("log", xi), const(-100))
        log_rest = call("max", call("log", sub(const(1), xi)), const(-100))
        return _weighted(b, sub(mul(sub(t, const(1)), log_rest), mul(t, log_x)), weight, i)

    return reduced(b, node, broadcast_shape(x, target), element, reduction)


@handles("aten.binary_cross_entropy_with_logits.default")
def bce_with_logits(b: Builder, node, x, target, weight=None, pos_weight=None, reduction: int = MEAN):
    """ATen: (1-t)*x - lw*log_sigmoid(x), lw = (pos_weight-1)*t + 1, log_sigmoid(x) = min(x,0) -
    log(1+exp(-|x|)) (finite for large |x|)."""
    def element(i):
        xi, t = operand(b, x, i), operand(b, target, i)
        log_sigmoid = sub(call("min", xi, const(0)), call("log", add(const(1), call("exp", Neg(call("abs", xi))))))
        if pos_weight is not None:
            log_sigmoid = mul(add(mul(sub(operand(b, pos_weight, i), const(1)), t), const(1)), log_sigmoid)
        return _weighted(b, sub(mul(sub(const(1), t), xi), log_sigmoid), weight, i)

    return reduced(b, node, broadcast_shape(x, target, *(w for w in (weight, pos_weight) if w is not None)),
                   element, reduction)


# -- distances -----------------------------------------------------------------------------------------
@handles("aten.cosine_similarity.default")
def cosine_similarity(b: Builder, node, x1: Value, x2: Value, dim: int = 1, eps: float = 1e-8):
    """ATen: sum(x1*x2) / (max(|x1|, eps) * max(|x2|, eps)), each norm clamped on its own."""
    shape = broadcast_shape(x1, x2)
    ax = Axes(shape, (norm_dim(dim, len(shape)),))
    dtype = checked(node, ax)
    dot = reduce_over(b, ax, dtype, "+", lambda i: mul(b.read(x1, i), b.read(x2, i)))
    n1 = vector_norm(b, lambda i: b.read(x1, i), ax, dtype, 2)
    n2 = vector_norm(b, lambda i: b.read(x2, i), ax, dtype, 2)

    def clamped(n, o):
        return call("max", b.access(n, o), const(eps))

    return b.map(ax.out_shape, dtype, lambda o: div(b.access(dot, o), mul(clamped(n1, o), clamped(n2, o))))


def distance(b: Builder, x1, x2, p: float, eps: float, dtype: str, keepdim: bool = False) -> Value:
    """ATen's pairwise_distance: the p-norm of x1 - x2 + eps over the last dim."""
    shape = broadcast_shape(x1, x2)
    ax = Axes(shape, (len(shape) - 1,), keepdim)
    return vector_norm(b, lambda i: add(sub(operand(b, x1, i), operand(b, x2, i)), const(eps)), ax, dtype, p)


@handles("aten.pairwise_distance.default")
def pairwise_distance(b: Builder, node, x1, x2, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
    return distance(b, x1, x2, float(p), eps, out_meta(node)[1], keepdim)


@handles("aten.triplet_margin_loss.default")
def triplet_margin_loss(b: Builder, node, anchor, positive, negative, margin: float = 1.0, p: float = 2.0,
                        eps: float = 1e-6, swap: bool = False, reduction: int = MEAN):
    """max(margin + d(a,p) - d(a,n), 0); with swap, d(a,n) becomes min(d(a,n), d(p,n))."""
    dtype = out_meta(node)[1]
    near = distance(b, anchor, positive, float(p), eps, dtype)
    far = distance(b, anchor, negative, float(p), eps, dtype)
    swapped = distance(b, positive, negative, float(p), eps, dtype) if swap else None

    def element(i):
        d_far = b.access(far, i) if swapped is None else call("min", b.access(far, i), b.access(swapped, i))
        return call("max", sub(add(const(margin), b.access(near, i)), d_far), const(0))

    return reduced(b, node, near.shape, element, reduction)


# -- nll and cross entropy -----------------------------------------------------------------------------
def nll(b: Builder, node, logp: Value, target: Value, weight, reduction: int, ignore_index: int,
        smoothing: float = 0.0) -> Value:
    """-w[t]*logp[.., t, ..] per target element (class dim 1, or 0 for a single sample), 0 where
    t == ignore_index; mean divides by the summed weights of the counted targets. With label smoothing
    (no weight) each term becomes (1-s)*nll + s/C * (-sum over classes of logp), as ATen computes it."""
    cdim = 1 if logp.rank >= 2 else 0
    classes = logp.shape[cdim]
    dtype = out_meta(node)[1]
    masked = 0 <= ignore_index < classes  # otherwise no in-range target can equal it

    def picked(i):
        return b.access(logp, [*i[:cdim], b.access(target, i), *i[cdim:]])

    def class_weight(i):
        return const(1) if weight is None else b.access(weight, [b.access(target, i)])

    def keep(i, e):
        return select(cmp(b.access(target, i), "!=", const(ignore_index)), e, const(0)) if masked else e

    spread = None
    if smoothing:
        spread = reduce_over(b, Axes(logp.shape, (cdim,)), dtype, "+", lambda i: b.access(logp, i))

    def element(i):
        e = Neg(picked(i)) if weight is None else Neg(mul(class_weight(i), picked(i)))
        if spread is not None:
            e = add(mul(const(1 - smoothing), e), mul(const(smoothing / classes), Neg(b.access(spread, i))))
        return keep(i, e)

    denominator = None
    if reduction == MEAN and (masked or weight is not None):
        counted = reduce_over(b, all_axes(target.shape), dtype, "+", lambda i: keep(i, class_weight(i)))
        denominator = b.access(counted, [])
    return reduced(b, node, target.shape, element, reduction, denominator)


@handles("aten.nll_loss_nd.default", "aten.nll_loss.default", "aten.nll_loss2d.default")
def nll_loss(b: Builder, node, logp: Value, target: Value, weight=None, reduction: int = MEAN,
             ignore_index: int = -100):
    return nll(b, node, logp, target, weight, reduction, ignore_index)


def soft_targets(b: Builder, node, logp: Value, target: Value, reduction: int, smoothing: float) -> Value:
    """Class-probability targets: -sum over classes of logp*t (t smoothed towards 1/C); mean divides by
    the number of samples."""
    cdim = 1 if logp.rank >= 2 else 0
    classes = logp.shape[cdim]
    dtype = out_meta(node)[1]

    def term(i):
        t = b.read(target, i)
        if smoothing:
            t = add(mul(t, const(1 - smoothing)), const(smoothing / classes))
        return Neg(mul(b.access(logp, i), t))

    if reduction == NONE:
        return reduce_over(b, Axes(logp.shape, (cdim,)), dtype, "+", term)
    return reduced(b, node, logp.shape, term, reduction, const(math.prod(logp.shape) // classes))


@handles("aten.cross_entropy_loss.default")
def cross_entropy(b: Builder, node, x: Value, target: Value, weight=None, reduction: int = MEAN,
                  ignore_index: int = -100, label_smoothing: float = 0.0):
    """log_softmax over the class dim (Step-TP's three nests), then nll or soft targets."""
    probabilities = is_float(target.dtype)
    if weight is not None and (label_smoothing or probabilities):
        raise UnsupportedOpError("aten.cross_entropy_loss.default",
                                 why="class weights with label_smoothing or probability targets")
    logp = log_softmax_of(b, x, 1 if x.rank >= 2 else 0, out_meta(node)[1])
    if probabilities:
        return soft_targets(b, node, logp, target, reduction, label_smoothing)
    return nll(b, node, logp, target, weight, reduction, ignore_index, label_smoothing)
