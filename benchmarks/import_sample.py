"""Import the Step-TP chat-row sample: how many rows of implemented strategies import and verify?

Runs `steptp_env.data.importer.import_rows` on ../shared/steptp-ref/chat_rows_sample.jsonl (every row,
whatever its size, unless --max-iterations is given; rows too large for the machine's memory are labelled
only), a few rows at a time with each row's outcome appended to import_sample.progress.jsonl so that a
stopped run resumes, then checks which accepted rows the replay agent can
replay (their action is a candidate of the program, not an action `identify` inferred beyond the menu).
Writes a per-strategy table and every rejected row with its reason to benchmarks/results/import_sample.md,
and each row's outcome to import_sample.json. Rows whose answer only respells the prompt's program (the
reference labels `1e-05` -> `1.0e-5` a cancellation) are counted apart as well as in the total.

    python benchmarks/import_sample.py [--workers 2] [--limit N] [--max-iterations N] [--rows 3,17]
"""
from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

from results_file import write_keeping_notes

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT.parent / "shared" / "steptp-ref" / "chat_rows_sample.jsonl"
NOTES = "## Causes (written by hand)"
"""The hand-written analysis below this heading in the results file is kept when the figures are rewritten."""


def replayable(record: dict) -> bool:
    """Whether the replay agent can take this step: its action is among the candidates of the env's target."""
    from steptp_env.data.importer import replay_target
    from steptp_env.ir.program import Program
    from steptp_env.strategies import Action, get_strategy

    before = Program.parse(record["before"]["leir"], record["before"]["signature"])
    _, state = replay_target(record)
    return Action.parse(record["action"]) in get_strategy(record["strategy"]).candidates(before, state.target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="only the first N rows")
    parser.add_argument("--max-iterations", type=float, default=None,
                        help="do not verify rows whose programs run more loop iterations (they count apart)")
    parser.add_argument("--run-timeout", type=float, default=600.0,
                        help="seconds a verification run may take (rows over 1e10 iterations get more)")
    parser.add_argument("--rows", default="", help="only these rows (comma-separated numbers in the sample), "
                        "reported in import_sample_rows.md; the full run's files are left as they are")
    args = parser.parse_args()
    from steptp_env.data.importer import STATUSES, import_rows
    from steptp_env.measure import Protocol

    start = time.perf_counter()
    stem = "import_sample_rows" if args.rows else "import_sample"
    out = ROOT / "benchmarks" / "results" / f"{stem}.md"
    # one line per finished row, so a run that is stopped (or killed for memory) resumes where it was;
    # delete the file to start over after the importer or the strategies change
    progress = out.with_suffix(".progress.jsonl")
    done = {e["row"]: e for e in map(json.loads, progress.read_text().splitlines())} if progress.exists() else {}
    lines = SAMPLE.read_text().splitlines()[:args.limit]
    numbers = [int(n) for n in args.rows.split(",") if n] or list(range(len(lines)))
    todo = [n for n in numbers if n not in done]
    print(f"{len(numbers) - len(todo)} rows already done, {len(todo)} to go", flush=True)
    protocol = Protocol(threads=1, run_timeout=args.run_timeout)
    with progress.open("a") as log:
        for at in range(0, len(todo), max(1, args.workers)):
            chunk = todo[at:at + max(1, args.workers)]
            results = import_rows([json.loads(lines[n]) for n in chunk], workers=args.workers,
                                  max_iterations=args.max_iterations, protocol=protocol)
            for number, r in zip(chunk, results):
                done[number] = {"row": number, "strategy": r.strategy, "status": r.status, "reason": r.reason,
                                "replayable": r.record is not None and replayable(r.record)}
                log.write(json.dumps(done[number], sort_keys=True) + "\n")
                log.flush()
                print(f"row {number} ({r.strategy}): {r.status} {r.reason[:120]}", flush=True)
    elapsed = time.perf_counter() - start
    outcomes = [done[n] for n in numbers]
    per = collections.defaultdict(collections.Counter)
    for o in outcomes:
        per[o["strategy"]][o["status"]] += 1
        per[o["strategy"]]["cosmetic"] += o["reason"].startswith("cosmetic only")
        per[o["strategy"]]["replayable"] += o["replayable"]
    implemented = [o for o in outcomes if o["status"] != "unimplemented"]
    labelled = [o for o in implemented if o["status"] != "failed" or o["reason"].startswith("not equivalent")]
    checked = [o for o in labelled if o["status"] != "unverified"]
    ok = sum(o["status"] == "ok" for o in checked)
    cosmetic = sum(o["reason"].startswith("cosmetic only") for o in implemented)
    share, real_share = len(labelled) / max(1, len(implemented)), len(labelled) / max(1, len(implemented) - cosmetic)
    text = [f"# Import of chat_rows_sample.jsonl" + (f" (rows {args.rows} only)" if args.rows else "") + "\n",
            f"{len(outcomes)} rows, {len(implemented)} of strategies implemented here. Their programs parse and "
            f"`identify` confirms the label of **{len(labelled)} ({share:.1%})**; {cosmetic} rows are the "
            f"reference's cosmetic-only respellings, which no strategy here offers: without those, "
            f"**{len(labelled)}/{len(implemented) - cosmetic} = {real_share:.1%}**. Of the confirmed rows, "
            f"**{ok}/{len(checked)} verify** equivalent to their original program"
            + (f"; {len(labelled) - len(checked)} were too large to verify here (listed below)"
               if len(labelled) > len(checked) else "")
            + f". {len(outcomes) - len(implemented)} rows of unimplemented strategies. The last run took "
            f"{elapsed:.0f} s with {args.workers} worker(s) for {len(todo)} rows (the others were done by "
            f"earlier runs, {progress.name}).\n",
            "Replayable: accepted rows whose action is a candidate of the program, which `agents.replay` can "
            "replay; the others carry parameters `identify` inferred beyond the candidate menu (env.apply "
            "replays those).\n",
            "| strategy | rows | ok | failed | of which cosmetic only | unverified (too large) | unimplemented "
            "| replayable |", "|---|---|---|---|---|---|---|---|"]
    for name in sorted(per, key=str):
        c = per[name]
        text.append(f"| {name} | {sum(c[k] for k in STATUSES)} | {c['ok']} | {c['failed']} | {c['cosmetic']} | "
                    f"{c['unverified']} | {c['unimplemented']} | {c['replayable']} |")
    text += ["", "## Rows of implemented strategies that did not import", ""]
    text += [f"- row {o['row']} ({o['strategy']}): {o['reason']}" for o in implemented if o["status"] == "failed"] \
        or ["- none"]
    text += ["", "## Rows labelled but too large to verify here", ""]
    text += [f"- row {o['row']} ({o['strategy']}): {o['reason']}" for o in implemented
             if o["status"] == "unverified"] or ["- none"]
    write_keeping_notes(out, "\n".join(text), NOTES)
    print("\n".join(text))
    summary = {"rows": len(outcomes), "implemented": len(implemented), "labels_confirmed": len(labelled),
               "share": share, "cosmetic_only": cosmetic, "share_without_cosmetic": real_share,
               "verified": len(checked), "ok": ok, "elapsed_s": elapsed, "outcomes": outcomes}
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "outcomes"}))


if __name__ == "__main__":
    main()
