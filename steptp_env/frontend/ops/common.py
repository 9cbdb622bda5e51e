"""Helpers every op handler uses: the node's output shape/dtype, scalars versus tensors, dims."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ...ir.ast import Expr, Var
from ..convert import TORCH_TO_DTYPE, UnsupportedOpError
from ..emit import Builder, Value, const


def out_meta(node: torch.fx.Node, which: int = 0) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of the node's (which-th) output, from the fake tensor torch.export recorded."""
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        val = val[which]
    if not isinstance(val, torch.Tensor):
        raise UnsupportedOpError(str(node.target), node.name, why="output is not a tensor")
    try:
        shape = tuple(int(d) for d in val.shape)
    except TypeError:
        raise UnsupportedOpError("data-dependent shape", node.name, why=f"shape {tuple(val.shape)}") from None
    if val.dtype not in TORCH_TO_DTYPE:
        raise UnsupportedOpError(f"dtype {val.dtype}", node.name)
    return shape, TORCH_TO_DTYPE[val.dtype]


def operand(b: Builder, x: Any, index: Sequence[Var]) -> Expr:
    """A tensor read with broadcasting, or a Python scalar as a literal."""
    if isinstance(x, Value):
        return b.read(x, index)
    if isinstance(x, bool):
        return const(int(x))
    if isinstance(x, (int, float)):
        return const(x)
    raise UnsupportedOpError(f"operand of type {type(x).__name__}")


def norm_dim(dim: int, rank: int) -> int:
    """A possibly negative dim as an index into a shape of `rank` (0-d tensors accept 0 and -1)."""
    if rank == 0 and dim in (0, -1):
        return 0
    if not -rank <= dim < rank:
        raise UnsupportedOpError(f"dim {dim} for a tensor of rank {rank}")
    return dim % rank


def norm_dims(dims: Any, rank: int) -> list[int]:
    """A dim, a list of dims, or None/[] (all dims) -> sorted distinct non-negative dims."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({norm_dim(d, rank) for d in dims})
