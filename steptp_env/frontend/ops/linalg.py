"""Matrix products: mm, bmm, matmul (with batch broadcasting), linear, addmm, baddbmm, einsum.

A product is one reduction nest over the contracted dim; a bias is added by a second nest that updates
the result, as Step-TP writes it (`C=C+bias`), so fusion strategies can later merge the two.
"""
from __future__ import annotations

import string

from ...ir.ast import Equation
from ..convert import UnsupportedOpError, handles
from ..emit import Builder, Value, add, const, mul
from .common import operand, out_meta


def _add_bias(b: Builder, acc: Value, bias, scale: float = 1.0) -> Value:
    if bias is None:
        return acc

    def body(v):
        target = b.access(acc, v)
        term = operand(b, bias, v)
        return [Equation(target, add(target, mul(term, const(scale)) if scale != 1 else term))]

    b.emit(acc.shape, body)
    return acc


def _scaled(e, alpha: float):
    return e if alpha == 1 else mul(e, const(alpha))


@handles("aten.matmul.default", "aten.mm.default", "aten.bmm.default", "aten.dot.default", "aten.mv.default")
def matmul(b: Builder, node, x: Value, y: Value, alpha: float = 1.0) -> Value:
    shape, dtype = out_meta(node)

    def term(o, r):
        k = r[0]
        xi = [k] if x.rank == 1 else (o[:-1] if y.rank > 1 else o) + [k]
        yi = [k] if y.rank == 1 else (o[:-2] if x.rank > 1 else o[:-1]) + [k, o[-1]]
        return _scaled(mul(b.read(x, xi), b.read(y, yi)), alpha)

    return b.reduce(shape, [x.shape[-1]], dtype, "+", term)


@handles("aten.linear.default")
def linear(b: Builder, node, x: Value, w: Value, bias=None) -> Value:
    shape, dtype = out_meta(node)
    acc = b.reduce(shape, [x.shape[-1]], dtype, "+",
                   lambda o, r: mul(b.read(x, o[:-1] + [r[0]]), b.access(w, [o[-1], r[0]])))
    return _add_bias(b, acc, bias)


@handles("aten.addmm.default", "aten.baddbmm.default")
def addmm(b: Builder, node, bias, x: Value, y: Value, beta: float = 1.0, alpha: float = 1.0) -> Value:
    acc = matmul(b, node, x, y, alpha)
    return _add_bias(b, acc, bias, beta) if beta != 0 else acc


@handles("aten.einsum.default")
def einsum(b: Builder, node, equation: str, operands) -> Value:
    shape, dtype = out_meta(node)
    equation = equation.replace(" ", "")
    if "..." in equation or "->" not in equation:
        raise UnsupportedOpError("einsum", why=f"only explicit equations without '...' ({equation!r})")
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if len(terms) != len(operands) or any(c not in string.ascii_letters for c in "".join(terms) + out):
        raise UnsupportedOpError("einsum", why=f"malformed equation {equation!r}")
    reduced = sorted({c for t in terms for c in t} - set(out), key=lhs.index)
    sizes = {}
    for term, value in zip(terms, operands):
        for c, d in zip(term, value.shape):
            sizes[c] = max(sizes.get(c, 1), d)

    def element(o, r):
        var = dict(zip(out, o)) | dict(zip(reduced, r))
        product = None
        for term, value in zip(terms, operands):
            read = b.read(value, [var[c] for c in term])
            product = read if product is None else mul(product, read)
        return product

    if not reduced:
        return b.map(shape, dtype, lambda o: element(o, []))
    return b.reduce(shape, [sizes[c] for c in reduced], dtype, "+", element)
