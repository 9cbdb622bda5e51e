"""A recursive-descent parser for LEIR text.

The grammar (see docs/leir.md for the EBNF) is small and LL(1) after tokenization, so a hand-written parser
gives exact error positions and a clear "expected ..." for every failure. Precedence, weakest first:
`&`, comparison chains, `+ -`, `* / // %`, unary minus, `**` (right associative), atoms.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ..errors import ParseError
from .ast import (FUNCTIONS, LOOP_KINDS, SCOPES, Access, And, BinOp, Call, Compare, Const, Equation, Expr,
                  Loop, Neg, Nest, Statement, Var)
from .dtypes import CODE_TO_DTYPE

_TOKEN = re.compile(r"""
    (?P<NUMBER>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)
  | (?P<IDENT>[A-Za-z][A-Za-z0-9_]*)
  | (?P<OP>\*\*|//|<=|>=|==|!=|\^\{|_\{|[-+*/%<>=&\[\](),;{}])
""", re.VERBOSE)

_COMPARE = ("<", "<=", ">", ">=", "==", "!=")

MAX_DEPTH = 64
"""How deeply constructs may nest: every parenthesis, function call, subscript, unary minus, `**` exponent
and inner loop nest opens one level. Deeper input is a `ParseError`, not a `RecursionError`. One level
costs the parser up to 8 Python frames (a subscript passes through every precedence level), so 64 levels
need about 520 frames and leave room under Python's default recursion limit of 1000 for a deep caller and
for recursive passes over the tree. The reference corpus nests at most 8 levels."""


def tokenize(text: str) -> list[tuple[str, str, int]]:
    """Split LEIR text into (kind, text, position) tokens, ending with an EOF token."""
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ParseError(f"unexpected character {text[pos]!r}", pos, text)
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(), pos))
        pos = match.end()
    tokens.append(("EOF", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    # -- token helpers -------------------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> tuple[str, str, int]:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def at(self, value: str, ahead: int = 0) -> bool:
        kind, text, _ = self.peek(ahead)
        return kind == "OP" and text == value

    def fail(self, expected: str) -> ParseError:
        kind, text, pos = self.peek()
        found = "end of input" if kind == "EOF" else repr(text)
        return ParseError(f"expected {expected}, found {found}", pos, self.text)

    def enter(self, what: str) -> None:
        """Open one nesting level at the current token; `leave` closes it."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError(f"{what} nested too deeply (more than {MAX_DEPTH} levels)", self.peek()[2],
                             self.text)

    def leave(self) -> None:
        self.depth -= 1

    def expect(self, value: str) -> None:
        if not self.at(value):
            raise self.fail(repr(value))
        self.i += 1

    def ident(self, what: str) -> tuple[str, int]:
        kind, text, pos = self.peek()
        if kind != "IDENT":
            raise self.fail(what)
        self.i += 1
        return text, pos

    def integer(self, what: str) -> int:
        kind, text, _ = self.peek()
        if kind != "NUMBER" or not text.isdigit():
            raise self.fail(what)
        self.i += 1
        return int(text)

    # -- program structure ---------------------------------------------------------------------------
    def program(self) -> tuple[Nest, ...]:
        nests = []
        while self.peek()[0] != "EOF":
            nests.append(self.nest())
        if not nests:
            raise self.fail("a loop nest")
        return tuple(nests)

    def nest(self) -> Nest:
        loops, body = self.segment()
        while not self.at(";"):
            if not (self.at("[") or (self.peek()[1] in LOOP_KINDS and self.at("^{", 1))):
                raise self.fail("';' to end the nest, or the loops of a trailing inner nest")
            inner_loops, inner_body = self.segment()
            body.append(Nest(inner_loops, tuple(inner_body), trailing=True))
        self.expect(";")
        return Nest(loops, tuple(body))

    def segment(self) -> tuple[tuple[Loop, ...], list[Statement]]:
        """`loops [ statements ]`: the part of a nest up to its closing bracket."""
        loops = []
        while not self.at("["):
            loops.append(self.loop())
        self.expect("[")
        body = [self.statement(first=True)]
        while not self.at("]"):
            body.append(self.statement())
        self.expect("]")
        return tuple(loops), body

    def at_loop(self) -> bool:
        kind, text, _ = self.peek()
        return kind == "IDENT" and text in LOOP_KINDS and self.at("^{", 1) and self.peek(2)[0] == "NUMBER"

    def statement(self, first: bool = False) -> Statement:
        if self.at_loop():
            self.enter("loop nests")
            inner = self.nest()
            self.leave()
            return inner
        if self.peek()[0] != "IDENT" or not self.at("^{", 1):
            raise self.fail("an equation 'Name^{dtype,scope}...=...;' or an inner loop nest"
                            + ("" if first else ", or ']'"))
        return self.equation()

    def loop(self) -> Loop:
        kind, text, _ = self.peek()
        if kind != "IDENT" or text not in LOOP_KINDS or not self.at("^{", 1):
            raise self.fail("a loop 'K^{extent}_{var=0}' with K in L,P,V,U,B, or '['")
        self.i += 2
        extent = self.integer("a loop extent (a positive integer)")
        if extent <= 0:
            raise ParseError("a loop extent must be positive", self.peek(-1)[2], self.text)
        self.expect("}")
        self.expect("_{")
        var, _ = self.ident("a loop variable name")
        self.expect("=")
        start_pos = self.peek()[2]
        if self.integer("the loop start 0") != 0:
            raise ParseError("loops must start at 0", start_pos, self.text)
        self.expect("}")
        return Loop(text, extent, var)

    def equation(self) -> Equation:
        kind, _, _ = self.peek()
        if kind != "IDENT" or not self.at("^{", 1):
            raise self.fail("an equation 'Name^{dtype,scope}...=...;', an inner loop nest, or ']'")
        lhs = self.access()
        self.expect("=")
        rhs = self.expr()
        self.expect(";")
        return Equation(lhs, rhs)

    def access(self) -> Access:
        name, _ = self.ident("a tensor name")
        self.expect("^{")
        code, code_pos = self.ident("a dtype code")
        if code not in CODE_TO_DTYPE:
            raise ParseError(f"unknown dtype code {code!r} (known: {', '.join(CODE_TO_DTYPE)})", code_pos,
                             self.text)
        self.expect(",")
        scope, scope_pos = self.ident("a storage scope (g, s or l)")
        if scope not in SCOPES:
            raise ParseError(f"unknown storage scope {scope!r} (known: g, s, l)", scope_pos, self.text)
        self.expect("}")
        indices: list[Expr] = []
        if self.at("_{"):
            self.enter("expression")
            self.i += 1
            indices.append(self.expr())
            while self.at(","):
                self.i += 1
                indices.append(self.expr())
            self.expect("}")
            self.leave()
        return Access(name, CODE_TO_DTYPE[code], scope, tuple(indices))

    # -- expressions ---------------------------------------------------------------------------------
    def expr(self) -> Expr:
        node = self.comparison()
        while self.at("&"):
            self.i += 1
            node = And(node, self.comparison())
        return node

    def comparison(self) -> Expr:
        first = self.arith()
        operands, ops = [first], []
        while self.peek()[0] == "OP" and self.peek()[1] in _COMPARE:
            ops.append(self.peek()[1])
            self.i += 1
            operands.append(self.arith())
        return Compare(tuple(operands), tuple(ops)) if ops else first

    def arith(self) -> Expr:
        node = self.term()
        while self.at("+") or self.at("-"):
            op = self.peek()[1]
            self.i += 1
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Expr:
        node = self.unary()
        while any(self.at(op) for op in ("*", "/", "//", "%")):
            op = self.peek()[1]
            self.i += 1
            node = BinOp(op, node, self.unary())
        return node

    def unary(self) -> Expr:
        if self.at("-"):
            self.enter("expression")
            self.i += 1
            node = Neg(self.unary())
            self.leave()
            return node
        return self.power()

    def power(self) -> Expr:
        base = self.atom()
        if self.at("**"):
            self.enter("expression")
            self.i += 1
            node = BinOp("**", base, self.unary())
            self.leave()
            return node
        return base

    def atom(self) -> Expr:
        kind, text, pos = self.peek()
        if kind == "NUMBER":
            self.i += 1
            is_int = text.isdigit()
            return Const(int(text) if is_int else float(text), text)
        if self.at("("):
            self.enter("expression")
            self.i += 1
            inner = self.expr()
            self.expect(")")
            self.leave()
            return replace(inner, parens=inner.parens + 1)
        if kind != "IDENT":
            raise self.fail("an expression (number, tensor access, loop variable, function call or '(')")
        if self.at("^{", 1):
            return self.access()
        if self.at("(", 1):
            if text not in FUNCTIONS:
                raise ParseError(f"unknown function {text!r} (known: {', '.join(FUNCTIONS)})", pos, self.text)
            self.enter("expression")
            self.i += 2
            args = [self.expr()]
            while self.at(","):
                self.i += 1
                args.append(self.expr())
            if len(args) != FUNCTIONS[text]:
                raise ParseError(f"{text} takes {FUNCTIONS[text]} argument(s), got {len(args)}", pos, self.text)
            self.expect(")")
            self.leave()
            return Call(text, tuple(args))
        self.i += 1
        if text == "inf":
            return Const(float("inf"), "inf")
        return Var(text)


def parse_nests(text: str) -> tuple[Nest, ...]:
    """Parse a whole LEIR program into its nests; raises `ParseError` with position and expectation."""
    return _Parser(text).program()


def parse_expr(text: str) -> Expr:
    """Parse a single LEIR expression (used by tests and by strategies that build expressions)."""
    parser = _Parser(text)
    node = parser.expr()
    if parser.peek()[0] != "EOF":
        raise parser.fail("end of expression")
    return node
