"""Prefix scans: cumsum, cumprod, logcumsumexp.

Each is one nest whose equation reads its own target one step back along the scanned dim
(`F_{a}=if_then_else(a-1<0,0,F_{a-1})+X_{a}`): a LEIR prefix scan, linear in the length where
Step-TP's masked reduction (`C_{a}=C_{a}+if_then_else(c<=a,A_{c},0)`) is quadratic. The guard makes the
first element start from the operator's identity; the scanned loop (innermost) must stay serial.
"""
from __future__ import annotations

from typing import Callable

from ...ir.ast import Equation, Expr
from ..convert import handles
from ..emit import Builder, Value, add, call, cmp, const, mul, select, sub
from .common import norm_dim, out_meta


def prefix_scan(b: Builder, node, x: Value, dim: int, identity: float,
                step: Callable[[Expr, Expr], Expr]) -> Value:
    """out[..., a, ...] = step(out[..., a-1, ...] (identity before the start), x[..., a, ...])."""
    shape, dtype = out_meta(node)
    if not shape:  # a 0-d scan is the element itself
        return b.map(shape, dtype, lambda v: b.read(x, v))
    dim = norm_dim(dim, len(shape))
    out = b.new(shape, dtype)
    # The scanned loop goes innermost, so that binding a nest's outer loop to GPU threads never lands on it.
    order = [k for k in range(len(shape)) if k != dim] + [dim]

    def body(loop_vars):
        v = [loop_vars[order.index(k)] for k in range(len(shape))]
        back = sub(v[dim], const(1))
        previous = b.access(out, [*v[:dim], back, *v[dim + 1:]])
        carried = select(cmp(back, "<", const(0)), const(identity), previous)
        return [Equation(b.access(out, v), step(carried, b.read(x, v)))]

    b.emit([shape[k] for k in order], body)
    return out


@handles("aten.cumsum.default", "aten.cumsum_.default")
def cumsum(b: Builder, node, x: Value, dim: int, dtype=None) -> Value:
    return prefix_scan(b, node, x, dim, 0, add)


@handles("aten.cumprod.default", "aten.cumprod_.default")
def cumprod(b: Builder, node, x: Value, dim: int, dtype=None) -> Value:
    return prefix_scan(b, node, x, dim, 1, mul)


def _log_add_exp(acc: Expr, e: Expr) -> Expr:
    """log(exp(acc) + exp(e)) computed around the larger operand, finite for -inf acc."""
    top = call("max", acc, e)
    return add(top, call("log", add(call("exp", sub(acc, top)), call("exp", sub(e, top)))))


@handles("aten.logcumsumexp.default")
def logcumsumexp(b: Builder, node, x: Value, dim: int) -> Value:
    return prefix_scan(b, node, x, dim, -float("inf"), _log_add_exp)
