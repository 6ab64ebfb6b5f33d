"""The streaming path as a ``torch.utils.data`` Dataset: item ``(epoch, sample)`` -> that sample's cropped views.

:class:`StreamViews` is map-style, addressed by sample number, so the order stays kontrast's: the
:class:`RunBatches` sampler yields every step's batch of ``(epoch, sample)`` pairs from the global permutation
of (seed, epoch) (:func:`kontrast.data.batch_indices`, the memory path's order), starting at any step (mid-epoch
resume) and, on W ranks, only this rank's slice of each global batch (a rank reads only its own samples). The
DataLoader's workers decode (:mod:`kontrast.data.stream_decode`); each view's crop is keyed by
(seed, epoch, sample, view), so the batches are the same for any number of workers.

A sample whose bytes fail to decode mid-epoch (what the header pass cannot see) comes back marked: under
strict handling the batch carries ``bad`` and the training loop stops before the step; with ``skip_bad_images``
it is replaced by another sample drawn from (seed, epoch, sample) (:func:`replacement`), decoded with the
bad sample's own crop keys and kept under its number, and the batch lists it in ``replaced``. Shards at a URL
that cannot be read (:class:`~kontrast.data.remote.Unreachable`: the storage failed after its retries, not the
image) stop the run either way: it resumes where it stopped once the storage answers. A worker never
raises for a bad file (its traceback would reach the user): it marks the sample, and the loop says what is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset, Sampler

from kontrast.augment.rng import derive_key
from kontrast.augment.views import ViewSpec
from kontrast.data.batches import batch_indices
from kontrast.data.remote import Unreachable
from kontrast.data.stream_decode import batch_crop_boxes, decode_crops, decode_views, image_size
from kontrast.data.stream_source import StreamSource

MAX_REPLACEMENTS = 16  # tries for a readable stand-in before the run stops


def replacement(seed: int, epoch: int, sample: int, attempt: int, n: int) -> int:
    """The stand-in for bad sample ``sample`` in ``epoch`` (try ``attempt``): a pure function, never itself."""
    j = derive_key("replace", seed, epoch, sample, attempt) % max(n - 1, 1)
    return j + (j >= sample) if n > 1 else sample


@dataclass
class StreamItem:
    sample: int  # the sample number (kept for the replaced one too: its crop keys and the method's index)
    views: list[torch.Tensor] | None  # uint8 [3, S_v, S_v] per view; None when bad and not replaced
    bad: tuple[str, str] | None = None  # (file, reason) of a bad sample
    replaced_by: int | None = None


@dataclass
class StreamBatch:
    """One step's data on this rank, made by :func:`collate_views`."""

    indices: torch.Tensor  # int64 [b] sample numbers
    views: list[torch.Tensor]  # uint8 [b, 3, S_v, S_v] per view
    bad: list[tuple[str, str]] = field(default_factory=list)  # strict: (file, reason) of unreadable samples
    replaced: list[tuple[str, str]] = field(default_factory=list)  # skip: (file, reason) of replaced samples

    def pin_memory(self) -> StreamBatch:
        self.views = [v.pin_memory() for v in self.views]
        return self


class StreamViews(Dataset):
    """``dataset[(epoch, i)]`` -> :class:`StreamItem`: sample ``i`` decoded at the recipe's crops for ``epoch``."""

    def __init__(self, source: StreamSource, specs: Sequence[ViewSpec], seed: int, skip_bad_images: bool = False):
        self.source, self.specs, self.seed, self.skip_bad = source, tuple(specs), seed, skip_bad_images

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, item: tuple[int, int]) -> StreamItem:
        return self.__getitems__([item])[0]

    def __getitems__(self, items: list[tuple[int, int]]) -> list[StreamItem]:
        """A batch at once (the DataLoader's batched fetch): the crop boxes of every readable sample are drawn in
        one pass (:func:`batch_crop_boxes`), then each image is decoded at its boxes."""
        datas = [self.source.read(i) for _, i in items]
        sizes = [d if isinstance(d, str) else image_size(d) for d in datas]  # (width, height) or why not
        boxes: dict[int, torch.Tensor] = {}  # position in items -> float [V, 4]
        for epoch in sorted({e for e, _ in items}):
            good = [k for k, (e, _) in enumerate(items) if e == epoch and not isinstance(sizes[k], str)]
            if good:
                drawn = batch_crop_boxes(self._key(epoch), torch.tensor([items[k][1] for k in good]),
                                         torch.tensor([sizes[k][1] for k in good]),
                                         torch.tensor([sizes[k][0] for k in good]), self.specs)  # [b, V, 4]
                boxes.update(zip(good, drawn))
        out = []
        for k, (epoch, i) in enumerate(items):
            views = sizes[k] if k not in boxes else decode_crops(datas[k], boxes[k], self.specs)
            out.append(StreamItem(i, views) if not isinstance(views, str) else self._bad(epoch, i, views))
        return out

    def _key(self, epoch: int) -> int:
        return derive_key("augment", self.seed, epoch)  # the epoch key of the device-side views

    def _bad(self, epoch: int, i: int, why: str) -> StreamItem:
        """Sample ``i`` failed: marked (strict), or replaced by a readable stand-in with its own crop keys (skip)."""
        bad = (self.source.locate(i), why)
        if not self.skip_bad or isinstance(why, Unreachable):
            return StreamItem(i, None, bad)
        for attempt in range(MAX_REPLACEMENTS):
            j = replacement(self.seed, epoch, i, attempt, len(self.source))
            data = self.source.read(j)
            views = data if isinstance(data, str) else decode_views(data, self._key(epoch), i, self.specs)
            if not isinstance(views, str):
                return StreamItem(i, views, bad, j)
        return StreamItem(i, None, (bad[0], f"{bad[1]}; and its {MAX_REPLACEMENTS} stand-ins were unreadable too"))


def collate_views(items: list[StreamItem], specs: Sequence[ViewSpec]) -> StreamBatch:
    """Stack a batch's items per view; a bad sample left unreplaced gets zeros (the loop stops before using it)."""
    batch = StreamBatch(torch.tensor([it.sample for it in items], dtype=torch.int64), [])
    for v, spec in enumerate(specs):
        blank = torch.zeros(3, spec.size, spec.size, dtype=torch.uint8)
        batch.views.append(torch.stack([blank if it.views is None else it.views[v] for it in items]))
    for it in items:
        if it.bad is not None:
            (batch.bad if it.views is None else batch.replaced).append(it.bad)
    return batch


class ViewCollate:
    """:func:`collate_views` for fixed specs, picklable (DataLoader workers may be spawned)."""

    def __init__(self, specs: Sequence[ViewSpec]):
        self.specs = tuple(specs)

    def __call__(self, items: list[StreamItem]) -> StreamBatch:
        return collate_views(items, self.specs)


class RunBatches(Sampler):
    """Every step's batch of ``(epoch, sample)`` pairs from step ``start`` to the end of the run.

    The global batch of step s is batch ``s % steps_per_epoch`` of epoch ``s // steps_per_epoch`` in
    :func:`batch_indices` (the memory path's order); on ``world`` ranks rank r keeps slice r of it.
    """

    def __init__(self, n: int, batch_size: int, seed: int, epochs: int, start: int = 0, rank: int = 0,
                 world: int = 1):
        self.n, self.batch_size, self.seed, self.epochs = n, batch_size, seed, epochs
        self.start, self.rank, self.world = start, rank, world
        self.steps_per_epoch = len(batch_indices(n, batch_size, 0, seed))

    def __len__(self) -> int:
        return max(0, self.epochs * self.steps_per_epoch - self.start)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        b = self.batch_size // self.world
        for epoch in range(self.start // self.steps_per_epoch, self.epochs):
            for i, batch in enumerate(batch_indices(self.n, self.batch_size, epoch, self.seed)):  # int64 [B] each
                if epoch * self.steps_per_epoch + i >= self.start:
                    yield [(epoch, s) for s in batch[self.rank * b:(self.rank + 1) * b].tolist()]
