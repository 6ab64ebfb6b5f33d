"""What every source loads into (:class:`Samples`), and what a kind of source is (:class:`SourceKind`).

A :class:`Samples` is one whole split in memory, images or sequences, with one path (or key) per
row saying where the row came from, so a row can always be traced back to its file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kontrast.data.layout import HOLDOUT_EVERY
from kontrast.errors import UserError


@dataclass
class Samples:
    """A whole split in memory: what every other part of kontrast consumes.

    ``paths`` names each row's origin: for folders and archives the file's path relative to the
    source root (inside the archive for tars), for CIFAR pickles ``"data_batch_1/123"`` (file,
    row), for paired files the image path as written there, for the built-in datasets
    ``"shapes/train/000123"``. Left out (``None``) when built by hand, it becomes the row
    numbers ``"0"``, ``"1"``, ...
    """

    x: torch.Tensor  # uint8 images [N, 3, H, W] or float32 sequences [N, C, L]; CPU, contiguous
    labels: torch.Tensor | None  # int64 [N], None when unlabelled
    classes: list[str]  # class names ([] when unlabelled)
    name: str  # human-readable source description
    paths: list[str] = None  # type: ignore[assignment]  # one per row (see above)
    captions: list[str] | None = None  # one text per row (paired files, kontrast.data.pairs), else None
    layout: str = ""  # how a folder divides into splits (kontrast.data.layout): "splits", "holdout", "flat"; "" else

    def __post_init__(self) -> None:
        if self.paths is None:
            self.paths = [str(i) for i in range(len(self))]
        if len(self.paths) != len(self):
            raise ValueError(f"{self.name}: {len(self.paths)} paths for {len(self)} rows")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def subset(self, n: int, seed: int = 0) -> Samples:
        """A fixed random subset of ``n`` rows (sources are often sorted by class); self if n covers all."""
        if not 0 < n < len(self):
            return self
        return self.rows(torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:n])

    def rows(self, keep: torch.Tensor) -> Samples:
        """The rows ``keep`` (int64 [n]), in that order."""
        rows = keep.tolist()
        labels = None if self.labels is None else self.labels[keep]
        captions = None if self.captions is None else [self.captions[i] for i in rows]
        return Samples(self.x[keep], labels, self.classes, self.name, [self.paths[i] for i in rows], captions,
                       self.layout)

    def summary(self, of: int = 0, validation: int = 0) -> str:
        """One line for the start of a run: how many images, labelled or not, what is held out, the resolution.

        ``of``: the split's size before a ``data.limit`` subset (0: no subset); ``validation``: rows of it held out
        as the validation split (``data.validation``).
        """
        unit = "sequences" if self.x.ndim == 3 else "images"
        count = f"{len(self)} training {unit}" + (f" (a fixed random subset of {of})" if of > len(self) else "")
        count += f", {validation} more held out as the validation split" if validation else ""
        kind = f"labelled, {len(self.classes)} classes" if self.labels is not None else "unlabelled"
        held = {"holdout": f"class folders only: every {HOLDOUT_EVERY}th image of each class "
                           f"({100 // HOLDOUT_EVERY} %) is held out as the test split for `kontrast eval`",
                "splits": "the train split (the test/ or val/ folder is held out for `kontrast eval`)",
                "flat": "nothing held out (no labels)"}.get(self.layout, "the train split")
        c, *rest = self.x.shape[1:]
        pixels = (f"{c} channels x {rest[0]} steps" if self.x.ndim == 3
                  else f"{rest[0]}x{rest[1]} px")
        return f"data: {count} from {self.name}; {kind}; {held}; {pixels}"


@dataclass(frozen=True)
class SourceKind:
    """One kind of data source, as registered in :data:`kontrast.registry.SOURCES`.

    ``load_images`` asks the kinds in ``order`` (then by name) and loads with the first whose
    ``matches(source)`` is true. ``load(source, split, *, size, cache_dir, skip_bad_images)``
    returns the split as :class:`Samples`; it may ignore ``cache_dir`` and ``skip_bad_images``.
    """

    order: int  # 0: built-in names, 1: file suffixes, 2: what is on disk
    matches: Callable[[str], bool]  # cheap: looks at the string and at most stats the path
    load: Callable[..., Samples]


VALIDATION_SEED = 0x76616C69  # the validation rows' draw: one for every run of a source, whatever its train.seed


def split_validation(data, n: int):
    """``(training rows, validation rows)`` of a training split (:class:`Samples` or a streaming source, anything
    with ``rows``): a fixed random ``n`` rows held out, the same ones in every run of that source whatever its seed,
    each part in the source's order (``data.validation``); ``(data, None)`` when ``n`` is 0."""
    if n == 0:
        return data, None
    if n >= len(data):
        raise UserError(f"data.validation {n} would hold out all {len(data)} training images of {data.name}; "
                        "hold out fewer (a tenth is usual: 5000 of CIFAR-10's 50000)")
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(VALIDATION_SEED))  # [N]
    return data.rows(order[n:].sort().values), data.rows(order[:n].sort().values)
