"""Elementwise ops: arithmetic with broadcasting, comparisons, where, clamp, and activations.

Activations are written in forms that stay finite where PyTorch's do (tanh as 1-2/(exp(2x)+1) rather
than a ratio of exponentials, which overflows to NaN; softplus with PyTorch's threshold).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ...ir.ast import And, BinOp, Expr, Neg
from ..convert import handles
from ..emit import Builder, add, call, cmp, const, div, mul, select, sub
from .common import operand, out_meta

_BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "add": add, "sub": sub, "mul": mul, "div": div,
    "pow": lambda a, b: mul(a, a) if b == const(2) else BinOp("**", a, b),
    "maximum": lambda a, b: call("max", a, b), "minimum": lambda a, b: call("min", a, b),
}


def _map(b: Builder, node, fn: Callable[[list], Expr]):
    shape, dtype = out_meta(node)
    return b.map(shape, dtype, fn)


def _binary(name: str):
    op = _BINARY[name]

    def handler(b: Builder, node, x: Any, y: Any, alpha: Any = 1, rounding_mode: str | None = None):
        def element(v):
            lhs, rhs = operand(b, x, v), operand(b, y, v)
            if alpha != 1:
                rhs = mul(rhs, const(alpha))
            if rounding_mode == "floor":
                return BinOp("//", lhs, rhs)
            if rounding_mode == "trunc":
                q = div(lhs, rhs)
                return select(cmp(q, "<", const(0)), Neg(BinOp("//", Neg(q), const(1))), BinOp("//", q, const(1)))
            return op(lhs, rhs)

        return _map(b, node, element)

    return handler


for _name in ("add", "sub", "mul", "div"):
    handles(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar", f"aten.{_name}_.Tensor")(_binary(_name))
handles("aten.div.Tensor_mode", "aten.div.Scalar_mode")(_binary("div"))
handles("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")(_binary("pow"))
handles("aten.maximum.default")(_binary("maximum"))
handles("aten.minimum.default")(_binary("minimum"))


@handles("aten.rsub.Scalar", "aten.rsub.Tensor")
def rsub(b: Builder, node, x, y, alpha=1):
    return _map(b, node, lambda v: sub(operand(b, y, v), mul(operand(b, x, v), const(alpha)) if alpha != 1
                                       else operand(b, x, v)))


_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
for _name, _op in _COMPARE.items():
    handles(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(
        lambda b, node, x, y, _op=_op: _map(b, node, lambda v: cmp(operand(b, x, v), _op, operand(b, y, v))))


@handles("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def where(b: Builder, node, cond, x, y):
    return _map(b, node, lambda v: select(operand(b, cond, v), operand(b, x, v), operand(b, y, v)))


@handles("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(b: Builder, node, x, mask, value):
    return _map(b, node, lambda v: select(operand(b, mask, v), operand(b, value, v), operand(b, x, v)))


def _truth(e: Expr) -> Expr:
    return cmp(e, "!=", const(0))


@handles("aten.logical_and.default", "aten.__and__.Tensor", "aten.bitwise_and.Tensor")
def logical_and(b: Builder, node, x, y):
    return _map(b, node, lambda v: And(_truth(operand(b, x, v)), _truth(operand(b, y, v))))


@handles("aten.logical_or.default", "aten.__or__.Tensor", "aten.bitwise_or.Tensor")
def logical_or(b: Builder, node, x, y):
    """LEIR has no `or`: count the true operands instead."""
    return _map(b, node, lambda v: cmp(add(_truth(operand(b, x, v)), _truth(operand(b, y, v))), ">", const(0)))


def _clamp_expr(e: Expr, lo, hi) -> Expr:
    if lo is not None:
        e = call("max", e, lo)
    if hi is not None:
        e = call("min", e, hi)
    return e


@handles("aten.clamp.default", "aten.clamp.Tensor", "aten.clip.default", "aten.clamp_min.default",
         "aten.clamp_max.default")
def clamp(b: Builder, node, x, min=None, max=None):
    target = str(node.target)
    if "clamp_max" in target:
        min, max = None, min
    return _map(b, node, lambda v: _clamp_expr(operand(b, x, v), None if min is None else operand(b, min, v),
                                               None if max is None else operand(b, max, v)))


def sigmoid(e: Expr) -> Expr:
    return div(const(1), add(const(1), call("exp", Neg(e))))


def tanh(e: Expr) -> Expr:
    return sub(const(1), div(const(2), add(call("exp", mul(const(2), e)), const(1))))


def softplus(e: Expr, beta: float = 1.0, threshold: float = 20.0) -> Expr:
    scaled = mul(e, const(beta)) if beta != 1 else e
    soft = call("log", add(const(1), call("exp", scaled)))
    if beta != 1:
        soft = div(soft, const(beta))
    return select(cmp(scaled, ">", const(threshold)), e, soft)


def gelu(e: Expr, approximate: str = "none") -> Expr:
    """PyTorch's formulas; the exact form scales by 1/sqrt(2) as its CPU kernel does (`x * M_SQRT1_2`): a
    multiply, where dividing by sqrt(2) cost a vector division (~10 cycles a vector) per element."""
    if approximate == "tanh":
        inner = mul(const(math.sqrt(2 / math.pi)), add(e, mul(const(0.044715), BinOp("**", e, const(3)))))
        return mul(mul(const(0.5), e), add(const(1), tanh(inner)))
    return mul(mul(const(0.5), e), add(const(1), call("erf", mul(e, const(math.sqrt(0.5))))))


_UNARY: dict[str, Callable[..., Expr]] = {
    "relu": lambda e: call("max", e, const(0)),
    "relu6": lambda e: call("min", call("max", e, const(0)), const(6)),
    "leaky_relu": lambda e, slope=0.01: select(cmp(e, ">", const(0)), e, mul(e, const(slope))),
    "elu": lambda e, alpha=1.0, scale=1.0, input_scale=1.0: select(
        cmp(e, ">", const(0)), e, mul(const(alpha), sub(call("exp", e), const(1)))),
    "selu": lambda e: mul(const(1.0507009873554805), select(
        cmp(e, ">", const(0)), e, mul(const(1.6732632423543772), sub(call("exp", e), const(1))))),
    "gelu": gelu,
    "sigmoid": sigmoid,
    "tanh": tanh,
    "softplus": softplus,
    "softsign": lambda e: div(e, add(const(1), call("abs", e))),
    "mish": lambda e: mul(e, tanh(softplus(e))),
    "silu": lambda e: div(e, add(const(1), call("exp", Neg(e)))),
    "hardtanh": lambda e, lo=-1.0, hi=1.0: call("min", call("max", e, const(lo)), const(hi)),
    "hardsigmoid": lambda e: div(call("min", call("max", add(e, const(3)), const(0)), const(6)), const(6)),
    "hardswish": lambda e: div(mul(e, call("min", call("max", add(e, const(3)), const(0)), const(6))), const(6)),
    "exp": lambda e: call("exp", e),
    "log": lambda e: call("log", e),
    "sqrt": lambda e: call("sqrt", e),
    "rsqrt": lambda e: div(const(1), call("sqrt", e)),
    "abs": lambda e: call("abs", e),
    "neg": Neg,
    "reciprocal": lambda e: div(const(1), e),
    "square": lambda e: mul(e, e),
    "erf": lambda e: call("erf", e),
    "log1p": lambda e: call("log", add(const(1), e)),
    "expm1": lambda e: sub(call("exp", e), const(1)),
    "logical_not": lambda e: cmp(e, "==", const(0)),
}


def _unary(name: str):
    fn = _UNARY[name]

    def handler(b: Builder, node, x, *args, **kwargs):
        if name == "gelu":
            return _map(b, node, lambda v: fn(operand(b, x, v), kwargs.get("approximate", "none")))
        params = [a for a in args if not isinstance(a, bool)]
        return _map(b, node, lambda v: fn(operand(b, x, v), *params))

    return handler


for _name in _UNARY:
    handles(f"aten.{_name}.default", f"aten.{_name}_.default")(_unary(_name))


@handles("aten.alias.default", "aten.clone.default", "aten.contiguous.default", "aten.dropout.default",
         "aten.detach.default", "aten.lift_fresh_copy.default", "aten.feature_dropout.default",
         "aten.alpha_dropout.default", "aten.to.dtype", "aten._to_copy.default", "aten.type_as.default")
def identity(b: Builder, node, x, *args, **kwargs):
    shape, dtype = out_meta(node)
    if dtype == x.dtype:
        return x
    return b.map(shape, dtype, lambda v: b.read(x, v))
