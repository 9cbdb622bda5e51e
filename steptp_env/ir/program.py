"""`Program`, `Signature` and `TensorSpec`: a parsed LEIR program together with the tensors it exchanges."""
from __future__ import annotations

import json
import math
import operator
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Mapping

from ..errors import SignatureError
from .ast import Nest
from .dtypes import CODE_TO_DTYPE, dtype_bytes
from .parser import parse_nests
from .printer import print_nests

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")

ROLES = ("input", "param", "output")
"""`input`: data fed by the caller; `param`: a model parameter or constant (also fed by the caller);
`output`: written by the program. Inputs and params come first, in TIR parameter order."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor the program exchanges with its caller."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str = "input"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise SignatureError("bad-signature", f"tensor name {self.name!r} is not a LEIR identifier",
                                 self.name if isinstance(self.name, str) else None)
        if self.role not in ROLES:
            raise SignatureError("bad-signature", f"role {self.role!r} is not one of {ROLES}", self.name)
        if self.dtype not in CODE_TO_DTYPE.values():
            raise SignatureError("bad-signature", f"unknown dtype {self.dtype!r}", self.name)
        if any((not isinstance(d, int)) or d <= 0 for d in self.shape):
            raise SignatureError("bad-signature", f"shape {self.shape} must hold positive integers", self.name)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        if not isinstance(data, Mapping):
            raise SignatureError("bad-signature", f"a tensor spec must be a mapping, got {data!r}")
        try:
            name, shape = data["name"], data["shape"]
            if not isinstance(name, str):
                raise TypeError(f"name {name!r} is not a string")
            dims = () if isinstance(shape, (str, bytes)) else tuple(shape)
            if isinstance(shape, (str, bytes)) or any(isinstance(d, bool) for d in dims):
                raise TypeError(f"shape {shape!r} is not a sequence of integers")
            return cls(name, tuple(operator.index(d) for d in dims), str(data["dtype"]),
                       str(data.get("role", "input")))
        except (KeyError, TypeError, ValueError) as exc:
            raise SignatureError("bad-signature", f"malformed tensor spec {data!r}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "role": self.role}


@dataclass(frozen=True, slots=True)
class Signature:
    """The ordered known tensors of a program: inputs and params, then outputs."""

    tensors: tuple[TensorSpec, ...]

    def __post_init__(self) -> None:
        names = [t.name for t in self.tensors]
        for name in names:
            if names.count(name) > 1:
                raise SignatureError("bad-signature", "tensor listed twice in the signature", name)
        if not any(t.role == "output" for t in self.tensors):
            raise SignatureError("bad-signature", "the signature has no output tensor")

    @classmethod
    def of(cls, specs: Signature | Iterable[TensorSpec | Mapping[str, Any]] | str) -> Signature:
        """Accept a Signature, a list of specs or dicts, or their JSON text."""
        if isinstance(specs, Signature):
            return specs
        if isinstance(specs, str):
            try:
                specs = json.loads(specs)
            except json.JSONDecodeError as exc:
                raise SignatureError("bad-signature", f"signature is not valid JSON: {exc}") from None
        if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Iterable):
            raise SignatureError("bad-signature", f"a signature must be a list of tensor specs, got {specs!r}")
        return cls(tuple(s if isinstance(s, TensorSpec) else TensorSpec.from_dict(s) for s in specs))

    def __getitem__(self, name: str) -> TensorSpec:
        for spec in self.tensors:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(spec.name == name for spec in self.tensors)

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """Everything the caller provides (inputs and params), in parameter order."""
        return tuple(t for t in self.tensors if t.role != "output")

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if t.role == "output")

    def to_json(self) -> list[dict[str, Any]]:
        return [t.to_dict() for t in self.tensors]


@dataclass(frozen=True)
class Program:
    """A LEIR program: its nests and its signature, checked against each other on construction."""

    nests: tuple[Nest, ...]
    signature: Signature
    validate: bool = field(default=True, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.validate:
            _ = self.tensors  # runs the checks

    @classmethod
    def parse(cls, text: str, signature: Signature | Iterable[Any] | str, validate: bool = True) -> Program:
        """Parse LEIR text; `ParseError` for malformed text, `SignatureError` for disagreement with the signature."""
        return cls(parse_nests(text), Signature.of(signature), validate)

    @cached_property
    def leir(self) -> str:
        """The canonical LEIR text."""
        return print_nests(self.nests)

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor of the program (signature tensors and intermediates) with shape, dtype and scope."""
        from .validate import check_program

        return check_program(self.nests, self.signature)

    @property
    def intermediates(self) -> dict[str, TensorInfo]:
        return {n: t for n, t in self.tensors.items() if t.role == "intermediate"}

    def replace_nests(self, nests: Iterable[Nest]) -> Program:
        return Program(tuple(nests), self.signature)

    def __str__(self) -> str:
        return self.leir


def tensor_bytes(tensor: TensorSpec | TensorInfo) -> int:
    """Bytes a tensor (a signature spec or an analysed tensor) takes: elements times its dtype's width
    (`bool` 1 byte)."""
    return math.prod(tensor.shape) * dtype_bytes(tensor.dtype)


def program_bytes(program: Program) -> int:
    """Bytes of all of a program's tensors, intermediates included: what its kernel holds at once."""
    return sum(map(tensor_bytes, program.tensors.values()))


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """What the analysis knows about one tensor: shape (inferred for intermediates), dtype, scope, role."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str
    role: str
