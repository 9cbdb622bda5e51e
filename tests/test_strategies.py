"""The strategy machinery as a whole: every candidate is a correct program, chains stay correct, the
action set is deterministic, actions round-trip as text, bad actions are explained."""
from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import textwrap

import pytest

from steptp_env import IllegalActionError, verify
from steptp_env.strategies import REGISTRY, STRATEGY_NAMES, Action, apply_action, candidates, random_chain
from steptp_env.workloads import get_workload, list_workloads

FAMILY_23 = STRATEGY_NAMES[:23]


def suite_sample(count: int, seed: int) -> list[str]:
    uris = list_workloads()
    return sorted(random.Random(seed).sample(uris, count))


def test_the_23_loop_memory_and_graph_strategies_are_registered():
    assert set(FAMILY_23) <= set(REGISTRY)


def test_a_seeded_sample_of_500_candidates_all_verify_against_pytorch():
    rng = random.Random(7)
    pool = []
    for uri in suite_sample(60, seed=1):
        wl = get_workload(uri, preset="tiny")
        pool.extend((wl, action) for action in candidates(wl.program))
    by_strategy: dict[str, list] = {}
    for item in pool:
        by_strategy.setdefault(item[1].strategy, []).append(item)
    picked = []
    for name in sorted(by_strategy):  # every strategy represented, then fill up at random
        picked.extend(rng.sample(by_strategy[name], min(10, len(by_strategy[name]))))
    rest = [item for item in pool if item not in picked]
    picked.extend(rng.sample(rest, max(0, 500 - len(picked))))
    assert len(picked) >= 500
    failures = []
    for wl, action in picked:
        report = verify(apply_action(wl.program, action), wl, trials=1)
        if not report.equivalent:
            failures.append((wl.uri, action.text, report.reason))
    assert not failures, failures[:10]


def test_seeded_chains_of_ten_actions_stay_equivalent():
    rng = random.Random(11)
    failures = []
    for uri in suite_sample(30, seed=3):
        wl = get_workload(uri, preset="tiny")
        path = []
        program = random_chain(wl.program, rng, 10, path)
        report = verify(program, wl, trials=1)
        if not report.equivalent:
            failures.append((uri, path, report.reason))
    assert not failures, failures[:3]


def test_per_nest_candidate_cache_matches_a_cold_enumeration():
    """Along seeded chains (nests inserted, removed and shifted), the cached per-nest candidates equal
    the ones computed from scratch."""
    from steptp_env.strategies import base

    rng = random.Random(21)
    for uri in suite_sample(12, seed=13):
        program = get_workload(uri, preset="tiny").program
        for _ in range(6):
            for target in ("llvm", "cuda"):
                warm = candidates(program, target)
                base._NEST_CANDIDATES.clear()
                assert candidates(program, target) == warm, uri
            actions = candidates(program)
            if not actions:
                break
            program = apply_action(program, rng.choice(actions))


def test_candidate_texts_parse_back_to_equal_actions():
    for uri in suite_sample(20, seed=5):
        for action in candidates(get_workload(uri, preset="tiny").program):
            assert Action.parse(action.text) == action


DIGEST = textwrap.dedent("""
    import hashlib, sys
    from steptp_env.strategies import candidates
    from steptp_env.workloads import get_workload
    h = hashlib.sha256()
    for uri in sys.argv[1:]:
        program = get_workload(uri, preset="tiny").program
        for action in candidates(program):
            h.update(action.text.encode())
        for action in candidates(program, "cuda"):
            h.update(action.text.encode())
    print(h.hexdigest())
""")


def test_candidates_do_not_depend_on_the_hash_seed():
    uris = suite_sample(25, seed=9)
    digests = []
    for seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=os.getcwd())
        out = subprocess.run([sys.executable, "-c", DIGEST, *uris], env=env, capture_output=True, text=True,
                             check=True)
        digests.append(out.stdout.strip())
    here = hashlib.sha256()
    for uri in uris:
        program = get_workload(uri, preset="tiny").program
        for target in ("llvm", "cuda"):
            for action in candidates(program, target):
                here.update(action.text.encode())
    assert digests[0] == digests[1] == here.hexdigest()


@pytest.mark.parametrize("name", FAMILY_23)
def test_bad_actions_raise_illegal_action_error_with_a_reason(name):
    program = get_workload("level1/softmax", preset="tiny").program
    strategy = REGISTRY[name]
    bad = [Action(name, ()), Action("no_such_strategy", ()),
           Action.of(name, **{p: 9999 if p == "nest" else "Zz" for p in strategy.params})]
    for action in bad:
        with pytest.raises(IllegalActionError) as info:
            apply_action(program, action)
        assert str(info.value)
    with pytest.raises(IllegalActionError):
        apply_action(program, f"{name}(nest=[)")
