"""LEIR: AST, parser, printer, signature checks and analysis (no TVM, no torch)."""
from .ast import Access, And, BinOp, Call, Compare, Const, Equation, Loop, Neg, Nest, Var
from .parser import parse_expr, parse_nests
from .printer import print_expr, print_nests
from .program import Program, Signature, TensorInfo, TensorSpec

__all__ = ["Access", "And", "BinOp", "Call", "Compare", "Const", "Equation", "Loop", "Neg", "Nest", "Var",
           "Program", "Signature", "TensorSpec", "TensorInfo", "parse_expr", "parse_nests", "print_expr",
           "print_nests"]
