"""One exception hierarchy for the whole package.

Every error a user can provoke with bad input is a `StepTPError`, so callers can catch one type and still
read a specific, actionable message.
"""
from __future__ import annotations


class StepTPError(Exception):
    """Base class of every error steptp_env raises on purpose."""


class ParseError(StepTPError):
    """Malformed LEIR text: carries the character position and what was expected there."""

    def __init__(self, message: str, position: int, text: str = "") -> None:
        self.message = message
        self.position = position
        self.text = text
        excerpt = ""
        if text:
            lo = max(0, position - 20)
            excerpt = f" near {text[lo:position]!r} <here> {text[position:position + 20]!r}"
        super().__init__(f"at character {position}: {message}{excerpt}")


class SignatureError(StepTPError):
    """A program that parses but does not agree with its signature (or with itself).

    `kind` names the class of problem (``undefined-name``, ``rank-mismatch``, ``read-before-write``,
    ``out-of-bounds``, ``inconsistent-shape``, ``dtype-mismatch``, ``output-not-written``, ...), `tensor` the
    tensor (or loop variable) concerned, `nest` the index of the nest where it was found.
    """

    def __init__(self, kind: str, message: str, tensor: str | None = None, nest: int | None = None) -> None:
        self.kind = kind
        self.tensor = tensor
        self.nest = nest
        where = f" (nest {nest})" if nest is not None else ""
        super().__init__(f"{kind}: {message}{where}")


class LoweringError(StepTPError):
    """A valid program that cannot be lowered to TIR for the requested target."""


class BuildError(StepTPError):
    """TVM failed to compile a lowered module."""


class IllegalActionError(StepTPError):
    """An action that does not apply to the program it was given; the message says why."""
