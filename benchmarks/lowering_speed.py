"""Lowering cost: building TIR with TVM's IR builder (what `lower` does) against printing the module as
TVMScript and parsing it back (what a text-template lowerer like the reference's pays), over the 202
reference programs. Writes benchmarks/results/lowering_speed.md.

    python benchmarks/lowering_speed.py
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import tvm

from steptp_env import Program
from steptp_env.lower import lower

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT.parent / "shared" / "steptp-ref" / "programs.jsonl"


def main() -> None:
    rows = [json.loads(line) for line in REF.read_text().splitlines()]
    direct, text = [], []
    for row in rows:
        program = Program.parse(row["leir"], row["signature"])
        lower(program)  # warm up
        start = time.perf_counter()
        module = lower(program)
        direct.append(time.perf_counter() - start)
        script = module.script()
        start = time.perf_counter()
        tvm.script.from_source(script)
        text.append(time.perf_counter() - start)
    d, t = statistics.median(direct) * 1e3, statistics.median(text) * 1e3
    lines = ["# Lowering cost per program (202 reference programs, 1 thread)", "",
             "| method | median ms | p90 ms |", "|---|---|---|",
             f"| IR builder (`lower`) | {d:.2f} | {sorted(direct)[int(0.9 * len(direct))] * 1e3:.2f} |",
             f"| TVMScript text parse only | {t:.2f} | {sorted(text)[int(0.9 * len(text))] * 1e3:.2f} |",
             "", f"Parsing the text alone costs {t / d:.1f}x the whole direct lowering."]
    out = ROOT / "benchmarks" / "results" / "lowering_speed.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
