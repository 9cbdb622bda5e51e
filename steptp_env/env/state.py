"""An episode as a small serialisable record, enough to replay it exactly (as CompilerGym's state)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_VERSION = 1


@dataclass
class EnvState:
    """Workload, preset, dtype and target; the accepted actions in order (action texts, or `leir:<text>` for
    a free-form rewrite no strategy explains) with their rewards; the wall time spent; and versions."""

    workload: str
    preset: str | None
    target: str
    mode: str
    dtype: str = "float32"
    actions: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    walltime: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    version: int = STATE_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvState:
        if data.get("version", STATE_VERSION) != STATE_VERSION:
            raise ValueError(f"state format v{data.get('version')} is not v{STATE_VERSION}")
        return cls(**data)

    def save(self, path: Path | str) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path | str) -> EnvState:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @property
    def total_return(self) -> float:
        return float(sum(self.rewards))
