"""What the lowering changes of issue 16 did to the suite's programs: each program built twice, in the
first release's form (every reduction's initialisation as `T.init()` inside its block, libm math: what
`lower(..., tvm_form=True)` still emits for TVM's own tools) and in the current one (initialisation blocks
before the outermost reduced loop, vectorisable float32 exp/log/erf, tiles sized where TVM allocates them),
timed in turn in this process at one thread, pinned, medians of rounds.

    PYTHONPATH=. python benchmarks/lowering_effect.py [--filter 'level1/*'] [--rounds 3]

Programs: every suite workload's start program at `small`, and the best programs recorded in
benchmarks/results/vs_pytorch.progress.jsonl (the standard agent's best chains). Each finished workload is
appended to lowering_effect.progress.jsonl (a rerun skips it); lowering_effect.md is rewritten from it.
Time it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from results_file import cpu_description

RESULTS = Path(__file__).resolve().parent / "results"
PROGRESS = RESULTS / "lowering_effect.progress.jsonl"
BEST = RESULTS / "vs_pytorch.progress.jsonl"
PRESET = "small"


def seconds(kernel, inputs: dict, protocol) -> float:
    """Median seconds per run over `protocol.repeat` timings, one timing lasting `protocol.min_seconds`."""
    from steptp_env.measure.runner import timing_lock
    from steptp_env.measure.worker import pinned, runs_per_timing

    with timing_lock(), pinned(protocol.threads):
        probe = kernel.time(inputs, number=1, repeat=1)[0]
        number = runs_per_timing(probe, protocol.number, protocol.min_seconds)
        return statistics.median(kernel.time(inputs, number=number, repeat=protocol.repeat)) / number


def both_forms(program, workload, rounds: int) -> dict:
    """Median seconds of the first release's form and the current one, timed in turn `rounds` times, after
    checking that both compute the workload's outputs."""
    import tvm

    from steptp_env.lower import lower
    from steptp_env.measure import Protocol, verify
    from steptp_env.measure.build import Kernel, _pass_config, resolve_target

    protocol = Protocol(threads=1)
    inputs = workload.make_inputs(protocol.seed)
    kernels = {}
    for form, tvm_form in (("first", True), ("current", False)):
        module = lower(program, "llvm", tvm_form=tvm_form)
        with tvm.transform.PassContext(config=_pass_config(program)):
            executable = tvm.compile(module, target=resolve_target("llvm"))
        kernel = Kernel(program, module, executable, "llvm")
        report = verify(program, workload, trials=1, kernel=kernel)
        if not report.equivalent:
            raise RuntimeError(f"the {form} form does not compute the workload: {report.reason}")
        kernels[form] = kernel
    times: dict[str, list[float]] = {form: [] for form in kernels}
    for _ in range(rounds):
        for form, kernel in kernels.items():
            times[form].append(seconds(kernel, inputs, protocol))
    return {form: statistics.median(values) for form, values in times.items()}


def _rows() -> list[dict]:
    return [json.loads(line) for line in PROGRESS.read_text().splitlines()] if PROGRESS.exists() else []


def _section(rows: list[dict]) -> list[str]:
    lines = []
    for kind in ("start", "best"):
        mine = [r for r in rows if r["kind"] == kind and r.get("first_s")]
        if not mine:
            continue
        ratios = [r["first_s"] / r["current_s"] for r in mine]
        faster = sum(1 for x in ratios if x > 1.05)
        slower = sum(1 for x in ratios if x < 1 / 1.05)
        lines += [f"### {kind} programs: {len(mine)}", "",
                  f"- geometric mean first / current: {statistics.geometric_mean(ratios):.2f}; more than 5% faster "
                  f"now: {faster}, more than 5% slower now: {slower}; median {statistics.median(ratios):.2f}, "
                  f"min {min(ratios):.2f}, max {max(ratios):.2f}", "",
                  "| workload | first ms | current ms | first / current | load |", "|---|---|---|---|---|"]
        lines += [f"| {r['uri']} | {r['first_s'] * 1e3:.3f} | {r['current_s'] * 1e3:.3f} | "
                  f"{r['first_s'] / r['current_s']:.2f} | {r['load'][0]:.2f} |" for r in mine]
        lines.append("")
    failed = [r for r in rows if r.get("error")]
    if failed:
        lines += ["### Not timed", ""] + [f"- {r['uri']} ({r['kind']}): {r['error']}" for r in failed] + [""]
    return lines


def _key(row: dict) -> tuple[str, str]:
    """Rows taken before the processor and the lowering version were recorded came from lowering 3 on the
    AMD EPYC family 26 machine (the run of 2026-12-02)."""
    return row.get("cpu", "not recorded"), row.get("lowering", "3")


def report() -> str:
    rows = _rows()
    lines = ["# The lowering changes of issue 16, program by program", "",
             f"Written by `benchmarks/lowering_effect.py` from `{PROGRESS.name}` ({len(rows)} programs). 'first': "
             "`T.init()` reductions and libm math (`lower(..., tvm_form=True)`); 'current': the default lowering "
             "of the version the section names (steptp_env.lower.LOWERING_VERSION). One thread, pinned, timed in "
             "turn in one process, medians of rounds; ratio = first / current (above 1: the current lowering is "
             "faster). One section per processor and lowering version, newest first.", ""]
    for cpu, version in sorted({_key(r) for r in rows}, key=lambda k: (int(k[1]), k[0]), reverse=True):
        lines += [f"## {cpu}, lowering {version}", ""] + _section([r for r in rows if _key(r) == (cpu, version)])
    return "\n".join(lines) + "\n"


def main() -> int:
    from steptp_env import Program
    from steptp_env.lower import LOWERING_VERSION
    from steptp_env.workloads import get_workload, list_workloads

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--report", action="store_true", help="only rewrite the report")
    args = parser.parse_args()
    if not args.report:
        here = (cpu_description(), LOWERING_VERSION)
        done = {(r["uri"], r["kind"]) for r in _rows() if _key(r) == here}
        best = [json.loads(line) for line in BEST.read_text().splitlines()] if BEST.exists() else []
        best = {r["uri"]: r["best_leir"] for r in best if r.get("best_leir") and r.get("threads") == 1}
        RESULTS.mkdir(parents=True, exist_ok=True)
        for uri in list_workloads(args.filter):
            workload = get_workload(uri, preset=PRESET)
            jobs = [("start", workload.program)]
            if uri in best:
                jobs.append(("best", Program.parse(best[uri], workload.program.signature)))
            for kind, program in jobs:
                if (uri, kind) in done:
                    continue
                row = {"uri": uri, "kind": kind, "load": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M"),
                       "cpu": here[0], "lowering": LOWERING_VERSION}
                try:
                    row.update({f"{form}_s": value for form, value in both_forms(program, workload,
                                                                                 args.rounds).items()})
                except Exception as exc:  # noqa: BLE001  (one program that fails to build is reported, not fatal)
                    row["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
                with PROGRESS.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(uri, kind, row.get("error") or f"{row['first_s'] / row['current_s']:.2f}", flush=True)
    (RESULTS / "lowering_effect.md").write_text(report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
