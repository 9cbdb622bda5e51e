"""Evaluate an LLM policy on single steps: for every answer, whether it parses, whether the strategy it
claims is the one `identify` finds, whether the program is equivalent, and its speedup over the prompt's
program (measured, by default).

The held-out split is by family (`costmodel.dataset.split_families`: every workload of a held-out operator
family is out of training), so a row of a sibling workload never leaks into the test. Prompts are the start
programs of the split's workloads; each gets `answers` completions (greedy for one, sampled otherwise).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from steptp_env.env import StepTPEnv
from steptp_env.env.answer import read_proposal

from .llm import Backend, LLMPolicy


@dataclass
class Answer:
    """One completion, judged by the environment."""

    workload: str
    style: str
    text: str
    parses: bool
    claimed: str | None
    identified: str | None
    equivalent: bool
    speedup: float | None
    source: str | None
    error: str | None

    @property
    def claim_matches(self) -> bool | None:
        """For a full-program answer, whether the claimed strategy is the identified one (None where the
        answer names an action, which says what it applies, or where nothing was identified)."""
        if self.claimed is None or self.identified is None:
            return None
        return self.identified in {c.strip() for c in self.claimed.split(",")}


@dataclass
class Evaluation:
    answers: list[Answer] = field(default_factory=list)

    def summary(self, style: str) -> dict[str, Any]:
        """Rates over the answers of one style: parsed, claim matched (of those with a claim), equivalent,
        faster (of the equivalent), and the geometric-mean speedup of the equivalent ones."""
        mine = [a for a in self.answers if a.style == style]
        if not mine:
            return {"style": style, "answers": 0}
        equivalent = [a for a in mine if a.equivalent and a.speedup]
        faster = sum(a.speedup > 1.0 for a in equivalent)
        claims = [a.claim_matches for a in mine if a.claim_matches is not None]
        return {"style": style, "answers": len(mine), "parse_rate": sum(a.parses for a in mine) / len(mine),
                "claim_match_rate": sum(claims) / len(claims) if claims else None,
                "equivalent_rate": len(equivalent) / len(mine),
                "faster_of_equivalent": faster / len(equivalent) if equivalent else None,
                "geomean_speedup_equivalent": statistics.geometric_mean([a.speedup for a in equivalent])
                if equivalent else None}

    def to_dict(self) -> dict[str, Any]:
        styles = sorted({a.style for a in self.answers})
        return {"summary": [self.summary(s) for s in styles], "answers": [asdict(a) for a in self.answers]}


HELD_OUT_FRACTION = 0.2
ANSWER_TOKENS = {"action": 256, "ir": 512}
"""New tokens an answer may take by style: an action-style answer is an action text after a short reasoning,
an ir-style one a whole program; a model that has not ended by then is not going to."""


def family_split(seed: int = 0) -> tuple[list[str], list[str]]:
    """(training, held-out) suite URIs: a fifth of the operator families held out whole, seeded."""
    from steptp_env.costmodel.dataset import split_families
    from steptp_env.workloads import list_workloads

    return split_families(list_workloads(), HELD_OUT_FRACTION, seed)


def judge(env: StepTPEnv, text: str, style: str) -> Answer:
    """Step `text` on a fork of `env` (which stays at the prompt's program) and read the verdict."""
    proposal = read_proposal(text)
    fork = env.fork()
    _, _, _, _, info = fork.step(text)
    error = info.get("error")
    identified = None
    if not error and info.get("action") and not str(info["action"]).startswith("leir:"):
        identified = str(info["action"]).split("(", 1)[0]
    equivalent = not error and info.get("verified") is True  # a checked program that failed is an error
    speedup = None if error else env.runtime_s / info["runtime_s"]
    return Answer(env.workload.uri, style, text, proposal.error is None, proposal.claimed_strategy, identified,
                  equivalent, speedup if speedup and math.isfinite(speedup) else None, info.get("runtime_source"),
                  error)


def evaluate(backend: Backend, workloads: list[str], styles: tuple[str, ...] = ("action", "ir"), answers: int = 1,
             preset: str = "tiny", mode: str = "measure", store=None, candidates: int = 64,
             max_new_tokens: dict[str, int] | None = None, seed: int = 0) -> Evaluation:
    """Every workload's start program, `answers` completions per style (at most `max_new_tokens[style]`
    new tokens, `ANSWER_TOKENS` by default), each judged by the environment."""
    limits = dict(ANSWER_TOKENS, **(max_new_tokens or {}))
    result = Evaluation()
    for uri in workloads:
        env = StepTPEnv(uri, preset, mode=mode, action_mode="text", obs_mode="text", store=store,
                        verify_steps=True)
        env.reset(seed=seed)
        for style in styles:
            policy = LLMPolicy(backend, style=style, candidates=candidates, proposals=answers,
                               max_new_tokens=limits[style], seed=seed)
            for text in policy.complete(env):
                result.answers.append(judge(env, text, style))
    return result
