"""The LEIR abstract syntax tree: frozen, slotted dataclasses with tuple children.

Nodes compare and hash structurally. Two fields never take part in equality: the source spelling of a
number (`Const.text`) and how many redundant parentheses surrounded a node in the source (`parens`). They
exist only so that the printer reproduces the input text exactly; `(c+512)+f` and `c+512+f` are the same
tree.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator, Union

LOOP_KINDS = ("L", "P", "V", "U", "B")
"""Serial, parallel, vectorized, unrolled, bound to a GPU axis."""

BINARY_OPS = ("+", "-", "*", "/", "//", "%", "**")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
FUNCTIONS = {"exp": 1, "log": 1, "sqrt": 1, "abs": 1, "erf": 1, "max": 2, "min": 2, "if_then_else": 3}
"""Function name -> number of arguments."""

SCOPES = {"g": "global", "s": "shared", "l": "local"}


@dataclass(frozen=True, slots=True)
class Const:
    """A numeric literal (`inf` is the float infinity)."""

    value: int | float
    text: str = field(default="", compare=False)
    parens: int = field(default=0, compare=False)

    @property
    def is_int(self) -> bool:
        return isinstance(self.value, int)


@dataclass(frozen=True, slots=True)
class Var:
    """A loop variable used as an index or as a value."""

    name: str
    parens: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Access:
    """`Name^{dtype,scope}_{i,j,...}`: a tensor element; no indices means a 0-d tensor."""

    name: str
    dtype: str
    scope: str
    indices: tuple[Expr, ...] = ()
    parens: int = field(default=0, compare=False)

    @property
    def rank(self) -> int:
        return len(self.indices)


@dataclass(frozen=True, slots=True)
class Neg:
    """Unary minus."""

    operand: Expr
    parens: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class BinOp:
    """`lhs op rhs` for op in `+ - * / // % **` (Python semantics: `/` is true division)."""

    op: str
    lhs: Expr
    rhs: Expr
    parens: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Compare:
    """A comparison chain `e0 op0 e1 op1 e2 ...`, true when every adjacent pair holds (`2<=c<258`)."""

    operands: tuple[Expr, ...]
    ops: tuple[str, ...]
    parens: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class And:
    """Logical conjunction `lhs & rhs` (binds weaker than comparisons in LEIR)."""

    lhs: Expr
    rhs: Expr
    parens: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Call:
    """One of the built-in functions in `FUNCTIONS`."""

    func: str
    args: tuple[Expr, ...]
    parens: int = field(default=0, compare=False)


Expr = Union[Const, Var, Access, Neg, BinOp, Compare, And, Call]


@dataclass(frozen=True, slots=True)
class Loop:
    """`K^{extent}_{var=0}`: a loop from 0 to extent-1 with step 1."""

    kind: str
    extent: int
    var: str


@dataclass(frozen=True, slots=True)
class Equation:
    """`lhs=rhs;`: one store executed in every iteration of the enclosing loops."""

    lhs: Access
    rhs: Expr


@dataclass(frozen=True, slots=True)
class Nest:
    """Loops around a body that runs its statements in order in every iteration.

    A statement is an equation or an inner nest (flash-attention style programs nest a loop inside the body
    of another). `trailing` only records how the reference wrote an inner nest: after the closing bracket of
    its parent (`L^{2}_{c=0}[D=0;]L^{3}_{d=0}[D=D+...;];`) instead of inside it; the meaning is the same.
    """

    loops: tuple[Loop, ...]
    body: tuple[Statement, ...]
    trailing: bool = field(default=False, compare=False)

    @property
    def loop_vars(self) -> tuple[str, ...]:
        return tuple(loop.var for loop in self.loops)

    def loop(self, var: str) -> Loop:
        for loop in self.loops:
            if loop.var == var:
                return loop
        raise KeyError(var)


Statement = Union[Equation, "Nest"]


def equations(nest: Nest, outer: tuple[Loop, ...] = ()) -> Iterator[tuple[tuple[Loop, ...], Equation]]:
    """Every equation of a nest with all loops around it (outermost first), in execution order."""
    loops = outer + nest.loops
    for stmt in nest.body:
        if isinstance(stmt, Nest):
            yield from equations(stmt, loops)
        else:
            yield loops, stmt


def all_loops(nest: Nest) -> Iterator[Loop]:
    """Every loop of a nest, inner nests included, in source order."""
    yield from nest.loops
    for stmt in nest.body:
        if isinstance(stmt, Nest):
            yield from all_loops(stmt)


def children(expr: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of a node, in source order."""
    kind = type(expr)  # the node classes are final: exact type tests are the fast path of every traversal
    if kind is BinOp or kind is And:
        return (expr.lhs, expr.rhs)
    if kind is Access:
        return expr.indices
    if kind is Call:
        return expr.args
    if kind is Neg:
        return (expr.operand,)
    if kind is Compare:
        return expr.operands
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Pre-order traversal of an expression tree."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        kids = children(node)
        if kids:
            stack.extend(reversed(kids))


def free_vars(expr: Expr) -> tuple[str, ...]:
    """Loop variables an expression mentions, in order of first appearance."""
    seen: dict[str, None] = {}
    for node in walk(expr):
        if isinstance(node, Var):
            seen.setdefault(node.name, None)
    return tuple(seen)


def accesses(expr: Expr) -> list[Access]:
    """Every tensor access inside an expression (index tensors inside subscripts included), in pre-order.
    The analyses call this more than anything else, so it walks the tree itself instead of through `walk`."""
    found = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if type(node) is Access:
            found.append(node)
        kids = children(node)
        if kids:
            stack.extend(reversed(kids))
    return found


def map_children(expr: Expr, fn) -> Expr:
    """The same node with `fn` applied to each direct child (the node itself when it has none)."""
    kids = children(expr)
    if not kids:
        return expr
    new = tuple(fn(k) for k in kids)
    if isinstance(expr, Access):
        return replace(expr, indices=new)
    if isinstance(expr, Neg):
        return replace(expr, operand=new[0])
    if isinstance(expr, (BinOp, And)):
        return replace(expr, lhs=new[0], rhs=new[1])
    if isinstance(expr, Compare):
        return replace(expr, operands=new)
    return replace(expr, args=new)


def replace_accesses(expr: Expr, fn) -> Expr:
    """Rebuild an expression bottom-up, replacing every access `a` (after rewriting its subscripts) by
    `fn(a)`."""
    rebuilt = map_children(expr, lambda k: replace_accesses(k, fn))
    return fn(rebuilt) if isinstance(rebuilt, Access) else rebuilt


def rename_var(expr: Expr, old: str, new: str) -> Expr:
    """`expr` with loop variable `old` renamed to `new`."""
    if isinstance(expr, Var):
        return Var(new, expr.parens) if expr.name == old else expr
    return map_children(expr, lambda k: rename_var(k, old, new))
