"""The environment's programs beside PyTorch eager, torch.compile and MetaSchedule, on a fixed suite subset.

    PYTHONPATH=. python benchmarks/vs_pytorch.py [--threads 1 2] [--workloads URI ...] [--budget 64]
        [--agent focus] [--max-steps 64] [--mode hybrid] [--ms-trials 64] [--no-metaschedule] [--no-compile]
        [--redo] [--report-only]

Each (workload, thread count T) is one item, run in a child process started with TVM_NUM_THREADS=T (TVM
reads it at import) and torch at T threads:
1. the standard agent (`--agent`, default focus; hybrid mode, a fresh store and a fresh copy of the packaged
   cost model) searches the `small` preset with `--budget` measurements under `Protocol(threads=T)`, in
   episodes of at most `--max-steps` steps (an attention block's chains run past the env's default 32); at a
   thread count the model was not trained for (it was at 1), in measure mode;
2. MetaSchedule tunes the lowered start program with `--ms-trials` trials for T cores in a process of its
   own (`steptp_env.measure.metaschedule.tune_library`), which exports the kernel; the kernel is verified
   against PyTorch and timed in the measurement worker like the agent's programs (`measure(library=)`), so
   no TVM code runs in the process that times PyTorch (before 2026-12-04 it ran there, and PyTorch at two
   threads then intermittently took 8 ms a call where it takes 0.2; so did a worker's TVM thread pool still
   spinning after a parallel kernel, and PyTorch is now timed once the workers are idle, `settle_workers`);
3. torch.compile (inductor) compiles the module; its compile time (the first call) is recorded apart;
4. the start program, the best program, MetaSchedule's kernel, PyTorch eager called directly
   (`module(*tensors)` under `torch.inference_mode()`) and the compiled module are timed in turn, ROUNDS
   rounds, and the medians kept (`agents.compare`), so every figure of a row is taken under the same load.
   PyTorch runs with glibc's malloc at its steady state (`agents.compare.steady_allocator`, from commit
   "eager at the allocator's steady state" on 2026-12-05): before, some processes' eager calls page-faulted
   on every output (level2/conv2d_relu_hardswish 1.8 ms a call, 0.29 ms in another process).
Each finished item is appended to vs_pytorch.progress.jsonl with the commit and lowering version it ran (a
rerun skips it, so a long run can stop and go on; `--redo` measures the named items again, and the report
keeps each item's last record). Records name the processor; the report has a section for each.
vs_pytorch.md and vs_pytorch.png are rewritten from that file after each item. The run also measures the
core's float32 FMA peak (benchmarks/native/fma_peak.c, best of 5) and reports each GEMM's fraction of it.
Time it on a quiet machine: nothing else running; the load average is recorded per item.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_file import cpu_description

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
UNRECORDED_MAX_STEPS = 32
"""The step limit of items recorded before `--max-steps`: the env's default then."""
PROGRESS = RESULTS / "vs_pytorch.progress.jsonl"
FMA_SOURCE = ROOT / "benchmarks" / "native" / "fma_peak.c"
PRESET = "small"
SUBSET = [
    # matmuls
    "level1/matmul_square", "level1/matmul_rectangular", "level1/matmul_batched", "level1/matmul_transposed_b",
    "level1/matvec",
    # convolutions
    "level1/conv2d_square_input_square_kernel", "level1/conv_depthwise_2d_square_input_square_kernel",
    "level1/conv_pointwise_2d", "level1/conv1d", "level1/conv2d_strided_bias",
    # norms, softmax, activations
    "level1/layer_norm", "level1/rms_norm", "level1/batch_norm", "level1/group_norm", "level1/softmax",
    "level1/log_softmax", "level1/gelu",
    # attention
    "level2/mha", "level2/gqa", "level2/mingpt_causal_attention",
    # fused chains
    "level2/conv2d_relu_hardswish", "level2/gemm_layer_norm_gelu_scale", "level2/gemm_relu_divide",
    "level2/matmul_softmax", "level2/bmm_scale_softmax"]
GEMMS = {"level1/matmul_square", "level1/matmul_rectangular", "level1/matmul_batched", "level1/matmul_transposed_b"}
KERNEL_KINDS = ("start", "metaschedule")  # compared with the best program besides PyTorch
TIMERS = ("start", "best", "metaschedule", "eager", "compiled")


# -- one item, in its own process ---------------------------------------------------------------------


def run_item(uri: str, threads: int, args: argparse.Namespace) -> dict:
    import torch

    from agents import get_agent
    from agents.compare import interleave, kernel_seconds, torch_seconds
    from steptp_env import Program
    from steptp_env.costmodel import CostModel
    from steptp_env.costmodel.default import DEFAULT_MODEL_DIR
    from steptp_env.env import StepTPEnv
    from steptp_env.measure import Protocol, ResultStore, measure
    from steptp_env.measure.metaschedule import tune_library
    from steptp_env.workloads import get_workload

    torch.set_num_threads(threads)
    protocol = Protocol(threads=threads)
    workload = get_workload(uri, PRESET)
    start = workload.program
    model = CostModel.load(DEFAULT_MODEL_DIR)
    mode = args.mode if model.threads in (None, threads) else "measure"  # the model predicts its protocol only
    row: dict = {"uri": uri, "threads": threads, "agent": args.agent, "budget": args.budget, "mode": mode,
                 "max_steps": args.max_steps,
                 "code": code_version(), "cpu": cpu_description(), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp, ResultStore(Path(tmp) / "store.sqlite") as store:
        env = StepTPEnv(uri, PRESET, mode=mode, store=store, model=None if mode == "measure" else model,
                        protocol=protocol, max_steps=args.max_steps)
        began = time.perf_counter()
        result = get_agent(args.agent)(env, args.budget, args.seed)
        row["agent_wall_s"] = time.perf_counter() - began
        row["best_path"] = list(result.state.actions)
        best = Program.parse(result.best_leir, start.signature)
        row["best_leir"] = best.leir
    inputs = workload.make_inputs(protocol.seed)
    timers = {"start": lambda: kernel_seconds(start, workload, "llvm", protocol),
              "best": lambda: kernel_seconds(best, workload, "llvm", protocol),
              "eager": lambda: torch_seconds(workload, protocol)}
    if args.metaschedule:
        library = Path(tempfile.mkdtemp()) / "metaschedule.so"
        try:
            tuned = tune_library(start, library, trials=args.ms_trials, threads=threads, seed=args.seed)
        except Exception as exc:  # noqa: BLE001  (MetaSchedule's failure is a finding of the row, not the end of it)
            row["failures"] = [f"MetaSchedule: {' '.join(str(exc).split())[-400:]}"]
        else:
            row["ms_tuning_s"], row["ms_trials"] = tuned["tuning_s"], tuned["trials"]
            checked = measure(start, workload, "llvm", protocol, timing=False, library=str(library))
            row["ms_verified"] = checked.ok
            if checked.ok:
                timers["metaschedule"] = lambda: kernel_seconds(start, workload, "llvm", protocol, str(library))
            else:
                row["failures"] = [f"MetaSchedule's kernel failed verification: {checked.error}"]
    if args.compile:
        compiled = torch.compile(workload.module)
        began = time.perf_counter()
        with torch.inference_mode():
            compiled(*workload.torch_arguments(inputs))
        row["compile_s"] = time.perf_counter() - began
        timers["compiled"] = lambda: torch_seconds(workload, protocol, module=compiled)
    medians, failures = interleave(timers, args.rounds)
    row.update({f"{name}_s": medians.get(name) for name in TIMERS}, failures=row.get("failures", []) + failures,
               gemm_flops=gemm_flops(start) if uri in GEMMS else None, load_after=os.getloadavg())
    return row


def code_version() -> dict:
    """The commit (with `+dirty` when the tree has changes) and lowering version an item ran with."""
    from steptp_env.lower import LOWERING_VERSION

    def git(*command: str) -> str:
        return subprocess.run(["git", *command], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return {"commit": commit + ("+dirty" if git("status", "--porcelain", "--", "steptp_env", "agents") else ""),
            "lowering": LOWERING_VERSION}


def gemm_flops(program) -> int:
    """2 x the iterations of every `+`-reduction whose operand is a product of two tensor elements."""
    from steptp_env.ir.analysis import reduction
    from steptp_env.ir.ast import Access, BinOp, equations

    flops = 0
    for nest in program.nests:
        for loops, eq in equations(nest):
            red = reduction(loops, eq)
            operand = red.operand if red else None
            if red and red.op == "+" and isinstance(operand, BinOp) and operand.op == "*" and \
                    isinstance(operand.lhs, Access) and isinstance(operand.rhs, Access):
                flops += 2 * math.prod(l.extent for l in loops)
    return flops


# -- the machine's FMA peak ---------------------------------------------------------------------------


def fma_peak_gflops(runs: int = 5, iterations: int = 200_000_000) -> float:
    """Best of `runs` runs of the FMA microbenchmark, built for this CPU with the system C compiler."""
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "fma_peak"
        subprocess.run(["cc", "-O3", "-march=native", "-ffp-contract=fast", str(FMA_SOURCE), "-o", str(binary)],
                       check=True)
        return max(float(subprocess.run([str(binary), str(iterations)], check=True, capture_output=True,
                                        text=True).stdout.split()[0]) for _ in range(runs))


# -- the report ---------------------------------------------------------------------------------------


NOT_RECORDED = "not recorded"


def _rows(cpu: str) -> tuple[list[dict], list[dict]]:
    """The last record of every (workload, threads) item taken on processor `cpu`, in SUBSET order, and the
    FMA peak records of that processor (records from before processors were recorded: `NOT_RECORDED`)."""
    items: dict[tuple[str, int], dict] = {}
    peaks = []
    for record in _records():
        if record["cpu"] != cpu:
            continue
        if record.get("kind") == "fma_peak":
            peaks.append(record)
        else:
            items.pop((record["uri"], record["threads"]), None)
            items[(record["uri"], record["threads"])] = record
    order = {uri: k for k, uri in enumerate(SUBSET)}
    return sorted(items.values(), key=lambda r: order.get(r["uri"], len(order))), peaks


def _processors() -> list[str]:
    """This machine's processor, then the others that records name."""
    here = cpu_description()
    return [here] + sorted({r["cpu"] for r in _records()} - {here})


def _records() -> list[dict]:
    records = [json.loads(line) for line in PROGRESS.read_text().splitlines()] if PROGRESS.exists() else []
    for record in records:
        record.setdefault("cpu", NOT_RECORDED)
    return records


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _geomean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.geometric_mean(kept) if kept else None


def report() -> str:
    """One section per processor (this machine's first): runtimes and peaks of two processors never meet in
    a table or a mean."""
    lines = ["# The environment's programs against PyTorch, torch.compile and MetaSchedule", "",
             f"Written by `benchmarks/vs_pytorch.py` from `{PROGRESS.name}`. Ratios are time / PyTorch eager called "
             "directly (below 1: faster than PyTorch). Every figure of a row was timed in one process, in turn, "
             "medians of rounds; 'best' is the standard agent's best program. PyTorch's allocator is held at its "
             "steady state (no page faults on its outputs: `agents.compare.steady_allocator`). One section per "
             f"processor, this machine's ({os.cpu_count()} CPUs) first; preset `{PRESET}`.", ""]
    for cpu in _processors():
        items, peaks = _rows(cpu)
        if items or peaks:
            lines += _processor_section(cpu, items, peaks[-1] if peaks else None)
    return "\n".join(lines)


def _processor_section(cpu: str, items: list[dict], peak: dict | None) -> list[str]:
    lines = [f"## Processor: {cpu} ({len(items)} items)", ""]
    if peak:
        lines += [f"- single-core float32 FMA peak: {peak['gflops']:.1f} GFLOP/s (benchmarks/native/fma_peak.c, "
                  f"best of 5, load {peak['load'][0]:.2f}, {peak['date']})"]
    codes: dict[str, int] = {}
    for r in items:
        code = r.get("code") or {"commit": "not recorded", "lowering": "2"}
        key = f"commit {code['commit']}, lowering {code['lowering']}"
        codes[key] = codes.get(key, 0) + 1
    lines += [f"- code: {'; '.join(f'{key} ({n} items)' for key, n in codes.items()) or 'no items yet'}", ""]
    for threads, agent in _runs(items):
        mine = [r for r in items if (r["threads"], r["agent"]) == (threads, agent)]
        depth = mine[0].get("max_steps", UNRECORDED_MAX_STEPS)
        lines += [f"### {threads} thread{'s' if threads > 1 else ''}: {agent}, {mine[0]['mode']} mode, budget "
                  f"{mine[0]['budget']}, episodes of at most {depth} steps", "",
                  "| workload | start ms | best ms | MetaSchedule ms | eager ms | compiled ms | compile s | "
                  "best/eager | best/compiled | best/MetaSchedule | start/best | GEMM % of peak | agent s | "
                  "tuning s | load before/after |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            fraction = None
            if r.get("gemm_flops") and r.get("best_s") and peak:
                fraction = 100 * r["gemm_flops"] / r["best_s"] / (peak["gflops"] * 1e9)
            lines.append(
                f"| {r['uri']} | {_ms(r.get('start_s'))} | {_ms(r.get('best_s'))} | {_ms(r.get('metaschedule_s'))} "
                f"| {_ms(r.get('eager_s'))} | {_ms(r.get('compiled_s'))} | {_fmt(r.get('compile_s'), 1)} | "
                f"{_fmt(_ratio(r.get('best_s'), r.get('eager_s')))} | "
                f"{_fmt(_ratio(r.get('best_s'), r.get('compiled_s')))} | "
                f"{_fmt(_ratio(r.get('best_s'), r.get('metaschedule_s')))} | "
                f"{_fmt(_ratio(r.get('start_s'), r.get('best_s')), 1)} | {_fmt(fraction, 0)} | "
                f"{r['agent_wall_s']:.0f} | {_fmt(r.get('ms_tuning_s'), 0)} | "
                f"{r['load_before'][0]:.2f}/{r['load_after'][0]:.2f} |")
        kernels = [r for r in mine if "matmul" in r["uri"] or "conv" in r["uri"] or "gemm" in r["uri"]]
        lines += ["", "| geometric mean | value | over |", "|---|---|---|"]
        for label, numerator, denominator, rows in (
                ("best / PyTorch eager", "best_s", "eager_s", mine),
                ("best / torch.compile", "best_s", "compiled_s", mine),
                ("best / MetaSchedule, matmuls and convs", "best_s", "metaschedule_s", kernels),
                ("start / best", "start_s", "best_s", mine)):
            mean = _geomean([_ratio(r.get(numerator), r.get(denominator)) for r in rows])
            lines.append(f"| {label} | {_fmt(mean)} | {len(rows)} workloads |")
        lines.append("")
        problems = [r for r in mine if r.get("failures") or r.get("ms_matches_start") is False]
        for r in problems:
            differs = " MetaSchedule output differs from the start program" if r.get("ms_matches_start") is False else ""
            lines.append(f"- {r['uri']}: {'; '.join(r.get('failures') or [])}{differs}")
        lines += ["", "Best episodes:", ""]
        lines += [f"- {r['uri']}: {' -> '.join(r['best_path']) or '(start program)'}" for r in mine]
        lines.append("")
    return lines


def plot(path: Path) -> None:
    """Log-scale time / PyTorch eager per workload: start, best, MetaSchedule and torch.compile (this
    machine's items, or those of the first processor that has some)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = next((found for cpu in _processors() if (found := _rows(cpu)[0])), [])
    runs = _runs(items)
    if not runs:
        return
    figure, axes = plt.subplots(len(runs), 1, figsize=(14, 5 * len(runs)), squeeze=False)
    for axis, (threads, agent) in zip(axes[:, 0], runs):
        mine = [r for r in items if (r["threads"], r["agent"]) == (threads, agent)]
        names = [r["uri"].split("/", 1)[1] for r in mine]
        width = 0.2
        for k, (key, label) in enumerate((("start_s", "start program"), ("best_s", "best program"),
                                          ("metaschedule_s", "MetaSchedule"), ("compiled_s", "torch.compile"))):
            values = [_ratio(r.get(key), r.get("eager_s")) or float("nan") for r in mine]
            axis.bar([i + (k - 1.5) * width for i in range(len(mine))], values, width, label=label)
        axis.axhline(1.0, color="black", linewidth=1)
        axis.set_yscale("log")
        axis.set_xticks(range(len(mine)), names, rotation=60, ha="right", fontsize=8)
        axis.set_ylabel("time / PyTorch eager")
        axis.set_title(f"{threads} thread{'s' if threads > 1 else ''}, {agent} (below the line: faster than PyTorch)")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _write_report() -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "vs_pytorch.md").write_text(report())
    plot(RESULTS / "vs_pytorch.png")


# -- driver -------------------------------------------------------------------------------------------


def _done() -> set[tuple[str, int, str]]:
    return {(r["uri"], r["threads"], r["agent"]) for r in _rows(cpu_description())[0]}


def _runs(items: list[dict]) -> list[tuple[int, str]]:
    """(threads, agent) of a processor's items, fewest threads first, agents in the order they first ran: a
    table and a plot each, so two standard agents never share a mean."""
    return sorted(dict.fromkeys((r["threads"], r["agent"]) for r in items), key=lambda run: run[0])


def _append(record: dict) -> None:
    PROGRESS.parent.mkdir(parents=True, exist_ok=True)
    with PROGRESS.open("a") as f:
        f.write(json.dumps(record) + "\n")


def _child(uri: str, threads: int, argv: list[str]) -> dict:
    """Run one item in a fresh process with TVM_NUM_THREADS set; its last stdout line is the row."""
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, __file__, "--item", uri, "--item-threads", str(threads), *argv],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"uri": uri, "threads": threads, "error": proc.stderr.strip()[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--workloads", nargs="+", default=SUBSET)
    parser.add_argument("--agent", default="focus")
    parser.add_argument("--mode", default="hybrid", choices=["hybrid", "measure"])
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=64,
                        help="the episode's step limit, the depth limit of the search (the env's default is 32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ms-trials", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-metaschedule", dest="metaschedule", action="store_false")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--redo", action="store_true", help="measure the named items again even if recorded")
    parser.add_argument("--report-only", action="store_true", help="rewrite the .md and .png from the progress file")
    parser.add_argument("--item", help=argparse.SUPPRESS)
    parser.add_argument("--item-threads", type=int, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _arguments().parse_args(argv)
    if args.item:
        print(json.dumps(run_item(args.item, args.item_threads, args)))
        return 0
    if args.report_only:
        _write_report()
        return 0
    shared = [f"--agent={args.agent}", f"--mode={args.mode}", f"--budget={args.budget}", f"--seed={args.seed}",
              f"--max-steps={args.max_steps}",
              f"--ms-trials={args.ms_trials}", f"--rounds={args.rounds}"]
    shared += [] if args.metaschedule else ["--no-metaschedule"]
    shared += [] if args.compile else ["--no-compile"]
    _append({"kind": "fma_peak", "gflops": fma_peak_gflops(), "load": os.getloadavg(),
             "date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_description()})
    failed = 0
    for threads in args.threads:
        for uri in args.workloads:
            if not args.redo and (uri, threads, args.agent) in _done():
                continue
            row = _child(uri, threads, shared)
            if "error" in row:
                failed += 1
                print(f"{uri} at {threads} threads failed: {row['error'][-500:]}", flush=True)
                continue
            _append(row)
            _write_report()
            print(f"{uri} at {threads} threads: best/eager {_fmt(_ratio(row.get('best_s'), row.get('eager_s')))}, "
                  f"load {row['load_after'][0]:.2f}", flush=True)
    _write_report()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
