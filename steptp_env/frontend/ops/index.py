"""Integer index tensors: embedding lookups, index_select and gather read through them, each one copy nest
whose subscript reads the index tensor (`W_{I_{a},b}`, LEIR's index-tensor access); scatter_add is written
in gather form. Verification draws an index input inside the bounds of the tensors it indexes
(`measure.inputs.index_bounds`).

No nest stores through an index tensor: every analysis (dependences, parallel and vector legality, the
local-memory footprint) assumes a store names its element by loop indices. scatter_add is therefore a sum
over the index tensor's scattered dimension of the sources whose index names the output element, a one-hot
selection (`if_then_else(I_{i,b}==a, S_{i,b}, 0)`); it costs the output's size times that extent instead of
the index tensor's size, and adds in another order than ATen's loop (a float sum, inside the documented
tolerances). scatter and index_put, where the last write wins, have no such form and are not translated."""
from __future__ import annotations

from ..convert import UnsupportedOpError, handles
from ..emit import Builder, Value, add, cmp, const, select
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


@handles("aten.scatter_add.default")
def scatter_add(b: Builder, node, x: Value, dim: int, index: Value, src: Value) -> Value:
    """`out = x; out[..., index[..., i, ...], ...] += src[..., i, ...]` along `dim`, in gather form: a sum
    nest over the index tensor's extent along `dim`, then `x` plus that sum. The index tensor must match
    `x` in every other dimension (ATen also allows it smaller, which would leave an edge of `x` unsummed)."""
    _index_tensor(node, index, "the index")
    dim = norm_dim(dim, x.rank)
    if any(index.shape[k] != x.shape[k] for k in range(x.rank) if k != dim):
        raise UnsupportedOpError(str(node.target), node.name,
                                 why=f"index shape {index.shape} differs from the input's {x.shape} outside dim {dim}")
    shape, dtype = out_meta(node)

    def picked(out, scattered):
        at = [*out[:dim], scattered[0], *out[dim + 1:]]
        return select(cmp(b.access(index, at), "==", out[dim]), b.access(src, at), const(0.0))

    sums = b.reduce(x.shape, [index.shape[dim]], dtype, "+", picked)
    return b.map(shape, dtype, lambda v: add(b.access(x, v), b.access(sums, v)))
