"""How repeatable are our timings? Measures three kernels (about 0.06 ms, 1.5 ms and 15 ms on this
machine) several times each with the default protocol at one thread and reports the relative spread of
the repeated medians, with the load average seen. Writes benchmarks/results/measure_noise.md.

    python benchmarks/measure_noise.py [--rounds 10] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import numpy as np

from steptp_env import Program
from steptp_env.measure import Protocol, measure


def matmul(n: int) -> tuple[Program, object]:
    sig = [{"name": "A", "shape": [n, n], "dtype": "float32"}, {"name": "B", "shape": [n, n], "dtype": "float32"},
           {"name": "C", "shape": [n, n], "dtype": "float32", "role": "output"}]
    text = (f"L^{{{n}}}_{{a=0}}L^{{{n}}}_{{c=0}}L^{{{n}}}_{{d=0}}[C^{{f32,g}}_{{a,c}}=C^{{f32,g}}_{{a,c}}+"
            f"A^{{f32,g}}_{{a,d}}*B^{{f32,g}}_{{d,c}};];")
    return Program.parse(text, sig), lambda t: t["A"].astype(np.float64) @ t["B"]


def scale(n: int) -> tuple[Program, object]:
    sig = [{"name": "A", "shape": [n], "dtype": "float32"}, {"name": "C", "shape": [n], "dtype": "float32",
                                                              "role": "output"}]
    return Program.parse(f"L^{{{n}}}_{{a=0}}[C^{{f32,g}}_{{a}}=exp(A^{{f32,g}}_{{a}})*2;];", sig), \
        lambda t: np.exp(t["A"].astype(np.float64)) * 2


KERNELS = {"exp-scale 32k": scale(32768), "matmul 128^3": matmul(128), "matmul 256^3": matmul(256)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    protocol = Protocol(threads=args.threads)
    lines = ["# Measurement noise", "",
             f"Each kernel measured {args.rounds} times (protocol: {protocol.key}); spread = standard deviation "
             "of the repeated medians / their median.", "",
             "| kernel | median ms | spread % | min ms | max ms | load average (1 min) |", "|---|---|---|---|---|---|"]
    spreads = []
    for name, (program, reference) in KERNELS.items():
        medians, loads = [], []
        for _ in range(args.rounds):
            m = measure(program, reference, protocol=protocol)
            assert m.ok, m.error
            medians.append(m.median_s)
            loads.append(m.load_average[0])
        mid = statistics.median(medians)
        spread = statistics.pstdev(medians) / mid * 100
        spreads.append(spread)
        lines.append(f"| {name} | {mid * 1e3:.3f} | {spread:.2f} | {min(medians) * 1e3:.3f} | "
                     f"{max(medians) * 1e3:.3f} | {min(loads):.2f}-{max(loads):.2f} |")
    lines += ["", f"Median relative spread over the kernels: {statistics.median(spreads):.2f}% "
                  f"(target < 3% on a quiet machine). Cores: {os.cpu_count()}."]
    out = Path(__file__).resolve().parent / "results" / "measure_noise.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
