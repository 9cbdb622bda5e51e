"""Writing a results file whose figures are regenerated while a hand-written analysis in it is kept."""
from __future__ import annotations

from pathlib import Path


def write_keeping_notes(path: Path, text: str, heading: str) -> None:
    """Write `text` to `path`, followed by the section of the old file that starts at `heading` (the
    hand-written part: it explains the figures and must survive a rerun)."""
    old = path.read_text() if path.exists() else ""
    notes = old[old.index(heading):] if heading in old else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n" + ("\n" + notes if notes else ""))
