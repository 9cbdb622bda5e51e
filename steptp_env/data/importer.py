"""Importing Step-TP chat rows as one-step trajectories.

A Step-TP row's user turn names the model, quotes the program, and lists the known variables as
`'A' with the dtype torch.float64 and shape [128, 10]`; its assistant turn ends in the JSON answer. The
importer rebuilds the signature (a known variable the program writes is an output, the others inputs, in
the order the prompt lists them, which is the reference's parameter order), parses both programs, labels
the step with `identify` (it must find an action of the claimed strategy), and verifies the transformed
program against the original one (a row that fails says why; one whose answer only respells the prompt's
program, as the reference's algebraic rows often do, is named as such). Accepted rows become `step` records
of our trajectory format (workload `steptp-ref/<model>`), so they export like our own; `replay_target` turns
one into the `Workload` and `EnvState` the replay agent takes.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import psutil

from ..env.answer import read_proposal
from ..errors import StepTPError
from ..frontend.workload import Workload
from ..ir.analysis import loop_iterations
from ..ir.ast import all_loops, equations
from ..ir.program import Program, program_bytes, tensor_bytes
from ..measure import Protocol, random_inputs
from ..strategies import REGISTRY, Action, get_strategy, identify
from ..strategies.algebraic import cosmetic_key
from .records import JsonlWriter
from .verification import Checked, check_many

_PROMPT = re.compile(r"IR of (?P<model>[^:]+): '(?P<leir>[^']+)', where the known variables are (?P<vars>.*?)\. "
                     r"Do not change", re.S)
_VARIABLE = re.compile(r"'(?P<name>\w+)' with the dtype torch\.(?P<dtype>\w+) and shape \[(?P<shape>[\d, ]*)\]")
_WRITES = re.compile(r"(?:^|[\[;])(\w+)\^\{[^}]*\}(?:_\{[^}]*\})?=")
PREFIX = "steptp-ref/"
STATUSES = ("ok", "failed", "unverified", "unimplemented")


@dataclass
class Imported:
    """One row's outcome: `status` is one of `STATUSES`: `ok`, `failed` (with `reason`), `unverified` (parsed
    and identified, but too large to verify under `max_iterations`) or `unimplemented` (its strategy has no
    implementation here); `record` is the step record of an accepted row."""

    row: int
    strategy: str | None
    status: str
    reason: str = ""
    record: dict[str, Any] | None = None


def parse_steptp_prompt(text: str) -> tuple[str, Program]:
    """(model name, program) of a Step-TP user turn."""
    match = _PROMPT.search(text)
    if match is None:
        raise ValueError("not a Step-TP prompt (no \"IR of <model>: '...', where the known variables are\")")
    written = set(_WRITES.findall(match["leir"]))
    signature = [{"name": v["name"], "dtype": v["dtype"], "role": "output" if v["name"] in written else "input",
                  "shape": [int(d) for d in v["shape"].split(",") if d.strip()]}
                 for v in _VARIABLE.finditer(match["vars"])]
    return match["model"].strip(), Program.parse(match["leir"], signature)


def _label(number: int, row: dict[str, Any]) -> tuple[Imported, tuple | None]:
    """Parse and identify one row; the (model, before, after, action) left to verify, if it got that far."""
    messages = row["messages"]
    proposal = read_proposal(messages[-1]["content"])
    strategy = proposal.claimed_strategy
    if proposal.error:
        return Imported(number, strategy, "failed", f"answer: {proposal.error}"), None
    if strategy not in REGISTRY:
        return Imported(number, strategy, "unimplemented", f"{strategy} is not implemented here"), None
    try:
        model, before = parse_steptp_prompt(next(m["content"] for m in messages if m["role"] == "user"))
        after = Program.parse(proposal.program, before.signature)
    except (ValueError, StepTPError) as exc:
        return Imported(number, strategy, "failed", f"does not parse: {exc}"), None
    found = identify(before, after)
    mine = [a for a in found if a.strategy == strategy]
    if not mine:
        return Imported(number, strategy, "failed", _miss(before, after, found)), None
    return Imported(number, strategy, "ok"), (model, before, after, mine[0])


def _equation_keys(program: Program) -> list[tuple]:
    return [(loops, cosmetic_key(eq.lhs), cosmetic_key(eq.rhs))
            for nest in program.nests for loops, eq in equations(nest)]


def _miss(before: Program, after: Program, found: list[Action]) -> str:
    """Why `identify` found no action of the claimed strategy. The reference labels some respellings as
    algebraic rewrites (`1e-05` -> `1.0e-5`, `x*(y/z)` -> `x*y/z`): those are named as such, since no
    strategy here offers a change that only respells."""
    if found:
        return f"identify finds {', '.join(sorted({a.strategy for a in found}))} instead"
    if _equation_keys(before) == _equation_keys(after):
        return ("cosmetic only: the answer only respells numbers, reorders operands or regroups a product of "
                "the prompt's program (the reference's bug)")
    changed = [str(i) for i, (one, two) in enumerate(zip(before.nests, after.nests)) if one != two]
    where = f" (changed nests: {', '.join(changed)})" if len(before.nests) == len(after.nests) else ""
    return "no single action explains the change" + where


def _record(number: int, model: str, before: Program, after: Program, action, report: dict[str, Any]) -> dict[str, Any]:
    dtype = before.signature.outputs[0].dtype
    episode = f"{PREFIX}{number}"
    return {"kind": "step", "episode": episode, "step": 1, "key": episode, "workload": PREFIX + model,
            "preset": None, "dtype": dtype, "target": "llvm", "action": action.text, "index": None,
            "strategy": action.strategy, "before": {"leir": before.leir, "signature": before.signature.to_json()},
            "after": {"leir": after.leir, "signature": after.signature.to_json()},
            "explain": get_strategy(action.strategy).explain(before, action, after), "verify": report,
            "runtime_before_s": None, "runtime_after_s": None, "source_before": None, "source_after": None,
            "reward": None, "error": None, "terminated": False, "truncated": False, "obs_before": None,
            "obs_after": None}


SINGLE_DRAW_ITERATIONS = 1e10
"""Rows whose programs run more loop iterations are verified on one input draw instead of the protocol's
`trials`, one row at a time: each draw runs for minutes and holds another copy of inputs of gigabytes."""
SLOWEST_RATE = 1e8
"""Loop iterations per second a verification run is allowed at the least: a large row's run timeout grows
with its size beyond the protocol's."""
MEMORY_FRACTION = 0.75
"""A row is verified only if its estimated peak (`_peak_bytes`) takes at most this fraction
of the machine's memory."""


def _peak_bytes(before: Program, after: Program) -> int:
    """The memory verification needs at once, counted generously: in the worker, one program's tensors
    (intermediates included: the kernel allocates them), the inputs it was sent and the outputs it sends
    back; here, one input draw, the program's outputs and the reference's. Draws are checked one at a
    time and the worker is restarted after a large row (`verification.RELEASE_BYTES`), so nothing else
    stays alive."""
    return (max(program_bytes(before), program_bytes(after))
            + 3 * sum(map(tensor_bytes, before.signature.tensors)))


def import_rows(rows: Iterable[dict[str, Any]], workers: int = 1, max_iterations: int | None = None,
                protocol: Protocol | None = None, checked: Checked | None = None) -> list[Imported]:
    """Import chat rows (see the module docstring). Rows whose programs run more than `max_iterations`
    loop iterations, or whose tensors need more memory than this machine can give (`MEMORY_FRACTION`), are
    labelled but not verified (`unverified`), and not accepted. `checked(done, total)` follows the
    verification of the rows that are small enough for several at once (the large ones come after)."""
    protocol = protocol or Protocol(threads=1)
    memory = psutil.virtual_memory().total
    results, todo, large = [], [], []
    for number, row in enumerate(rows):
        result, pending = _label(number, row)
        results.append(result)
        if pending is None:
            continue
        size = max(loop_iterations(pending[1].nests), loop_iterations(pending[2].nests))
        data = _peak_bytes(pending[1], pending[2])
        if max_iterations is not None and size > max_iterations:
            result.status, result.reason = "unverified", f"too large to verify here ({size:.2e} loop iterations)"
        elif data > memory * MEMORY_FRACTION:
            result.status, result.reason = "unverified", (f"too large to verify here (needs about "
                                                          f"{data / 2 ** 30:.1f} GiB, {memory / 2 ** 30:.0f} GiB "
                                                          "of memory)")
        else:
            (large if size > SINGLE_DRAW_ITERATIONS else todo).append((result, pending, size))
    reports = check_many([(after, before) for _, (_, before, after, _), _ in todo], protocol=protocol,
                         workers=workers, checked=checked)
    for _, (_, before, after, _), size in large:
        slow = replace(protocol, trials=1, run_timeout=max(protocol.run_timeout, size / SLOWEST_RATE))
        reports += check_many([(after, before)], protocol=slow)
    for (result, (model, before, after, action), _), report in zip(todo + large, reports):
        if report.get("equivalent"):
            result.record = _record(result.row, model, before, after, action, report)
        else:
            result.status, result.reason = "failed", f"not equivalent: {report.get('reason')}"
    return results


def import_file(path: Path | str, out: Path | str | None = None, **options: Any) -> list[Imported]:
    """Import a JSONL file of chat rows; with `out`, write the accepted rows as a trajectory file."""
    path = Path(path)
    data = path.read_bytes()
    results = import_rows((json.loads(line) for line in data.decode().splitlines() if line.strip()), **options)
    if out is not None:
        Path(out).unlink(missing_ok=True)
        created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        config = {"imported_from": path.name, "sha256": hashlib.sha256(data).hexdigest(), "target": "llvm"}
        from ..measure.runner import versions

        with JsonlWriter(out, {"config": config, "versions": versions(), "created": created}) as writer:
            for result in results:
                if result.record is not None:
                    writer.write(result.record)
    return results


class ProgramWorkload(Workload):
    """A workload whose reference is a program rather than a PyTorch module (an imported row's
    original): inputs are `random_inputs` of the program, and the reference runs its built kernel."""

    def __init__(self, uri: str, program: Program) -> None:
        origin = {s.name: ("input", i) for i, s in enumerate(program.signature.inputs)}
        super().__init__(uri, program, None, origin, {}, {}, None)
        self._kernel = None

    def make_inputs(self, seed: int) -> dict[str, np.ndarray]:
        return random_inputs(self.program, seed)

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._kernel is None:
            from ..measure import build

            self._kernel = build(self.program)
        return self._kernel(inputs)


def replay_target(record: dict[str, Any]):
    """(workload, state) for an imported step, for `agents.replay.run`: make the env with the workload,
    `target=state.target` (`cuda` for programs with GPU-bound loops, whose candidates `identify` drew from
    the GPU menu; model mode, which needs no device) and `action_mode="text"` so any candidate rank
    replays."""
    from ..env import EnvState

    before = Program.parse(record["before"]["leir"], record["before"]["signature"])
    workload = ProgramWorkload(record["workload"], before)
    bound = any(loop.kind == "B" for nest in before.nests for loop in all_loops(nest))
    state = EnvState(workload.uri, None, "cuda" if bound else "llvm", "model", record["dtype"],
                     actions=[record["action"]])
    return workload, state
