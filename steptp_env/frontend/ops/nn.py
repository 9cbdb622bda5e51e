"""Neural-network layers: convolutions (plain and transposed), pooling, normalisation, attention.

Every op works on N spatial dims at once, so conv/pool 1d, 2d and 3d share one code path. The layouts
follow Step-TP: a padded input is materialised by its own nest (`E=if_then_else(2<=c<34&..., A_{..,c-2},
0)`), the window or kernel is one reduction nest reading that copy, and a bias is a separate update nest
(`C=C+bias`). A transposed convolution is the same reduction over a zero-stuffed copy with the kernel
flipped. Normalisations compute the mean by one reduction and the variance by a second, over the squared
deviations (two passes, as PyTorch does), then normalise in a map nest.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from functools import reduce
from typing import Any, Callable, Sequence

import torch

from ...ir.ast import And, BinOp, Compare, Equation, Expr, Var
from ..convert import UnsupportedOpError, handles
from ..emit import Builder, Value, add, call, cmp, const, div, mul, select, sub
from .common import norm_dim, out_meta

NEG_INF = float("-inf")

# -- index arithmetic that stays readable (no `*1`, `+0`, `//1`) -----------------------------------


def _scale(e: Expr, k: int) -> Expr:
    return e if k == 1 else mul(e, const(k))


def _shift(e: Expr, k: int) -> Expr:
    return e if k == 0 else add(e, const(k)) if k > 0 else sub(e, const(-k))


def _floordiv(e: Expr, k: int) -> Expr:
    return e if k == 1 else BinOp("//", e, const(k))


def _member(group: Expr | None, size: int, k: Expr) -> Expr:
    """Index of member `k` of `group` when groups hold `size` members (`group` None: a single group)."""
    if group is None:
        return k
    return group if size == 1 else add(mul(group, const(size)), k)


def _ints(value: Any, n: int) -> list[int]:
    """An int or a list of 1 or n ints (as PyTorch accepts them) -> n ints."""
    if isinstance(value, int):
        return [value] * n
    value = [int(v) for v in value]
    return value * n if len(value) == 1 else value


def _spatial_rank(node) -> int:
    """The N of an `..._Nd` op, from its target name."""
    return int(re.search(r"(\d)d", str(node.target)).group(1))


# -- padded copies ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    """One spatial dim of a padded copy: element j holds x[(j - offset) / step] when that is a whole
    index inside x (x has `size` elements), and `fill` elsewhere; the copy has `extent` elements."""

    offset: int
    step: int
    size: int
    extent: int

    def guards(self, j: Var) -> list[Expr]:
        out: list[Expr] = []
        end = self.offset + (self.size - 1) * self.step + 1
        if self.offset > 0 and end < self.extent:
            out.append(Compare((const(self.offset), j, const(end)), ("<=", "<")))
        elif self.offset > 0:
            out.append(cmp(const(self.offset), "<=", j))
        elif end < self.extent:
            out.append(cmp(j, "<", const(end)))
        if self.step > 1:
            out.append(cmp(BinOp("%", _shift(j, -self.offset), const(self.step)), "==", const(0)))
        return out

    @property
    def trivial(self) -> bool:
        return self.offset == 0 and self.step == 1 and self.extent == self.size


def _padded(b: Builder, x: Value, spans: Sequence[_Span], fill: float) -> Value:
    """x with its trailing dims padded (or zero-stuffed) as `spans` say, in one nest; x itself if no
    span changes anything."""
    if all(s.trivial for s in spans):
        return x
    lead = x.rank - len(spans)

    def element(v):
        index, guards = list(v[:lead]), []
        for j, span in zip(v[lead:], spans):
            index.append(_floordiv(_shift(j, -span.offset), span.step))
            guards += span.guards(j)
        read = b.access(x, index)
        return select(reduce(And, guards), read, const(fill)) if guards else read

    return b.map([*x.shape[:lead], *(s.extent for s in spans)], x.dtype, element)


def _symmetric(padding: Any, n: int, sizes: Sequence[int]) -> list[_Span]:
    pads = _ints(padding, n)
    return [_Span(p, 1, s, s + 2 * p) for p, s in zip(pads, sizes)]


# -- convolutions -------------------------------------------------------------------------------------


def _conv_spans(padding: Any, kernel: Sequence[int], dilation: Sequence[int], sizes: Sequence[int]) -> list[_Span]:
    """Zero padding of a convolution's input: ints, or 'valid' / 'same' (PyTorch puts an odd total's
    extra element on the right)."""
    n = len(kernel)
    if padding == "valid":
        return _symmetric(0, n, sizes)
    if padding == "same":
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [_Span(t // 2, 1, s, s + t) for t, s in zip(totals, sizes)]
    return _symmetric(padding, n, sizes)


def _add_channel_bias(b: Builder, acc: Value, bias: Value | None, channel_dim: int) -> Value:
    """`C=C+bias_{channel}`: the bias as a second nest, as in linalg, but indexed by the channel dim
    rather than broadcast over trailing dims."""
    if bias is None:
        return acc

    def body(v):
        target = b.access(acc, v)
        return [Equation(target, add(target, b.access(bias, [v[channel_dim]])))]

    b.emit(acc.shape, body)
    return acc


def _conv(b: Builder, node, x: Value, w: Value, bias: Value | None, stride: Any, padding: Any, dilation: Any,
          groups: int, transposed: bool = False) -> Value:
    """Shared by every convolution. Output [n, co, o...] sums over (ci, k...) of the padded input at
    [n, group*Cin_g + ci, o*stride + k*dilation] times the weight. A transposed convolution reads a
    zero-stuffed copy (input element i at i*stride + dilation*(K-1) - padding) with stride 1 and the
    kernel flipped, its weight laid out (Cin, Cout_g, K...)."""
    shape, dtype = out_meta(node)
    n = w.rank - 2
    lead = x.rank - n - 1  # 1 with a batch dim, 0 for unbatched input
    kernel, sizes, out_sizes = w.shape[2:], x.shape[lead + 1:], shape[lead + 1:]
    strides, dilation = _ints(stride, n), _ints(dilation, n)
    if transposed:
        cin_g, cout_g = w.shape[0] // groups, w.shape[1]
        spans = [_Span(d * (k - 1) - p, s, size, o + d * (k - 1))
                 for k, d, p, s, size, o in zip(kernel, dilation, _ints(padding, n), strides, sizes, out_sizes)]
        strides = [1] * n
    else:
        cin_g, cout_g = w.shape[1], w.shape[0] // groups
        spans = _conv_spans(padding, kernel, dilation, sizes)
    source = _padded(b, x, spans, 0)

    def weight(co: Var, ci: Var, ks: list[Var]) -> Expr:
        if not transposed:
            return b.access(w, [co, ci, *ks])
        within = co if groups == 1 else const(0) if cout_g == 1 else BinOp("%", co, const(cout_g))
        flipped = [sub(const(k - 1), kv) for k, kv in zip(kernel, ks)]
        return b.access(w, [_member(group(co), cin_g, ci), within, *flipped])

    def group(co: Var) -> Expr | None:
        return None if groups == 1 else _floordiv(co, cout_g)

    def term(o, r):
        co, ci, ks = o[lead], r[0], r[1:]
        where = [add(_scale(ov, s), _scale(kv, d)) for ov, kv, s, d in zip(o[lead + 1:], ks, strides, dilation)]
        return mul(b.access(source, [*o[:lead], _member(group(co), cin_g, ci), *where]), weight(co, ci, ks))

    acc = b.reduce(shape, [cin_g, *kernel], dtype, "+", term)
    return _add_channel_bias(b, acc, bias, lead)


@handles("aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default",
         "aten.conv1d.padding", "aten.conv2d.padding", "aten.conv3d.padding")
def conv(b: Builder, node, x: Value, w: Value, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    return _conv(b, node, x, w, bias, stride, padding, dilation, groups)


@handles("aten.conv_transpose1d.default", "aten.conv_transpose2d.input", "aten.conv_transpose3d.input")
def conv_transpose(b: Builder, node, x: Value, w: Value, bias=None, stride=1, padding=0, output_padding=0,
                   groups: int = 1, dilation=1):
    # output_padding only lengthens the output, which out_meta already reports.
    return _conv(b, node, x, w, bias, stride, padding, dilation, groups, transposed=True)


@handles("aten.convolution.default", "aten._convolution.default")
def convolution(b: Builder, node, x: Value, w: Value, bias, stride, padding, dilation, transposed: bool,
                output_padding, groups: int, *flags):
    return _conv(b, node, x, w, bias, stride, padding, dilation, groups, transposed)


# -- pooling ------------------------------------------------------------------------------------------

Reader = Callable[[list[Var], list[Var]], Expr]  # (output vars, window vars) -> element (guarded)
Position = Callable[[list[Var], list[Var]], list[Expr]]  # (output vars, window vars) -> input position


@dataclass(frozen=True)
class _Window:
    """What a pooling reduction reads: `read` gives the (fill-guarded) element, `position` its spatial
    index in the unpadded input (for max-pool indices); `extents` are the window's loops."""

    read: Reader
    position: Position
    extents: list[int]


def _pool_args(node, kernel_size, stride, padding, dilation=1) -> tuple[list[int], ...]:
    """(kernel, stride, padding, dilation) as lists of N ints; no stride means stride = kernel."""
    n = _spatial_rank(node)
    kernel = _ints(kernel_size, n)
    strides = _ints(stride, n) if stride not in (None, [], ()) else kernel
    return kernel, strides, _ints(padding, n), _ints(dilation, n)


def _sliding(b: Builder, x: Value, kernel: list[int], stride: list[int], pads: list[int], dilation: list[int],
             fill: float) -> _Window:
    """A window sliding by `stride` over a padded copy of x (one nest materialises the padding)."""
    n = len(kernel)
    source = _padded(b, x, _symmetric(pads, n, x.shape[-n:]), fill)
    lead = x.rank - n

    def offsets(o, r):
        return [add(_scale(ov, s), _scale(kv, d)) for ov, kv, s, d in zip(o[lead:], r, stride, dilation)]

    return _Window(lambda o, r: b.access(source, [*o[:lead], *offsets(o, r)]),
                   lambda o, r: [_shift(e, -p) for e, p in zip(offsets(o, r), pads)], kernel)


def _adaptive_bounds(o: Var, size: int, out: int) -> tuple[Expr | None, Expr | None, int]:
    """PyTorch's adaptive window along one dim: (start, or None for a single window; end, or None when
    every window has the same length; the longest window's length).
    start = floor(o*size/out), end = ceil((o+1)*size/out)."""
    if size % out == 0:
        k = size // out
        return (None if out == 1 else _scale(o, k)), None, k
    start = BinOp("//", mul(o, const(size)), const(out))
    end = BinOp("//", add(mul(o, const(size)), const(size + out - 1)), const(out))
    return start, end, _longest(size, out)


def _longest(size: int, out: int) -> int:
    return max(-(-(i + 1) * size // out) - i * size // out for i in range(out))


def _adaptive(b: Builder, x: Value, out_sizes: Sequence[int], fill: float) -> _Window:
    """An adaptive window read straight from x; uneven windows loop over the longest and guard the rest."""
    n = len(out_sizes)
    lead = x.rank - n
    sizes = x.shape[lead:]

    def bounds(o):
        return [_adaptive_bounds(ov, s, os) for ov, s, os in zip(o[lead:], sizes, out_sizes)]

    def position(o, r):
        return [kv if start is None else add(start, kv) for (start, _, _), kv in zip(bounds(o), r)]

    def read(o, r):
        pos = position(o, r)
        guards = [cmp(p, "<", end) for p, (_, end, _) in zip(pos, bounds(o)) if end is not None]
        value = b.access(x, [*o[:lead], *pos])
        return select(reduce(And, guards), value, const(fill)) if guards else value

    return _Window(read, position, [_longest(s, os) for s, os in zip(sizes, out_sizes)])


def _argmax(b: Builder, node, x: Value, window: _Window, values: Value) -> Value:
    """Max-pool indices: the smallest flat spatial index (h*W + w) whose element equals the window's
    maximum, which is the first maximum in PyTorch's scan order."""
    shape, _ = out_meta(node, 1)
    n = len(window.extents)
    sizes = x.shape[-n:]
    outside = const(math.prod(sizes))

    def term(o, r):
        flat = None
        for p, size in zip(window.position(o, r), sizes):
            flat = p if flat is None else add(mul(flat, const(size)), p)
        return select(cmp(window.read(o, r), "==", b.access(values, o)), flat, outside)

    return b.reduce(shape, window.extents, "int64", "min", term)


def _max_pool(b: Builder, node, x: Value, window: _Window):
    """Values, and indices too when the graph asks for them (`[values, indices]` for the tuple ops)."""
    shape, dtype = out_meta(node)
    values = b.reduce(shape, window.extents, dtype, "max", window.read)
    if not isinstance(node.meta.get("val"), (tuple, list)):
        return values
    wants_indices = any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users)
    return [values, _argmax(b, node, x, window, values) if wants_indices else None]


@handles("aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default",
         "aten.max_pool1d_with_indices.default", "aten.max_pool2d_with_indices.default",
         "aten.max_pool3d_with_indices.default")
def max_pool(b: Builder, node, x: Value, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    if ceil_mode:
        raise UnsupportedOpError(str(node.target), why="ceil_mode=True")
    args = _pool_args(node, kernel_size, stride, padding, dilation)
    return _max_pool(b, node, x, _sliding(b, x, *args, NEG_INF))


@handles("aten.adaptive_max_pool1d.default", "aten.adaptive_max_pool2d.default",
         "aten.adaptive_max_pool3d.default")
def adaptive_max_pool(b: Builder, node, x: Value, output_size):
    n = _spatial_rank(node)
    return _max_pool(b, node, x, _adaptive(b, x, out_meta(node)[0][-n:], NEG_INF))


def _average(b: Builder, node, window: _Window, divisor: Callable[[list[Var]], Expr]) -> Value:
    """Window sum in one reduction nest, then the division in a map nest."""
    shape, dtype = out_meta(node)
    total = b.reduce(shape, window.extents, dtype, "+", window.read)
    return b.map(shape, dtype, lambda o: div(b.access(total, o), divisor(o)))


@handles("aten.avg_pool1d.default", "aten.avg_pool2d.default", "aten.avg_pool3d.default")
def avg_pool(b: Builder, node, x: Value, kernel_size, stride=None, padding=0, ceil_mode=False,
             count_include_pad=True, divisor_override=None):
    if ceil_mode:
        raise UnsupportedOpError(str(node.target), why="ceil_mode=True")
    kernel, strides, pads, dilation = _pool_args(node, kernel_size, stride, padding)
    window = _sliding(b, x, kernel, strides, pads, dilation, 0)
    lead = x.rank - len(kernel)

    def in_bounds(o):
        """Per dim, the number of window elements inside x: min(start+k, size) - max(start, 0)."""
        counts = []
        for ov, k, s, p, size in zip(o[lead:], kernel, strides, pads, x.shape[lead:]):
            start = _scale(ov, s)
            counts.append(const(k) if p == 0 else sub(call("min", _shift(start, k - p), const(size)),
                                                      call("max", _shift(start, -p), const(0))))
        return reduce(mul, counts)

    if divisor_override:
        return _average(b, node, window, lambda o: const(divisor_override))
    if count_include_pad or not any(pads):
        return _average(b, node, window, lambda o: const(math.prod(kernel)))
    return _average(b, node, window, in_bounds)


@handles("aten.adaptive_avg_pool1d.default", "aten.adaptive_avg_pool2d.default",
         "aten.adaptive_avg_pool3d.default", "aten._adaptive_avg_pool2d.default",
         "aten._adaptive_avg_pool3d.default")
def adaptive_avg_pool(b: Builder, node, x: Value, output_size):
    n = _spatial_rank(node)
    out_sizes = out_meta(node)[0][-n:]
    window = _adaptive(b, x, out_sizes, 0)
    lead = x.rank - n

    def length(o):
        factors = []
        for ov, size, out in zip(o[lead:], x.shape[lead:], out_sizes):
            start, end, k = _adaptive_bounds(ov, size, out)
            factors.append(const(k) if end is None else sub(end, start))
        return reduce(mul, factors)

    return _average(b, node, window, length)


# -- normalisation ------------------------------------------------------------------------------------

Stat = Callable[[list[Expr]], Expr]  # stat index -> expression (mean or variance)


def _moments(b: Builder, x: Value, stat_shape: Sequence[int], extents: Sequence[int],
             source: Callable[[list[Var], list[Var]], list[Expr]]) -> tuple[Stat, Stat]:
    """Mean and biased variance of x over `extents` for every stat element (`source` maps (stat vars,
    reduced vars) to x's index): a sum nest, then a nest summing squared deviations from the mean."""
    count = const(math.prod(extents))
    total = b.reduce(stat_shape, extents, x.dtype, "+", lambda o, r: b.access(x, source(o, r)))

    def mean(i):
        return div(b.access(total, i), count)

    def deviation(o, r):
        d = sub(b.access(x, source(o, r)), mean(o))
        return mul(d, d)

    spread = b.reduce(stat_shape, extents, x.dtype, "+", deviation)
    return mean, (lambda i: div(b.access(spread, i), count))


def _normalise(b: Builder, node, x: Value, mean: Stat | None, var: Stat, stat_of, eps: float,
               weight: Value | None = None, bias: Value | None = None, affine_of=None) -> Value:
    """out = (x - mean) / sqrt(var + eps) * weight + bias, stats at `stat_of(v)`, affine at `affine_of(v)`."""
    shape, dtype = out_meta(node)

    def element(v):
        stat = stat_of(v)
        centred = b.access(x, v) if mean is None else sub(b.access(x, v), mean(stat))
        e = div(centred, call("sqrt", add(var(stat), const(eps))))
        if weight is not None:
            e = mul(e, b.access(weight, affine_of(v)))
        if bias is not None:
            e = add(e, b.access(bias, affine_of(v)))
        return e

    return b.map(shape, dtype, element)


def _channel(v):
    return [v[1]]


def _running(b: Builder, node, x: Value, mean: Value, var: Value, eps: float, weight, bias) -> Value:
    """Inference with stored per-channel statistics (batch norm, instance norm tracking stats)."""
    return _normalise(b, node, x, lambda i: b.access(mean, i), lambda i: b.access(var, i), _channel, eps,
                      weight, bias, _channel)


def _group_norm(b: Builder, node, x: Value, groups: int, weight, bias, eps: float) -> Value:
    """Stats per (sample, group of channels) over the group's channels and all spatial positions."""
    size = x.shape[1] // groups

    def source(o, r):
        return [o[0], _member(None if groups == 1 else o[1], size, r[0]), *r[1:]]

    mean, var = _moments(b, x, [x.shape[0], groups], [size, *x.shape[2:]], source)
    def stat_of(v):
        return [v[0], const(0) if groups == 1 else _floordiv(v[1], size)]

    return _normalise(b, node, x, mean, var, stat_of, eps, weight, bias, _channel)


@handles("aten.batch_norm.default")
def batch_norm(b: Builder, node, x: Value, weight, bias, running_mean, running_var, training: bool,
               momentum, eps: float, cudnn_enabled=False):
    if not training and running_mean is not None:
        return _running(b, node, x, running_mean, running_var, eps, weight, bias)
    # Batch statistics (training, or eval without running stats): per channel over batch and space.
    mean, var = _moments(b, x, [x.shape[1]], [x.shape[0], *x.shape[2:]], lambda o, r: [r[0], o[0], *r[1:]])
    return _normalise(b, node, x, mean, var, _channel, eps, weight, bias, _channel)


@handles("aten._native_batch_norm_legit_no_training.default")
def native_batch_norm(b: Builder, node, x: Value, weight, bias, running_mean, running_var, momentum, eps):
    out = _running(b, node, x, running_mean, running_var, eps, weight, bias)
    return [out, None, None]  # the saved mean / invstd are empty in inference


@handles("aten.instance_norm.default")
def instance_norm(b: Builder, node, x: Value, weight, bias, running_mean, running_var, use_input_stats: bool,
                  momentum, eps: float, cudnn_enabled=False):
    if use_input_stats:
        return _group_norm(b, node, x, x.shape[1], weight, bias, eps)
    return _running(b, node, x, running_mean, running_var, eps, weight, bias)


@handles("aten.group_norm.default")
def group_norm(b: Builder, node, x: Value, num_groups: int, weight=None, bias=None, eps: float = 1e-5,
               cudnn_enabled=True):
    return _group_norm(b, node, x, num_groups, weight, bias, eps)


@handles("aten.layer_norm.default")
def layer_norm(b: Builder, node, x: Value, normalized_shape, weight=None, bias=None, eps: float = 1e-5,
               cudnn_enable=True):
    k = len(normalized_shape)
    lead = x.rank - k
    mean, var = _moments(b, x, x.shape[:lead], x.shape[lead:], lambda o, r: [*o, *r])
    return _normalise(b, node, x, mean, var, lambda v: v[:lead], eps, weight, bias, lambda v: v[lead:])


@handles("aten.rms_norm.default")
def rms_norm(b: Builder, node, x: Value, normalized_shape, weight=None, eps=None):
    k = len(normalized_shape)
    lead = x.rank - k
    if eps is None:
        eps = torch.finfo(node.meta["val"].dtype).eps
    count = const(math.prod(x.shape[lead:]))
    squares = b.reduce(x.shape[:lead], x.shape[lead:], x.dtype, "+",
                       lambda o, r: mul(b.access(x, [*o, *r]), b.access(x, [*o, *r])))
    return _normalise(b, node, x, None, lambda i: div(b.access(squares, i), count), lambda v: v[:lead], eps,
                      weight, None, lambda v: v[lead:])


# -- attention ----------------------------------------------------------------------------------------


def _softmax_rows(b: Builder, z: Value) -> Value:
    """Softmax over the last dim: max reduction, sum of shifted exponentials, normalise."""
    top = b.reduce(z.shape[:-1], [z.shape[-1]], z.dtype, "max", lambda o, r: b.access(z, [*o, r[0]]))

    def shifted(o, s):
        return call("exp", sub(b.access(z, [*o, s]), b.access(top, o)))

    total = b.reduce(z.shape[:-1], [z.shape[-1]], z.dtype, "+", lambda o, r: shifted(o, r[0]))
    return b.map(z.shape, z.dtype, lambda v: div(shifted(v[:-1], v[-1]), b.access(total, v[:-1])))


@handles("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(b: Builder, node, q: Value, k: Value, v: Value, attn_mask=None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale=None,
                                 enable_gqa: bool = False):
    """softmax(q k^T * scale + mask) v. With GQA, query head h reads key/value head h // (Hq // Hkv)."""
    if dropout_p:
        raise UnsupportedOpError(str(node.target), why=f"dropout_p={dropout_p}")
    shape, dtype = out_meta(node)
    batch = list(shape[:-2])
    length, width = q.shape[-2], q.shape[-1]
    keys = k.shape[-2]
    scale = 1 / math.sqrt(width) if scale is None else scale
    ratio = q.shape[-3] // k.shape[-3] if enable_gqa and q.rank >= 3 and k.rank >= 3 else 1

    def kv_batch(o):
        return [*o[:-1], _floordiv(o[-1], ratio)] if ratio > 1 else list(o)

    scores = b.reduce([*batch, length, keys], [width], dtype, "+", lambda o, r: mul(
        mul(b.read(q, [*o[:-1], r[0]]), b.read(k, [*kv_batch(o[:-2]), o[-1], r[0]])), const(scale)))
    if is_causal:  # top-left aligned: query l sees keys s <= l
        scores = b.map(scores.shape, dtype, lambda o: select(cmp(o[-1], "<=", o[-2]), b.access(scores, o),
                                                             const(NEG_INF)))
    elif attn_mask is not None and attn_mask.dtype == "bool":
        scores = b.map(scores.shape, dtype, lambda o: select(b.read(attn_mask, o), b.access(scores, o),
                                                             const(NEG_INF)))
    elif attn_mask is not None:
        scores = b.map(scores.shape, dtype, lambda o: add(b.access(scores, o), b.read(attn_mask, o)))
    weights = _softmax_rows(b, scores)
    return b.reduce(shape, [keys], dtype, "+", lambda o, r: mul(
        b.access(weights, [*o[:-1], r[0]]), b.read(v, [*kv_batch(o[:-2]), r[0], o[-1]])))


@handles("aten.repeat_interleave.self_int")
def repeat_interleave(b: Builder, node, x: Value, repeats: int, dim=None, output_size=None):
    """Each element repeated `repeats` times along `dim` (how GQA is often written before SDPA)."""
    if dim is None:
        raise UnsupportedOpError(str(node.target), why="dim=None (flattening) is not supported")
    dim = norm_dim(dim, x.rank)
    shape, dtype = out_meta(node)
    return b.map(shape, dtype, lambda v: b.access(x, [*v[:dim], _floordiv(v[dim], repeats), *v[dim + 1:]]))
