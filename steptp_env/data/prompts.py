"""The words of our chat rows: prompts, reasoning, answers, and the analysis facts they cite.

The answer format is Step-TP's (`<think>...</think><answer>{"transformed_IR": ..., "applied_strategy":
...}</answer>`), so models trained on either corpus read both; the prompts and the reasoning are our own.
A prompt states the program and its tensors in a fixed layout that `parse_prompt` reads back, so a row is
self-contained: its program can be checked without the generator's records.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, TypeVar

from ..ir.analysis import loop_iterations, reduction, scans
from ..ir.ast import all_loops, equations
from ..ir.program import Program

T = TypeVar("T")

SYSTEM_PROMPT = ("You are a compiler engineer who speeds up tensor programs written in LEIR, a one-line loop "
                 "notation. You change a program one atomic transformation at a time and never change what it "
                 "computes.")

ROLE_WORDS = {"input": "input", "param": "parameter", "output": "output"}
_WORD_ROLES = {v: k for k, v in ROLE_WORDS.items()}
_ANSWER_FORMAT = ('a JSON object with the keys "transformed_IR" (the complete rewritten program) and '
                  '"applied_strategy" (the name of the transformation)')
_PROGRAM = re.compile(r"^Program:\n(?P<leir>\S+)\n\nTensors[^\n]*:\n(?P<tensors>(?:- [^\n]+\n?)+)", re.M)
_TENSOR = re.compile(r"- (?P<name>\w+): (?P<role>\w+), (?P<dtype>\w+), shape \[(?P<shape>[\d, ]*)\]")


def describe_program(program: Program) -> str:
    """The program block of a prompt: the LEIR text, then one line per signature tensor."""
    lines = [f"- {t.name}: {ROLE_WORDS[t.role]}, {t.dtype}, shape [{', '.join(map(str, t.shape))}]"
             for t in program.signature.tensors]
    return ("Program:\n" + program.leir + "\n\nTensors it exchanges with its caller (names, shapes and dtypes "
            "are fixed):\n" + "\n".join(lines))


def parse_prompt(text: str) -> Program:
    """The program a prompt of ours states (the first program block in `text`)."""
    match = _PROGRAM.search(text)
    if match is None:
        raise ValueError("no program block (\"Program:\" and its tensor list) in the prompt")
    signature = [{"name": m["name"], "role": _WORD_ROLES.get(m["role"], m["role"]), "dtype": m["dtype"],
                  "shape": [int(d) for d in m["shape"].split(",") if d.strip()]}
                 for m in _TENSOR.finditer(match["tensors"])]
    return Program.parse(match["leir"], signature)


def _subject(workload: str) -> str:
    return f"the workload {workload}" if workload else "a workload"


def step_prompt(program: Program, workload: str, labels: int = 1) -> str:
    """The user turn asking for one transformation (or `labels` different ones) of `program`."""
    if labels == 1:
        ask = ("Rewrite it with one atomic transformation that keeps every output equal up to floating-point "
               "rounding and that you expect to make it faster.")
        reply = f"give {_ANSWER_FORMAT}"
    else:
        ask = (f"Propose {labels} different rewrites, each a single atomic transformation of this same program "
               "that keeps every output equal up to floating-point rounding.")
        reply = f"give a JSON list of {labels} entries, each {_ANSWER_FORMAT}"
    return (f"Here is a tensor program from {_subject(workload)}.\n\n{describe_program(program)}\n\n{ask} "
            f"Reason inside <think></think>, then inside <answer></answer> {reply}.")


def candidate_menu(texts: list[str], cap: int, first: str | None = None) -> list[str]:
    """At most `cap` of a program's candidate action texts for a prompt's menu, taken from the strategies in
    turn (the first candidate of each, then the second, ...), so that a capped menu still offers every
    strategy that applies rather than the first strategies' many parameter choices. `first` (one of
    `texts`) stands first among its strategy's candidates: a training row's menu offers its own answer in
    the place a menu offers a strategy's first candidate."""
    by_strategy: dict[str, list[str]] = {}
    for text in texts:
        by_strategy.setdefault(text.split("(", 1)[0], []).append(text)
    if first is not None and first in texts:
        group = by_strategy[first.split("(", 1)[0]]
        group.insert(0, group.pop(group.index(first)))
    return in_turn(list(by_strategy.values()), cap)


def in_turn(groups: list[list[T]], cap: int) -> list[T]:
    """Up to `cap` items, the first of every group, then the second of every group, ..."""
    chosen, depth = [], 0
    while len(chosen) < cap and any(len(g) > depth for g in groups):
        chosen += [g[depth] for g in groups if len(g) > depth][:cap - len(chosen)]
        depth += 1
    return chosen


def action_prompt(program: Program, workload: str, candidates: list[str] | None = None) -> str:
    """The user turn asking for one transformation as an action text, the short answer style (an LLM
    policy's cheaper alternative to writing the whole program); with `candidates`, the menu to choose from."""
    menu = ("\n\nThe transformations that apply to it:\n" + "\n".join(candidates)) if candidates else ""
    return (f"Here is a tensor program from {_subject(workload)}.\n\n{describe_program(program)}{menu}\n\n"
            "Choose one atomic transformation that keeps every output equal up to floating-point rounding and "
            "that you expect to make it faster. Reason inside <think></think>, then give the transformation "
            "inside <answer></answer> as its action text, for example <answer>loop_split(nest=0, loop=c, "
            "factor=32)</answer>.")


def episode_prompt(program: Program, workload: str) -> str:
    """The first user turn of a multi-step conversation."""
    return (f"Here is a tensor program from {_subject(workload)}.\n\n{describe_program(program)}\n\n"
            "Make it faster step by step. Each turn, apply one atomic transformation that keeps every output "
            "equal up to floating-point rounding: reason inside <think></think>, then inside <answer></answer> "
            f"give {_ANSWER_FORMAT}. I will reply with the verification result and the runtime. When you expect "
            "no further gain, answer <answer>stop()</answer>.")


def answer_object(leir: str, strategy: str) -> dict[str, str]:
    return {"transformed_IR": leir, "applied_strategy": strategy}


def assistant_turn(reasoning: str, answer: Any) -> str:
    """`<think>reasoning</think><answer>JSON</answer>` (the answer given as an object or list), or a bare
    action text such as `stop()`."""
    body = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
    return f"<think>{reasoning}</think><answer>{body}</answer>"


# -- analysis facts and runtimes ------------------------------------------------------------------------
def facts(program: Program) -> dict[str, int]:
    """Counts the reasoning cites: nests, equations, loop iterations, reductions, scans, and loops by kind."""
    kinds = {"P": 0, "V": 0, "U": 0, "B": 0}
    found = {"nests": len(program.nests), "equations": 0, "loop_iterations": loop_iterations(program.nests),
             "reductions": 0, "scans": 0, "intermediates": len(program.intermediates)}
    for nest in program.nests:
        for loop in all_loops(nest):
            if loop.kind in kinds:
                kinds[loop.kind] += 1
        for loops, eq in equations(nest):
            found["equations"] += 1
            found["reductions"] += reduction(loops, eq) is not None
            found["scans"] += bool(scans(loops, eq))
    return {**found, "parallel_loops": kinds["P"], "vector_loops": kinds["V"], "unrolled_loops": kinds["U"],
            "bound_loops": kinds["B"]}


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def facts_sentence(found: dict[str, int]) -> str:
    parts = [_plural(found["nests"], "nest"), _plural(found["equations"], "equation"),
             f"{found['loop_iterations']:,} loop iterations in all"]
    parts += [_plural(found[key], word) for key, word in (("reductions", "reduction"), ("scans", "prefix scan"))
              if found[key]]
    marked = [f"{found[key]} {word}" for key, word in (("parallel_loops", "parallel"), ("vector_loops", "vectorized"),
                                                      ("unrolled_loops", "unrolled"), ("bound_loops", "GPU-bound"))
              if found[key]]
    loops = f"; loops already marked: {', '.join(marked)}" if marked else "; every loop is still serial"
    return "It has " + ", ".join(parts) + loops + "."


def format_seconds(seconds: float) -> str:
    """A runtime with a unit chosen for its size, to 4 significant digits."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


SOURCE_WORDS = {"measured": "measured", "stored": "measured earlier on this machine",
                "predicted": "predicted by the cost model, not measured"}


def runtime_sentence(step: dict[str, Any]) -> str | None:
    """Runtimes before and after a step with where each came from, and the speedup; None without them."""
    before, after = step.get("runtime_before_s"), step.get("runtime_after_s")
    if not before or not after or not math.isfinite(before) or not math.isfinite(after):
        return None
    src_before, src_after = step.get("source_before") or "predicted", step.get("source_after") or "predicted"
    if src_before == src_after or {src_before, src_after} == {"measured", "stored"}:
        label = SOURCE_WORDS[src_after if src_after == src_before else "measured"]
        times = f"Runtime on {step['target']} ({label}): {format_seconds(before)} before, {format_seconds(after)} after"
    else:
        times = (f"Runtime on {step['target']}: {format_seconds(before)} before ({SOURCE_WORDS[src_before]}), "
                 f"{format_seconds(after)} after ({SOURCE_WORDS[src_after]})")
    ratio = before / after
    return f"{times}: " + (f"a speedup of x{ratio:.3f}." if ratio >= 1 else f"slower, x{ratio:.3f}.")


def verify_sentence(report: dict[str, Any] | None) -> str:
    if not report:
        return "The step was not verified."
    if not report.get("equivalent"):
        return f"Verification failed: {report.get('reason') or 'outputs differ'}."
    return (f"Verified equivalent on {_plural(int(report.get('trials') or 0), 'random input draw')} (largest "
            f"relative error {float(report.get('max_rel_err') or 0.0):.2g}).")
