"""What the action menu can reach when the right chain is played: fixed chains, each action checked to be
in the candidate menu of the program it is applied to, every prefix of the chain timed beside PyTorch eager
called directly, interleaved, at one thread, with the core's FMA peak measured in the same run.

    PYTHONPATH=. python benchmarks/menu_ceiling.py [--rounds 5]

It separates two causes of the gap to PyTorch in vs_pytorch.md: a program the menu cannot express, or one
the standard agent does not find. The prefixes show the path: a chain whose middle steps are slower than
its start is one that greedy and beam search, paid step by step, walk away from. Writes
results/menu_ceiling.md and .json. Time it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from results_file import cpu_description
from vs_pytorch import fma_peak_gflops, gemm_flops

RESULTS = Path(__file__).resolve().parent / "results"
PRESET = "small"
CHAINS = {
    "level1/matmul_square": {
        "register tile 4x64": [
            "loop_tiling(nest=0, loops=[a,c], factors=[4,64])", "loop_reorder(nest=0, order=[f,g,d,a,c])",
            "cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=g)",
            "loop_split(nest=0, loop=c, factor=16)", "loop_vectorization(nest=0, loop=c)",
            "loop_unrolling(nest=0, loop=j)", "loop_unrolling(nest=0, loop=a)"],
        "register tile 8x32": [
            "loop_tiling(nest=0, loops=[a,c], factors=[8,32])", "loop_reorder(nest=0, order=[f,g,d,a,c])",
            "cache_read_write(nest=0, tensor=D, mode=write, scope=l, at=g)",
            "loop_split(nest=0, loop=c, factor=16)", "loop_vectorization(nest=0, loop=c)",
            "loop_unrolling(nest=0, loop=j)", "loop_unrolling(nest=0, loop=a)"],
        "reorder only (the agents' usual first step)": ["loop_reorder(nest=0, order=[a,d,c])"],
    },
}
"""Workload -> named chains. The register tiles are the textbook GEMM micro-kernel: an output tile of
rows x (vectors of 16 lanes) kept in registers (`cache_read_write ... at=g`) while the k loop runs outside it."""


def run_workload(uri: str, chains: dict[str, list[str]], rounds: int) -> dict:
    import torch

    from agents.compare import interleave, kernel_seconds, torch_seconds
    from steptp_env.measure import Protocol
    from steptp_env.strategies.base import apply_action, candidates
    from steptp_env.workloads import get_workload

    torch.set_num_threads(1)
    protocol = Protocol(threads=1)
    workload = get_workload(uri, PRESET)
    programs = {"start": workload.program}
    steps: dict[str, list[dict]] = {}
    for name, chain in chains.items():
        program, steps[name] = workload.program, []
        for i, action in enumerate(chain, 1):
            menu = [c.text for c in candidates(program)]
            program = apply_action(program, action)
            programs[f"{name} / {i}"] = program
            steps[name].append({"action": action, "in_menu": action in menu, "menu_size": len(menu),
                                "leir": program.leir})
    timers = {label: (lambda p=p: kernel_seconds(p, workload, "llvm", protocol)) for label, p in programs.items()}
    timers["eager"] = lambda: torch_seconds(workload, protocol)
    load_before = os.getloadavg()
    medians, failures = interleave(timers, rounds)
    return {"uri": uri, "threads": 1, "rounds": rounds, "medians_s": medians, "failures": failures,
            "steps": steps, "gemm_flops": gemm_flops(workload.program), "load_before": load_before,
            "load_after": os.getloadavg()}


def report(peak: float, peak_load: tuple, rows: list[dict], cpu: str, date: str) -> str:
    lines = ["# What the action menu reaches: fixed chains against PyTorch", "",
             "Written by `benchmarks/menu_ceiling.py`. One thread, preset `small`; every prefix of every chain "
             "and PyTorch eager (direct module call, `torch.inference_mode()`) timed in turn in one process, "
             "medians of rounds; each program verified against the model when measured. 'in menu': the action "
             "is among the candidates of the program it is applied to.", "",
             f"- processor: {cpu}; {os.cpu_count()} CPUs; {date}",
             f"- single-core float32 FMA peak: {peak:.1f} GFLOP/s (benchmarks/native/fma_peak.c, best of 5, load "
             f"{peak_load[0]:.2f})", ""]
    for row in rows:
        eager = row["medians_s"].get("eager")
        lines += [f"## {row['uri']}", "",
                  f"PyTorch eager {eager * 1e3:.3f} ms; start {row['medians_s']['start'] * 1e3:.3f} ms; load "
                  f"{row['load_before'][0]:.2f} before, {row['load_after'][0]:.2f} after; {row['rounds']} rounds.",
                  "", "| chain | step | action | in menu (menu size) | ms | / eager | % of FMA peak |",
                  "|---|---|---|---|---|---|---|"]
        for name, steps in row["steps"].items():
            for i, step in enumerate(steps, 1):
                seconds = row["medians_s"].get(f"{name} / {i}")
                if seconds is None:
                    lines.append(f"| {name} | {i} | `{step['action']}` | {step['in_menu']} ({step['menu_size']}) "
                                 "| failed | | |")
                    continue
                share = f"{100 * row['gemm_flops'] / seconds / 1e9 / peak:.0f}" if row["gemm_flops"] else "-"
                lines.append(f"| {name} | {i} | `{step['action']}` | {step['in_menu']} ({step['menu_size']}) | "
                             f"{seconds * 1e3:.3f} | {seconds / eager:.2f} | {share} |")
        lines += [""] + [f"- {failure}" for failure in row["failures"]]
        lines += ["", "Final programs:", ""] + [f"- {name}: `{steps[-1]['leir']}`"
                                                for name, steps in row["steps"].items()] + [""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    peak_load = os.getloadavg()
    peak = fma_peak_gflops()
    rows = [run_workload(uri, chains, args.rounds) for uri, chains in CHAINS.items()]
    cpu, date = cpu_description(), time.strftime("%Y-%m-%d %H:%M")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "menu_ceiling.json").write_text(json.dumps({"cpu": cpu, "date": date, "fma_peak_gflops": peak,
                                                           "fma_peak_load": peak_load, "rows": rows}, indent=1) + "\n")
    (RESULTS / "menu_ceiling.md").write_text(report(peak, peak_load, rows, cpu, date))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
