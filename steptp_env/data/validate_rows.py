"""Re-validating exported rows from their text alone.

For every answer of a row: the prompt's program parses, the answer's program parses against the same
signature, `identify` finds an action of the claimed `applied_strategy` that turns the previous program
into it (an `action`-style row's answer is an action text, applied to the prompt's program instead), and
it verifies numerically equivalent to the workload's reference (the suite workload named by the row; for a
row whose workload is not in the suite, such as an imported one, the prompt's program).
In a conversation each answer starts from the previous one. Runs as `python -m steptp_env.data.validate_rows
FILE` or `steptp validate-rows FILE`.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import StepTPError
from ..ir.program import Program
from ..measure import Protocol
from ..strategies import Action, apply_action, identify
from .prompts import parse_prompt
from .verification import Checked, check_many

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


@dataclass
class RowCheck:
    """The outcome for one row: `errors` is empty when every answer passed."""

    id: str
    answers: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def parse_answers(content: str, program: Program | None = None) -> list[tuple[str, str]]:
    """(transformed_IR, applied_strategy) of an assistant turn; [] for `stop()`. A list answer (a
    multi-label row) gives one pair per entry; with `program`, the answer is an action text applied to it."""
    match = _ANSWER.search(content)
    if match is None:
        raise ValueError("no <answer>...</answer>")
    body = match.group(1).strip()
    if body == "stop()":
        return []
    if program is not None:
        action = Action.parse(body)
        return [(apply_action(program, action).leir, action.strategy)]
    data = json.loads(body)
    entries = data if isinstance(data, list) else [data]
    return [(e["transformed_IR"], e["applied_strategy"]) for e in entries]


class _References:
    """The reference of a row's workload: the suite workload, loaded once per (uri, preset, dtype)."""

    def __init__(self) -> None:
        from ..workloads import list_workloads

        self.suite = set(list_workloads())
        self.loaded: dict[tuple, Any] = {}

    def get(self, row: dict[str, Any], program: Program):
        if row.get("workload") not in self.suite:
            return program
        key = (row["workload"], row.get("preset"), row.get("dtype") or "float32")
        if key not in self.loaded:
            from ..workloads import get_workload

            self.loaded[key] = get_workload(key[0], preset=key[1], dtype=key[2])
        return self.loaded[key]


def _plan(row: dict[str, Any], result: RowCheck, references: _References) -> list[tuple[int, Program, Any]]:
    """Parse and identify the answers of a row (errors into `result`); the programs left to verify."""
    messages = row["messages"]
    user = next(m["content"] for m in messages if m["role"] == "user")
    start = parse_prompt(user)
    reference = references.get(row, start)
    chained = row.get("kind") == "trajectory"
    current, claimed, todo = start, [], []
    for turn in (m for m in messages if m["role"] == "assistant"):
        for leir, strategy in parse_answers(turn["content"], current if row.get("style") == "action" else None):
            number = result.answers = result.answers + 1
            claimed.append(strategy)
            try:
                after = Program.parse(leir, current.signature)
            except StepTPError as exc:
                result.errors.append(f"answer {number}: does not parse: {exc}")
                continue
            found = sorted({a.strategy for a in identify(current, after)})
            if strategy not in found:
                result.errors.append(f"answer {number}: identify finds {found or 'no single action'}, "
                                     f"not {strategy}")
            todo.append((number, after, reference))
            if chained:
                current = after
    if row.get("strategies") is not None and list(row["strategies"]) != claimed:
        result.errors.append(f"strategies column {row['strategies']} differs from the answers' {claimed}")
    return todo


def validate_rows(rows: Iterable[dict[str, Any]], workers: int = 1, protocol: Protocol | None = None,
                  checked: Checked | None = None) -> list[RowCheck]:
    """Check every row (see the module docstring); verification runs `workers` builds at once and calls
    `checked(done, total)` after each answer's."""
    references = _References()
    results, todo = [], []
    for row in rows:
        result = RowCheck(str(row.get("id")))
        try:
            todo += [(result, *item) for item in _plan(row, result, references)]
        except (ValueError, KeyError, StepTPError) as exc:
            result.errors.append(f"unreadable row: {type(exc).__name__}: {exc}")
        results.append(result)
    reports = check_many([(program, reference) for _, _, program, reference in todo],
                         protocol=protocol or Protocol(threads=1), workers=workers, checked=checked)
    for (result, number, _, _), report in zip(todo, reports):
        if not report.get("equivalent"):
            result.errors.append(f"answer {number}: not equivalent to the reference: {report.get('reason')}")
    return results


def validate_file(path: Path | str, workers: int = 1, checked: Checked | None = None) -> list[RowCheck]:
    with open(path) as f:
        return validate_rows((json.loads(line) for line in f if line.strip()), workers, checked=checked)


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    failed = 0
    for path in paths:
        checks = validate_file(path)
        bad = [c for c in checks if not c.ok]
        failed += len(bad)
        print(f"{path}: {len(checks) - len(bad)}/{len(checks)} rows valid")
        for c in bad:
            print(f"  {c.id}: " + "; ".join(c.errors))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
