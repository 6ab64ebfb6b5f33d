"""What a run directory says about itself: its metric log, summary and newest checkpoint's state.

``metrics.jsonl`` (:class:`kontrast.train.rundir.MetricLog`) holds one JSON object per logged
step: training lines (``loss``, ``lr``, ``embedding_std``, ``mi_bound``, ...), kNN-monitor lines
(``knn_top1``) and warning lines (``warning``, ``message``). A line a crash cut short is skipped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Curve:
    """One panel of the training-curves figure: a metric of the log plotted against step."""

    key: str  # the metric's name in metrics.jsonl
    title: str
    ylabel: str
    log_y: bool = False


CURVES = (
    Curve("loss", "training loss", "loss"),
    Curve("lr", "learning rate", "lr"),
    Curve("knn_top1", "kNN top-1 on the test split", "top-1"),
    Curve("knn_val_top1", "kNN top-1 on the validation split (data.validation)", "top-1"),
    Curve("embedding_std", "embedding std (0 = collapsed)", "std"),
    Curve("mi_bound", "MI lower bound log N \u2212 L", "nats"),
)

FINAL_KEYS = ("loss", "knn_top1", "knn_val_top1", "embedding_std", "mi_bound", "img_per_s")  # shown as "final metrics"


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` in file order; ``[]`` when it is missing. Bad lines are skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), (int, float)):
            records.append(record)
    return records


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metric_series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over the records that hold a finite number for it."""
    steps, values = [], []
    for record in records:
        value = _number(record.get(key))
        if value is not None:
            steps.append(float(record["step"]))
            values.append(value)
    return steps, values


def final_metrics(records: list[dict]) -> dict[str, float]:
    """The last logged value of each of :data:`FINAL_KEYS` present in the log."""
    out = {}
    for key in FINAL_KEYS:
        _, values = metric_series(records, key)
        if values:
            out[key] = values[-1]
    return out


def warnings_of(records: list[dict]) -> list[str]:
    """The run's logged warnings (collapse, skipped steps, ...) as ``"step N: kind: message"``."""
    return [f"step {r['step']}: {r['warning']}: {r.get('message', '')}" for r in records if "warning" in r]


def read_json(path: str | Path) -> dict | None:
    """A JSON object file (``summary.json``, a checkpoint's ``state.json``), or None if absent or unreadable."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
