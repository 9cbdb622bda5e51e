"""Dataset rows from recorded steps: Step-TP chat rows (plain and grounded) and whole-episode conversations.

Every row has the same columns, so one loader reads every kind:
- `id`: a content hash (same workload, program and actions give the same id in any run);
- `kind`: `steptp-chat`, `steptp-chat-grounded` or `trajectory`;
- `messages`: `[{"role", "content"}]`, an optional system turn, then user and assistant turns. Assistant
  turns are `<think>reasoning</think><answer>{"transformed_IR": ..., "applied_strategy": ...}</answer>`;
  a multi-label row's answer is a JSON list of such objects (k different verified transformations of the
  same program); a conversation ends with `<answer>stop()</answer>`;
- `workload`, `preset`, `dtype`, `target`: where the program comes from (what validation verifies against);
- `strategies`, `actions`: the applied strategy and action text of each answer, in order;
- `runtimes_before_s`, `runtimes_after_s`, `runtime_sources`, `speedups`: per answer, in the same order, its
  runtimes, where they came from (`measured` when both were timed on the machine, stored timings included,
  `predicted` when either is the cost model's, None without runtimes) and before/after;
- `style`: `ir` (Step-TP's answer, the whole transformed program) or `action` (the short action text, the
  prompt listing the program's candidate actions as the LLM agent's `action` style shows them).

Plain reasoning states the program's analysis facts, the chosen action and the strategy's own explanation
of why it is legal and what it changes. Grounded reasoning adds the runtimes before and after (each
labelled measured or predicted) and the speedup, and how the analysis counts change. Output is a pure
function of the steps and options: rows are sorted, text is formatted with fixed precision.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..ir.program import Program
from ..env.catalog import candidate_groups
from .filters import MEASURED, program_key, speedup, step_id
from .prompts import (SYSTEM_PROMPT, action_prompt, answer_object, assistant_turn, candidate_menu, episode_prompt,
                      facts, in_turn, facts_sentence, runtime_sentence, step_prompt, verify_sentence)

KINDS = ("steptp-chat", "steptp-chat-grounded", "trajectory")
STYLES = ("ir", "action")
REASONING = ("full", "short")


@dataclass(frozen=True)
class ExportOptions:
    """`kind` of rows; `system`: start each conversation with our system turn; `labels`: with k > 1,
    chat rows are multi-label (programs with at least `min_labels` distinct verified transformations,
    up to k of them, as many different strategies as there are); `style`: the answer style of chat rows,
    `action` with a menu of `menu` candidate actions as the LLM agent shows them (`candidate_menu`), the
    step's action standing first among its strategy's candidates (a step whose strategy still misses the
    menu, or whose action is not a candidate, gives no row); `reasoning`: `full` (facts, the action and the
    strategy's explanation) or `short` (facts and the action: a small model taught the long explanation
    spends its tokens reciting it, and a greedy one loops inside it before it answers)."""

    kind: str = "steptp-chat"
    system: bool = False
    labels: int = 1
    min_labels: int = 2
    style: str = "ir"
    menu: int = 64
    reasoning: str = "full"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.labels < 1 or self.min_labels < 1:
            raise ValueError("labels and min_labels must be at least 1")
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")
        if self.reasoning not in REASONING:
            raise ValueError(f"reasoning must be one of {', '.join(REASONING)}, got {self.reasoning!r}")
        if self.style == "action" and (self.kind == "trajectory" or self.labels > 1):
            raise ValueError("the action style is for single-label chat rows")


def _program(part: dict[str, Any]) -> Program:
    return Program.parse(part["leir"], part["signature"])


def _delta_sentence(before: dict[str, int], after: dict[str, int]) -> str:
    changed = [f"{key.replace('_', ' ')} {before[key]:,} -> {after[key]:,}"
               for key in before if before[key] != after[key]]
    return ("Afterwards: " + ", ".join(changed) + ".") if changed else "None of these counts changes."


def reasoning(step: dict[str, Any], grounded: bool, state_facts: bool = True, explain: bool = True) -> str:
    """The <think> text of one step: facts of the program (unless `state_facts` is off), the action, the
    strategy's explanation (unless `explain` is off); with `grounded`, also the runtimes (labelled by
    source), the speedup and how the facts change."""
    before = facts(_program(step["before"]))
    parts = [facts_sentence(before)] if state_facts else []
    parts.append(f"I apply {step['action']}.")
    if step.get("explain") and explain:
        parts.append(step["explain"].strip())
    if grounded:
        parts.append(_delta_sentence(before, facts(_program(step["after"]))))
        timing = runtime_sentence(step)
        if timing:
            parts.append(timing)
    return " ".join(parts)


def _source(step: dict[str, Any]) -> str | None:
    sources = {step.get("source_before"), step.get("source_after")}
    if None in sources or speedup(step) is None:
        return None
    return "measured" if sources <= set(MEASURED) else "predicted"


def _speedup(step: dict[str, Any]) -> float | None:
    ratio = speedup(step)
    return None if ratio is None else round(ratio, 6)


def _row(kind: str, ident: str, messages: list[dict[str, str]], steps: list[dict[str, Any]],
         style: str = "ir") -> dict[str, Any]:
    first = steps[0]
    return {"id": ident, "kind": kind, "style": style, "messages": messages, "workload": first["workload"],
            "preset": first.get("preset"), "dtype": first.get("dtype"), "target": first.get("target"),
            "strategies": [s["strategy"] for s in steps], "actions": [s["action"] for s in steps],
            "runtimes_before_s": [s.get("runtime_before_s") for s in steps],
            "runtimes_after_s": [s.get("runtime_after_s") for s in steps],
            "runtime_sources": [_source(s) for s in steps], "speedups": [_speedup(s) for s in steps]}


def _opening(options: ExportOptions, prompt: str) -> list[dict[str, str]]:
    system = [{"role": "system", "content": SYSTEM_PROMPT}] if options.system else []
    return system + [{"role": "user", "content": prompt}]


def chat_row(step: dict[str, Any], options: ExportOptions) -> dict[str, Any] | None:
    """One single-label row; None for an `action`-style row whose action is not on the prompt's menu."""
    before = _program(step["before"])
    think = reasoning(step, options.kind == "steptp-chat-grounded", explain=options.reasoning == "full")
    if options.style == "action":
        groups = candidate_groups(before, step.get("target") or "llvm")  # cached: a program's steps share it
        texts = [a.text for found in groups.values() for a in found]
        menu = candidate_menu(texts, options.menu, first=step["action"]) or None
        if menu is not None and step["action"] not in menu:
            return None
        prompt, answer = action_prompt(before, step["workload"], menu), step["action"]
    else:
        prompt, answer = step_prompt(before, step["workload"]), answer_object(step["after"]["leir"], step["strategy"])
    messages = _opening(options, prompt) + [{"role": "assistant", "content": assistant_turn(think, answer)}]
    ident = step_id(step)
    if options.style == "action":  # the same step in both styles gives two rows with two ids
        ident = hashlib.sha256(f"action:{ident}".encode()).hexdigest()[:16]
    return _row(options.kind, ident, messages, [step], options.style)


def _diverse(group: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Up to k steps, taking strategies in turn (each strategy's steps in id order)."""
    by_strategy: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for step in sorted(group, key=step_id):
        by_strategy[step["strategy"]].append(step)
    return in_turn([v for _, v in sorted(by_strategy.items())], k)


def multi_label_row(group: list[dict[str, Any]], options: ExportOptions) -> dict[str, Any]:
    """One row with k different transformations of the same program."""
    chosen = _diverse(group, options.labels)
    before = _program(chosen[0]["before"])
    grounded = options.kind == "steptp-chat-grounded"
    options_text = (f"Option {n}: {reasoning(step, grounded, state_facts=False)}" for n, step in enumerate(chosen, 1))
    think = " ".join([facts_sentence(facts(before)), *options_text])
    answer = [answer_object(s["after"]["leir"], s["strategy"]) for s in chosen]
    messages = _opening(options, step_prompt(before, chosen[0]["workload"], len(chosen))) + [
        {"role": "assistant", "content": assistant_turn(think, answer)}]
    ident = hashlib.sha256(" ".join(step_id(s) for s in chosen).encode()).hexdigest()[:16]
    return _row(options.kind, ident, messages, chosen)


def _feedback(step: dict[str, Any], initial_s: float | None) -> str:
    parts = [f"Step applied: {step['action']}.", verify_sentence(step.get("verify"))]
    timing = runtime_sentence(step)
    if timing:
        parts.append(timing)
        if initial_s:
            parts.append(f"Overall x{initial_s / step['runtime_after_s']:.3f} since the start.")
    parts.append("Next transformation, or stop()?")
    return " ".join(parts)


def trajectory_row(episode: list[dict[str, Any]], options: ExportOptions) -> dict[str, Any]:
    """A whole episode as a conversation: the program, then action, feedback, action, ..., stop. The
    feedback turns carry verification and runtimes, so the assistant's reasoning is the plain one."""
    first = episode[0]
    messages = _opening(options, episode_prompt(_program(first["before"]), first["workload"]))
    initial_s = first.get("runtime_before_s")
    for n, step in enumerate(episode):
        if n:
            messages.append({"role": "user", "content": _feedback(episode[n - 1], initial_s)})
        answer = answer_object(step["after"]["leir"], step["strategy"])
        messages.append({"role": "assistant", "content": assistant_turn(reasoning(step, grounded=False), answer)})
    messages.append({"role": "user", "content": _feedback(episode[-1], initial_s)})
    last = episode[-1].get("runtime_after_s")
    total = f" x{initial_s / last:.3f} faster than at the start" if initial_s and last else ""
    done = f"After {len(episode)} step(s) the program is{total}; I expect no further gain, so I stop."
    messages.append({"role": "assistant", "content": assistant_turn(done, "stop()")})
    ident = hashlib.sha256(" ".join(step_id(s) for s in episode).encode()).hexdigest()[:16]
    return _row("trajectory", ident, messages, episode)


def chat_rows(steps: list[dict[str, Any]], options: ExportOptions) -> list[dict[str, Any]]:
    """Rows of filtered steps: one per step, or (labels > 1) one per program with enough labels."""
    if options.labels == 1:
        rows = [row for step in steps if (row := chat_row(step, options)) is not None]
    else:
        groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for step in steps:
            groups[program_key(step)].append(step)
        rows = [multi_label_row(group, options) for group in groups.values() if len(group) >= options.min_labels]
    return sorted(rows, key=lambda r: (r["workload"], r["id"]))


def trajectory_rows(episodes: list[list[dict[str, Any]]], options: ExportOptions) -> list[dict[str, Any]]:
    return sorted((trajectory_row(e, options) for e in episodes), key=lambda r: (r["workload"], r["id"]))
