"""Reading what an LLM policy sends in text mode.

Three forms are accepted: an action text (`loop_split(nest=0, loop=c, factor=32)`); a Step-TP answer, the
JSON object `{"transformed_IR": ..., "applied_strategy": ...}`; and that JSON wrapped in
`<think>...</think><answer>...</answer>` (the reasoning is kept, not interpreted). Anything else is a
`Proposal` with an error saying what was wrong, never an exception.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..errors import StepTPError
from ..strategies import Action

_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
_ACTION = re.compile(r"^\s*[a-z_]+\s*\(.*\)\s*$", re.S)


@dataclass(frozen=True)
class Proposal:
    """One text action, read: either an `action`, or a `program` text (with the strategy the answer
    claims), or an `error`."""

    action: Action | None = None
    program: str | None = None
    claimed_strategy: str | None = None
    reasoning: str | None = None
    error: str | None = None


def read_proposal(text: object) -> Proposal:
    if not isinstance(text, str):
        return Proposal(error=f"text mode expects a string action, got {type(text).__name__}")
    think = _THINK.search(text)
    reasoning = think.group(1).strip() if think else None
    answer = _ANSWER.search(text)
    body = (answer.group(1) if answer else text).strip()
    if body.startswith("```"):  # a fenced block: drop the fence lines
        body = "\n".join(line for line in body.splitlines() if not line.startswith("```")).strip()
    if body.startswith("{"):
        return _read_json(body, reasoning)
    if _ACTION.match(body):
        try:
            return Proposal(action=Action.parse(body.strip()), reasoning=reasoning)
        except StepTPError as exc:
            return Proposal(error=f"cannot read the action text: {exc}", reasoning=reasoning)
    return Proposal(error="expected an action text such as `loop_split(nest=0, loop=c, factor=32)` or a JSON "
                    "answer with `transformed_IR` and `applied_strategy`", reasoning=reasoning)


def _read_json(body: str, reasoning: str | None) -> Proposal:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return Proposal(error=f"the answer is not valid JSON: {exc}", reasoning=reasoning)
    if not isinstance(data, dict) or not isinstance(data.get("transformed_IR"), str):
        return Proposal(error="the answer JSON needs a string `transformed_IR`", reasoning=reasoning)
    claimed = data.get("applied_strategy")
    if isinstance(claimed, list):  # multi-label rows name several
        claimed = ",".join(map(str, claimed))
    return Proposal(program=data["transformed_IR"], claimed_strategy=None if claimed is None else str(claimed),
                    reasoning=reasoning)
