"""Reads through integer index tensors: embedding lookups, index_select and gather, each one copy nest
whose subscript reads the index tensor (`W_{I_{a},b}`, LEIR's index-tensor access). Verification draws an
index input inside the bounds of the tensors it indexes (`measure.inputs.index_bounds`). Writes through an
index (scatter, scatter_add, index_put) are not translated: the analyses would have to treat such a store
as one to an unknown element."""
from __future__ import annotations

from ..convert import UnsupportedOpError, handles
from ..emit import Builder, Value
from .common import norm_dim, out_meta


def _index_tensor(node, index: Value, what: str) -> None:
    if not index.dtype.startswith(("int", "uint")):
        raise UnsupportedOpError(str(node.target), node.name, why=f"{what} must be an integer tensor, got {index.dtype}")


@handles("aten.embedding.default")
def embedding(b: Builder, node, weight: Value, indices: Value, *rest) -> Value:
    """`weight[indices]`: one row of the table per index (padding_idx and the gradient flags do not change
    the forward value)."""
    _index_tensor(node, indices, "the indices")
    shape, dtype = out_meta(node)
    return b.map(shape, dtype, lambda v: b.access(weight, [b.access(indices, v[:-1]), v[-1]]))


@handles("aten.index_select.default")
def index_select(b: Builder, node, x: Value, dim: int, index: Value) -> Value:
    """`x` with dimension `dim` taken at the positions `index` (1-D) lists."""
    _index_tensor(node, index, "the index")
    dim = norm_dim(dim, x.rank)
    shape, dtype = out_meta(node)
    return b.map(shape, dtype, lambda v: b.access(x, [*v[:dim], b.access(index, [v[dim]]), *v[dim + 1:]]))


@handles("aten.gather.default")
def gather(b: Builder, node, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    """`out[..., i, ...] = x[..., index[..., i, ...], ...]` along `dim`, `out` shaped like `index`."""
    _index_tensor(node, index, "the index")
    dim = norm_dim(dim, x.rank)
    shape, dtype = out_meta(node)
    return b.map(shape, dtype, lambda v: b.access(x, [*v[:dim], b.access(index, v), *v[dim + 1:]]))
