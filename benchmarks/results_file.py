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


def cpu_description() -> str:
    """The processor a figure was taken on, from /proc/cpuinfo ('AMD EPYC, family 26 model 2'): runtimes and
    peaks from different processors must not meet in one table or mean. `platform.processor()` where
    /proc/cpuinfo is missing."""
    import platform

    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if not sep:
                break  # the first processor's block ends at a blank line
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown"
    name = fields.get("model name", platform.processor() or "unknown")
    return f"{name}, family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
