"""Shared fixtures: the Step-TP reference corpus (../shared/steptp-ref, also present in CI)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

REF = Path(__file__).resolve().parents[1].parent / "shared" / "steptp-ref"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"reference corpus not found at {path}")
    return path


@pytest.fixture(scope="session")
def ref_programs() -> list[dict]:
    return [json.loads(line) for line in _need(REF / "programs.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def ref_transitions() -> list[dict]:
    with gzip.open(_need(REF / "transitions.jsonl.gz"), "rt") as f:
        return [json.loads(line) for line in f]
