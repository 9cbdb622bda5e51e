"""Fuzz the environment in all three modes: nothing a policy sends may escape `step` or `reset` as an
exception or leave a state that does not replay, and a measurement worker killed mid-step costs one step.

    PYTHONPATH=. python benchmarks/fuzz_env.py [--actions 5000] [--workloads 40] [--kills 6] [--seed 0]
                                               [--modes model hybrid measure]

Workloads: the first `--workloads` suite URIs in a seeded order, preset `tiny`. For every mode (model, hybrid,
measure) and workload, an env (index action mode for even workloads, text for odd ones) takes its share of
`--actions` (rounded up, so the modes together take at least that many): 20% garbage
(`steptp_env.env.fuzz.bad_action`), 40% catalog indices of legal candidates, 20% candidate action texts, 20%
Step-TP answers (`{"transformed_IR": ..., "applied_strategy": ...}` of a candidate's result). Stop ends an
episode; after every episode (and at the end) its state is replayed by a fresh model-mode env and must reach
the same program. The process's resident memory is sampled after every workload. Then, in measure mode,
`--kills` steps each have the measurement worker SIGKILLed 50 ms into the step: that step may fail
(info["error"]), the next step must work.

A run may take some of the modes (`--modes`; `--kills 0` skips the kill steps): each mode's tally (and the
kills') is kept in benchmarks/results/fuzz_env.json with the commit it ran at, and the report shows every
part recorded there, so the full run can be spread over several sessions with the same arguments. Each
mode draws from its own seeded generator, so a mode's actions do not depend on which others ran.

Writes benchmarks/results/fuzz_env.md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import psutil

from steptp_env.env import STOP, StepTPEnv
from steptp_env.env.fuzz import bad_action
from steptp_env.strategies import apply_action
from steptp_env.workloads import list_workloads

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("model", "hybrid", "measure")


def legal_action(rng: np.random.Generator, env: StepTPEnv, kind: str) -> object:
    """A legal candidate of the current program as a catalog index, an action text or a Step-TP answer."""
    legal = np.flatnonzero(env.action_masks()[1:]) + 1
    if not len(legal):
        return STOP
    index = int(rng.choice(legal))
    if kind == "index":
        return index
    action = env.catalog.decode(index, env.groups)
    if kind == "text":
        return action.text
    after = apply_action(env.program, action)
    return json.dumps({"transformed_IR": after.leir, "applied_strategy": action.strategy})


def choose(rng: np.random.Generator, env: StepTPEnv) -> tuple[str, object]:
    draw = rng.random()
    if draw < 0.2:
        action = bad_action(rng, env)
        if env.action_mode == "text" and not isinstance(action, str):
            action = str(action)
        return "garbage", action
    kind = "index" if draw < 0.6 else "text" if draw < 0.8 else "answer"
    if env.action_mode == "text" and kind == "index":
        kind = "text"
    return kind, legal_action(rng, env, kind)


class Tally:
    def __init__(self) -> None:
        self.actions = 0
        self.by_kind: dict[str, int] = {}
        self.errors = 0
        self.escaped: list[str] = []
        self.episodes = 0
        self.corrupt: list[str] = []
        self.rss_mb: list[float] = []


def check_replay(env: StepTPEnv, replayer: StepTPEnv, tally: Tally) -> None:
    state = env.state
    tally.episodes += 1
    try:
        replayer.apply(state)
        if replayer.program.leir != env.program.leir:
            tally.corrupt.append(f"{state.workload} ({env.oracle.mode}): replay of {len(state.actions)} actions "
                                 "reached another program")
    except Exception as exc:  # noqa: BLE001  (a failed replay is a corruption to report, not a crash)
        tally.corrupt.append(f"{state.workload} ({env.oracle.mode}): replay failed: {type(exc).__name__}: {exc}")


def fuzz_workload(uri: str, mode: str, action_mode: str, count: int, rng: np.random.Generator, store: Path,
                  tally: Tally) -> None:
    try:
        env = StepTPEnv(uri, "tiny", mode=mode, action_mode=action_mode, store=store, max_steps=12)
        replayer = StepTPEnv(uri, "tiny", mode="model", store=store, max_steps=12)
        env.reset(seed=int(rng.integers(1 << 30)))
    except Exception:  # noqa: BLE001
        tally.escaped.append(f"{uri} ({mode}) reset: {traceback.format_exc(limit=3)}")
        return
    for _ in range(count):
        kind, action = choose(rng, env)
        tally.actions += 1
        tally.by_kind[kind] = tally.by_kind.get(kind, 0) + 1
        before = env.program.leir
        try:
            _, _, terminated, truncated, info = env.step(action)
        except Exception:  # noqa: BLE001
            tally.escaped.append(f"{uri} ({mode}) step {str(action)[:80]!r}: {traceback.format_exc(limit=3)}")
            continue
        if info["error"] is not None:
            tally.errors += 1
            if env.program.leir != before:
                tally.corrupt.append(f"{uri} ({mode}): a rejected step changed the program")
        if terminated or truncated:
            check_replay(env, replayer, tally)
            try:
                env.reset(seed=int(rng.integers(1 << 30)))
            except Exception:  # noqa: BLE001
                tally.escaped.append(f"{uri} ({mode}) reset: {traceback.format_exc(limit=3)}")
                return
    check_replay(env, replayer, tally)
    env.close()
    replayer.close()


def kill_workers_after(delay: float) -> threading.Timer:
    """SIGKILL every child process of this one (the measurement workers) `delay` seconds from now."""
    def kill() -> None:
        for child in psutil.Process().children(recursive=True):
            try:
                child.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass

    timer = threading.Timer(delay, kill)
    timer.start()
    return timer


def kills(count: int, store: Path, rng: np.random.Generator) -> list[dict]:
    """Steps whose measurement worker is killed mid-way, each followed by a normal step."""
    found = []
    env = StepTPEnv("level1/matmul", "tiny", mode="measure", store=store, max_steps=100)
    env.reset(seed=0)
    for _ in range(count):
        legal = np.flatnonzero(env.action_masks()[1:]) + 1
        fresh = [int(i) for i in legal if env.catalog.decode(int(i), env.groups).text not in env.state.actions]
        index = int(rng.choice(fresh or list(legal)))
        timer = kill_workers_after(0.05)
        try:
            _, _, _, _, killed = env.step(index)
            escaped = None
        except Exception as exc:  # noqa: BLE001
            killed, escaped = {"error": None}, f"{type(exc).__name__}: {exc}"
        timer.cancel()
        legal = np.flatnonzero(env.action_masks()[1:]) + 1
        _, _, _, _, after = env.step(int(rng.choice(legal)))
        found.append({"killed_step_error": killed["error"], "escaped": escaped, "next_step_error": after["error"]})
    env.close()
    return found


def commit() -> str:
    """The commit this run's code is at (`+dirty` with uncommitted changes)."""
    def git(*command: str) -> str:
        return subprocess.run(["git", *command], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                              text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--", "steptp_env", "agents", "benchmarks/fuzz_env.py")
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+dirty" if dirty else "")


def report(args: argparse.Namespace, parts: dict) -> str:
    modes = {m: parts[m] for m in MODES if m in parts}
    total = sum(t["actions"] for t in modes.values())
    escaped = sum(len(t["escaped"]) for t in modes.values())
    corrupt = sum(len(t["corrupt"]) for t in modes.values())
    lines = ["# Environment fuzzing", "",
             f"Written by `benchmarks/fuzz_env.py --actions {args.actions} --workloads {args.workloads} --seed "
             f"{args.seed}` (one run per part, `--modes`): {total} actions over {args.workloads} workloads "
             f"(preset tiny) in the modes {', '.join(modes) or 'none yet'}; missing: "
             f"{', '.join(m for m in MODES if m not in modes) or 'none'}.",
             "", "| mode | commit | minutes | load at start | actions | garbage / index / text / answer | "
             "rejected (penalty) | escaped exceptions | episodes replayed | replays reaching another program | "
             "resident MB min / max |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, t in modes.items():
        kinds = " / ".join(str(t["by_kind"].get(k, 0)) for k in ("garbage", "index", "text", "answer"))
        rss = f"{min(t['rss_mb']):.0f} / {max(t['rss_mb']):.0f}" if t["rss_mb"] else "-"
        lines.append(f"| {mode} | {t['commit']} | {t['seconds'] / 60:.1f} | {t['load'][0]:.2f} | {t['actions']} | "
                     f"{kinds} | {t['rejected']} | {len(t['escaped'])} | {t['episodes']} | {len(t['corrupt'])} | "
                     f"{rss} |")
    lines += ["", f"Total: {escaped} exceptions escaped `step`/`reset`, {corrupt} state corruptions.", ""]
    killed = parts.get("kills")
    if killed:
        ok = sum(1 for k in killed["steps"] if k["escaped"] is None and k["next_step_error"] is None)
        lines += [f"Measurement worker SIGKILLed 50 ms into a measure-mode step, {len(killed['steps'])} times "
                  f"(commit {killed['commit']}): {ok} times the step returned (with or without an error) and the "
                  "next step worked.", ""]
        lines += [f"- killed step: {k['killed_step_error'] or 'no error (finished before the kill)'}; next step: "
                  f"{k['next_step_error'] or 'ok'}" + (f"; ESCAPED {k['escaped']}" if k["escaped"] else "")
                  for k in killed["steps"]]
    for mode, t in modes.items():
        for item in t["escaped"][:5] + t["corrupt"][:5]:
            lines += ["", f"- {mode}: {item}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actions", type=int, default=5000)
    parser.add_argument("--workloads", type=int, default=40)
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args()
    uris = list_workloads()
    random.Random(args.seed).shuffle(uris)
    uris = uris[:args.workloads]
    per_pair = -(-args.actions // (len(MODES) * len(uris)))  # rounded up: the three modes hold at least --actions
    path = RESULTS / "fuzz_env.json"
    parts = json.loads(path.read_text()).get("parts", {}) if path.exists() else {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            rng = np.random.default_rng([args.seed, MODES.index(mode)])
            tally, load, began, code = Tally(), os.getloadavg(), time.monotonic(), commit()
            for k, uri in enumerate(uris):
                fuzz_workload(uri, mode, "index" if k % 2 == 0 else "text", per_pair, rng,
                              Path(tmp) / "store.sqlite", tally)
                tally.rss_mb.append(psutil.Process().memory_info().rss / 2**20)
                print(f"{mode} {k + 1}/{len(uris)} {uri}: {tally.actions} actions, "
                      f"{len(tally.escaped)} escaped, {len(tally.corrupt)} corrupt", flush=True)
            parts[mode] = {"actions": tally.actions, "by_kind": tally.by_kind, "rejected": tally.errors,
                           "escaped": tally.escaped, "episodes": tally.episodes, "corrupt": tally.corrupt,
                           "rss_mb": tally.rss_mb, "seconds": time.monotonic() - began, "load": load,
                           "commit": code, "per_workload": per_pair}
            path.write_text(json.dumps({"args": vars(args), "parts": parts}, indent=1) + "\n")
        if args.kills:
            steps = kills(args.kills, Path(tmp) / "kills.sqlite", np.random.default_rng([args.seed, len(MODES)]))
            parts["kills"] = {"steps": steps, "commit": commit()}
            path.write_text(json.dumps({"args": vars(args), "parts": parts}, indent=1) + "\n")
    (RESULTS / "fuzz_env.md").write_text(report(args, parts))
    return 1 if any(parts[m]["escaped"] or parts[m]["corrupt"] for m in MODES if m in parts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
