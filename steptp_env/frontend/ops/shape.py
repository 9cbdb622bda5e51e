"""Data movement: view/reshape, permute/transpose, (un)squeeze, expand, slicing, cat, split, flip,
triu/tril, diag. Each materialises its result in one copy nest (the Step-TP convention); inlining
strategies remove the copies later."""
from __future__ import annotations

import math
from typing import Sequence

from ...ir.ast import BinOp, Equation, Expr, Var
from ..convert import UnsupportedOpError, handles
from ..emit import Builder, Value, add, cmp, const, mul, select, sub
from .common import norm_dim, out_meta


def linear_index(vars_: Sequence[Expr], shape: Sequence[int]) -> Expr | None:
    """Row-major linear index of `vars_` in `shape` (None for an empty group)."""
    expr = None
    stride = 1
    for v, d in reversed(list(zip(vars_, shape))):
        if d == 1:
            stride *= d
            continue
        term = v if stride == 1 else mul(v, const(stride))
        expr = term if expr is None else add(term, expr)
        stride *= d
    return expr


def reshape_index(out_vars: Sequence[Var], out_shape: Sequence[int], in_shape: Sequence[int]) -> list[Expr]:
    """Subscripts of the source element that a reshape puts at `out_vars`, grouping dims whose products
    match so that splits read `x_{c*16+d}` and merges read `x_{i//16, i%16}`."""
    index: list[Expr] = []
    i = j = 0
    while i < len(out_shape) or j < len(in_shape):
        gi, gj = [i], [j]
        po = out_shape[i] if i < len(out_shape) else 1
        pi = in_shape[j] if j < len(in_shape) else 1
        i, j = i + 1, j + 1
        while po != pi:
            if po < pi:
                gi.append(i)
                po *= out_shape[i]
                i += 1
            else:
                gj.append(j)
                pi *= in_shape[j]
                j += 1
        gi = [k for k in gi if k < len(out_shape)]
        gj = [k for k in gj if k < len(in_shape)]
        flat = linear_index([out_vars[k] for k in gi], [out_shape[k] for k in gi]) or const(0)
        strides = [math.prod(in_shape[k + 1: gj[-1] + 1]) for k in gj]
        for k, stride in zip(gj, strides):
            e = flat if stride == 1 else BinOp("//", flat, const(stride))
            if k != gj[0] and in_shape[k] > 1:
                e = BinOp("%", e, const(in_shape[k]))
            index.append(const(0) if in_shape[k] == 1 else e)
    return index


def _copy(b: Builder, node, x: Value, index_fn) -> Value:
    shape, dtype = out_meta(node)
    return b.map(shape, dtype, lambda v: b.access(x, index_fn(v)))


@handles("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.flatten.using_ints",
         "aten.unflatten.int", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
         "aten.unsqueeze.default", "aten.view_as.default", "aten.reshape_as.default")
def reshape(b: Builder, node, x: Value, *args) -> Value:
    shape, _ = out_meta(node)
    if shape == x.shape:
        return x
    return _copy(b, node, x, lambda v: reshape_index(v, shape, x.shape))


@handles("aten.permute.default")
def permute(b: Builder, node, x: Value, dims) -> Value:
    dims = [norm_dim(d, x.rank) for d in dims]
    inverse = [dims.index(k) for k in range(x.rank)]
    return _copy(b, node, x, lambda v: [v[inverse[k]] for k in range(x.rank)])


@handles("aten.transpose.int", "aten.t.default", "aten.swapaxes.default")
def transpose(b: Builder, node, x: Value, d0: int = 0, d1: int = 1) -> Value:
    if x.rank < 2:
        return x
    d0, d1 = norm_dim(d0, x.rank), norm_dim(d1, x.rank)
    order = list(range(x.rank))
    order[d0], order[d1] = order[d1], order[d0]
    return _copy(b, node, x, lambda v: [v[order[k]] for k in range(x.rank)])


@handles("aten.broadcast_tensors.default")
def broadcast_tensors(b: Builder, node, tensors) -> list[Value]:
    """Every tensor expanded to the common shape; tensors already of that shape pass without a copy."""
    shape, _ = out_meta(node)
    return [t if t.shape == shape else b.map(shape, t.dtype, lambda v, t=t: b.read(t, v)) for t in tensors]


@handles("aten.expand.default", "aten.expand_as.default", "aten.broadcast_to.default")
def expand(b: Builder, node, x: Value, *args) -> Value:
    shape, dtype = out_meta(node)
    return b.map(shape, dtype, lambda v: b.read(x, v))


@handles("aten.slice.Tensor")
def slice_(b: Builder, node, x: Value, dim: int = 0, start=None, end=None, step: int = 1) -> Value:
    dim = norm_dim(dim, x.rank)
    start = 0 if start is None else (start + x.shape[dim] if start < 0 else min(start, x.shape[dim]))
    shape, _ = out_meta(node)
    if shape == x.shape:
        return x

    def index(v):
        e = v[dim] if step == 1 else mul(v[dim], const(step))
        return [*v[:dim], add(e, const(start)) if start else e, *v[dim + 1:]]

    return _copy(b, node, x, index)


@handles("aten.select.int")
def select_(b: Builder, node, x: Value, dim: int, index: int) -> Value:
    dim = norm_dim(dim, x.rank)
    index = index + x.shape[dim] if index < 0 else index
    return _copy(b, node, x, lambda v: [*v[:dim], const(index), *v[dim:]])


@handles("aten.cat.default", "aten.concat.default")
def cat(b: Builder, node, tensors, dim: int = 0) -> Value:
    shape, dtype = out_meta(node)
    tensors = [t for t in tensors if math.prod(t.shape) > 0]
    dim = norm_dim(dim, len(shape))
    out = b.new(shape, dtype)
    offset = 0
    for t in tensors:
        def body(v, t=t, offset=offset):
            target = [*v[:dim], add(v[dim], const(offset)) if offset else v[dim], *v[dim + 1:]]
            return [Equation(b.access(out, target), b.access(t, v))]

        b.emit(t.shape, body)
        offset += t.shape[dim]
    return out


@handles("aten.stack.default")
def stack(b: Builder, node, tensors, dim: int = 0) -> Value:
    shape, dtype = out_meta(node)
    dim = norm_dim(dim, len(shape))
    out = b.new(shape, dtype)
    for k, t in enumerate(tensors):
        b.emit(t.shape, lambda v, t=t, k=k: [Equation(b.access(out, [*v[:dim], const(k), *v[dim:]]),
                                                      b.access(t, v))])
    return out


@handles("aten.unbind.int")
def unbind(b: Builder, node, x: Value, dim: int = 0) -> list[Value]:
    dim = norm_dim(dim, x.rank)
    shape = x.shape[:dim] + x.shape[dim + 1:]
    return [b.map(shape, x.dtype, lambda v, k=k: b.access(x, [*v[:dim], const(k), *v[dim:]]))
            for k in range(x.shape[dim])]


@handles("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default")
def split(b: Builder, node, x: Value, sizes, dim: int = 0) -> list[Value]:
    dim = norm_dim(dim, x.rank)
    parts = []
    start = 0
    for meta in node.meta["val"]:
        shape = tuple(int(d) for d in meta.shape)

        def index(v, start=start):
            return [*v[:dim], add(v[dim], const(start)) if start else v[dim], *v[dim + 1:]]

        parts.append(b.map(shape, x.dtype, lambda v, f=index: b.access(x, f(v))))
        start += shape[dim]
    return parts


@handles("getitem")
def getitem(b: Builder, node, seq, index):
    if isinstance(seq, (list, tuple)):
        return seq[index]
    raise UnsupportedOpError("getitem", why=f"indexing a {type(seq).__name__}")


@handles("aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default", "aten.zeros.default",
         "aten.ones.default", "aten.full.default", "aten.scalar_tensor.default", "aten.new_zeros.default",
         "aten.new_ones.default", "aten.new_full.default")
def constant_fill(b: Builder, node, *args, **kwargs) -> Value:
    """A tensor of one value (the shape and dtype come from the graph's metadata)."""
    target = str(node.target)
    if "zeros" in target:
        value = 0
    elif "ones" in target:
        value = 1
    elif "scalar_tensor" in target:
        value = args[0]
    else:
        value = kwargs.get("fill_value", args[-1] if target.endswith("new_full.default") else args[1])
    shape, dtype = out_meta(node)
    return b.map(shape, dtype, lambda v: const(value))


@handles("aten._assert_tensor_metadata.default", "aten._assert_scalar.default")
def assertion(b: Builder, node, *args, **kwargs) -> None:
    """Checks torch.export records about tensor metadata: nothing to compute."""
    return None


@handles("aten.flip.default")
def flip(b: Builder, node, x: Value, dims) -> Value:
    dims = {norm_dim(d, x.rank) for d in dims}
    return _copy(b, node, x, lambda v: [sub(const(x.shape[k] - 1), v[k]) if k in dims else v[k]
                                        for k in range(x.rank)])


def _triangle(b: Builder, node, x: Value, diagonal: int, upper: bool) -> Value:
    shape, dtype = out_meta(node)

    def element(v):
        row, col = v[-2], v[-1]
        shifted = add(row, const(diagonal)) if diagonal > 0 else sub(row, const(-diagonal)) if diagonal else row
        keep = cmp(col, ">=", shifted) if upper else cmp(col, "<=", shifted)
        return select(keep, b.access(x, v), const(0))

    return b.map(shape, dtype, element)


@handles("aten.triu.default")
def triu(b: Builder, node, x: Value, diagonal: int = 0) -> Value:
    return _triangle(b, node, x, diagonal, True)


@handles("aten.tril.default")
def tril(b: Builder, node, x: Value, diagonal: int = 0) -> Value:
    return _triangle(b, node, x, diagonal, False)


@handles("aten.diag.default", "aten.diag_embed.default")
def diag(b: Builder, node, x: Value, offset: int = 0, *args) -> Value:
    shape, dtype = out_meta(node)
    if x.rank == 1:
        def element(v):
            col = add(v[0], const(offset)) if offset >= 0 else v[0]
            row = v[0] if offset >= 0 else add(v[1], const(-offset))
            on = cmp(v[1], "==", col) if offset >= 0 else cmp(v[0], "==", row)
            return select(on, b.access(x, [v[0] if offset >= 0 else v[1]]), const(0))

        return b.map(shape, dtype, element)
    if x.rank == 2:
        return b.map(shape, dtype, lambda v: b.access(x, [v[0], add(v[0], const(offset))] if offset >= 0
                                                      else [add(v[0], const(-offset)), v[0]]))
    raise UnsupportedOpError("diag", why=f"input of rank {x.rank}")
