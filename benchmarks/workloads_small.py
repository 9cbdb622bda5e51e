"""The workload suite at the `small` preset: convert every workload, lower, build, verify against PyTorch
and time the naive program. Writes benchmarks/results/workloads_small.md.

    PYTHONPATH=. python benchmarks/workloads_small.py [FILTER]

Targets: median conversion time under 1 s; median TVMScript / LEIR character ratio of at least 3 (how
much more compact the LEIR an agent reads is than the TIR it stands for).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from steptp_env.lower import lower
from steptp_env.measure import build, verify
from steptp_env.workloads import get_workload, list_workloads

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "workloads_small.md"


def _cell(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def run_one(uri: str) -> dict:
    row: dict = {"uri": uri}
    start = time.perf_counter()
    wl = get_workload(uri, "small")
    row["convert_s"] = time.perf_counter() - start
    program = wl.program
    row["nests"] = len(program.nests)
    row["leir_chars"] = len(program.leir)
    row["tir_chars"] = len(lower(program).script())
    kernel = build(program, "llvm")
    report = verify(program, wl, kernel=kernel)
    row["verified"] = "yes" if report.equivalent else f"NO: {report.reason}"
    row["ok"] = report.equivalent
    times = kernel.time(wl.make_inputs(0), repeat=3)
    row["ms"] = statistics.median(times) * 1e3
    return row


def main(pattern: str | None = None) -> int:
    uris = list_workloads(pattern)
    rows = []
    for n, uri in enumerate(uris, 1):
        try:
            row = run_one(uri)
        except Exception as exc:  # one failure must not stop the table
            row = {"uri": uri, "ok": False, "verified": f"ERROR {type(exc).__name__}: {exc}"}
        rows.append(row)
        print(f"[{n}/{len(uris)}] {uri}: {_cell(row['verified'], 100)}"
              + (f" ({row['ms']:.2f} ms, converted in {row['convert_s']:.2f} s)" if "ms" in row else ""), flush=True)

    def fmt(row: dict, key: str, spec: str) -> str:
        return format(row[key], spec) if key in row else "-"

    lines = [f"# Workload suite at the `small` preset ({len(rows)} workloads, CPU, float32)", "",
             "| workload | nests | LEIR chars | TVMScript chars | verify | naive ms | conversion s |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['uri']} | {fmt(row, 'nests', 'd')} | {fmt(row, 'leir_chars', 'd')} | "
                     f"{fmt(row, 'tir_chars', 'd')} | {_cell(row['verified'])} | {fmt(row, 'ms', '.3f')} | "
                     f"{fmt(row, 'convert_s', '.3f')} |")
    passed = sum(r["ok"] for r in rows)
    conv = [r["convert_s"] for r in rows if "convert_s" in r]
    ratios = [r["tir_chars"] / r["leir_chars"] for r in rows if "tir_chars" in r]
    threads = os.environ.get("TVM_NUM_THREADS", f"default ({os.cpu_count()} CPUs)")
    summary = [f"- passed (built and verified against PyTorch): {passed}/{len(rows)}",
               f"- median conversion time: {statistics.median(conv):.3f} s (target < 1 s)" if conv else
               "- median conversion time: -",
               f"- median TVMScript / LEIR chars: {statistics.median(ratios):.2f} (target >= 3)" if ratios else
               "- median TVMScript / LEIR chars: -",
               f"- TVM threads: {threads}; load average {os.getloadavg()[0]:.2f} "
               f"(1 min), {os.getloadavg()[1]:.2f} (5 min)"]
    failed = [r for r in rows if not r["ok"]]
    if failed:
        summary.append("- failures: " + ", ".join(r["uri"] for r in failed))
    lines += ["", "## Summary", "", *summary]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
