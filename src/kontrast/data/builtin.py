"""The generated datasets as sources: ``"shapes"`` / ``"shapes:N"`` and ``"sequences"`` / ``"sequences:N"``.

N training items (default 10000, at least 5) with seed 0, and N // 5 test items with seed 1,
made afresh on every load (never cached): :mod:`kontrast.data.shapes` (uint8 images) and
:mod:`kontrast.data.sequences` (float32 ``[N, 1, T]``, not images). Row ``i`` of a split has the
path ``"shapes/train/000123"`` (``"sequences/test/..."``), so rows are named like files.
"""

from __future__ import annotations

from pathlib import Path

from kontrast.data.samples import Samples, SourceKind
from kontrast.data.sequences import SEQUENCE_CLASSES, make_sequences
from kontrast.data.shapes import SHAPE_CLASSES, make_shapes
from kontrast.errors import UserError
from kontrast.registry import SOURCES

SHAPES_TRAIN_DEFAULT = 10_000  # "shapes" = "shapes:10000"; test is always N // 5
SEQUENCES_TRAIN_DEFAULT = 10_000  # "sequences" = "sequences:10000"; test is N // 5
SHAPES_SEEDS = {"train": 0, "test": 1}  # also the sequences' seeds


def _is_shapes(source: str) -> bool:
    return source == "shapes" or source.startswith("shapes:")


def holds_sequences(source: str) -> bool:
    """Whether ``source`` is the built-in sequences (the only source of float sequences, not images)."""
    return source == "sequences" or source.startswith("sequences:")


def load_shapes(
    source: str, split: str, *, size: int, cache_dir: str | Path | None = None, skip_bad_images: bool = False
) -> Samples:
    """Generate the built-in dataset: N train images with seed 0, N // 5 test with seed 1."""
    n_train = _count(source, "shapes", SHAPES_TRAIN_DEFAULT, "train images")
    n = n_train if split == "train" else n_train // 5
    images, labels = make_shapes(n, seed=SHAPES_SEEDS[split], size=size)
    return Samples(images, labels, list(SHAPE_CLASSES), f"shapes:{n_train} ({split})", _keys("shapes", split, n))


def load_sequences(
    source: str, split: str, *, size: int = 0, cache_dir: str | Path | None = None, skip_bad_images: bool = False
) -> Samples:
    """The built-in sequences (:mod:`kontrast.data.sequences`): float32 ``[N, 1, T]``, not images."""
    n_train = _count(source, "sequences", SEQUENCES_TRAIN_DEFAULT, "training items")
    n = n_train if split == "train" else n_train // 5
    x, labels = make_sequences(n, seed=SHAPES_SEEDS[split])
    return Samples(x, labels, list(SEQUENCE_CLASSES), f"sequences:{n_train} ({split})",
                   _keys("sequences", split, n))


def _count(source: str, kind: str, default: int, items: str) -> int:
    """N from ``"kind:N"`` (``default`` for the bare name); at least 5 so the test split is not empty."""
    if source == kind:
        return default
    text = source.split(":", 1)[1]
    if not text.isdigit() or int(text) < 5:
        raise UserError(f"bad dataset {source!r}: write {kind}:N with N >= 5 {items}")
    return int(text)


def _keys(kind: str, split: str, n: int) -> list[str]:
    return [f"{kind}/{split}/{i:06d}" for i in range(n)]


SOURCES.register("shapes")(SourceKind(order=0, matches=_is_shapes, load=load_shapes))
SOURCES.register("sequences")(SourceKind(order=0, matches=holds_sequences, load=load_sequences))
