"""The run's data path: memory (the whole set decoded once, on the device) or stream (decoded per batch).

``data.mode``: ``memory`` is :func:`kontrast.data.load_images` (every image at ``data.size``, moved to the
device whole, views cut from it); ``stream`` reads an ImageFolder tree or tar shards sample by sample
(:mod:`kontrast.data.stream_source`), DataLoader workers (``data.workers``) decoding each batch with its
views' random resized crops taken from the full image (:mod:`kontrast.data.stream_dataset`), the rest of the
recipe applied on the device. ``auto`` (the default) keeps the memory path when the decoded set at
``data.size`` fits ``data.memory_budget`` (a fraction of RAM, and of the device's memory on a GPU), and
streams otherwise (folders and shards; :mod:`kontrast.data.shard_memory` reads shards into memory); sources
that only the memory path reads (archives, CIFAR pickles, built-in and paired sets) never stream. The choice
is written into the run's config, so a resume takes the same path whatever the machine.

Both paths order the data the same way (the global permutation of (seed, epoch)) and key every view by
(seed, epoch, sample, view), so the stream path resumes mid-epoch bit for bit, with any number of workers.
"""

from __future__ import annotations

import os
import signal
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from kontrast.config import Config
from kontrast.data import batch_indices, load_images, split_validation
from kontrast.data.cache import bytes_in_words
from kontrast.data.decode import read_regular_file
from kontrast.data.layout import list_files, plan_layout
from kontrast.data.remote import Unreachable, is_url
from kontrast.data.shard_index import open_shards
from kontrast.data.stream_dataset import RunBatches, StreamBatch, StreamViews, ViewCollate
from kontrast.data.stream_source import (
    StreamSource,
    is_folder_spec,
    is_shard_spec,
    open_stream,
    size_range,
    spread_sizes,
)
from kontrast.errors import UserError

MODES = ("auto", "memory", "stream")


@dataclass
class TrainData:
    """The training split as the loop uses it."""

    data: object  # Samples (memory) or StreamSource (stream): labels, classes, paths, name for methods and monitor
    line: str  # the start-up line

    @property
    def stream(self) -> StreamSource | None:
        return self.data if isinstance(self.data, StreamSource) else None

    def __len__(self) -> int:
        return len(self.data)


def _total_memory(device: torch.device) -> int:
    """Bytes the decoded set may be held in: RAM, and the device's memory on a GPU (the smaller)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if device.type == "cuda":
        return min(ram, torch.cuda.get_device_properties(device).total_memory)
    return ram


def choose_mode(cfg: Config, device: torch.device) -> tuple[Config, str]:
    """``cfg`` with ``data.mode`` decided (never ``auto``), and the reason in words for the start-up line."""
    dc = cfg.data
    if dc.mode != "auto":
        return cfg, f"data.mode={dc.mode}"
    if not (is_folder_spec(dc.source) or is_shard_spec(dc.source)):
        return replace(cfg, data=replace(dc, mode="memory")), "auto: this kind of source is read into memory"
    n = max(_train_count(dc) - dc.validation, 0)
    n = min(n, dc.limit) if dc.limit else n
    need, budget = n * 3 * dc.size * dc.size, dc.memory_budget * _total_memory(device)
    verdict = "fits" if need <= budget else "is over"
    why = (f"auto: {bytes_in_words(need)} decoded at {dc.size} px {verdict} data.memory_budget "
           f"({dc.memory_budget:g} of {bytes_in_words(_total_memory(device))})")
    return replace(cfg, data=replace(dc, mode="memory" if need <= budget else "stream")), why


AUTO_WORKERS = 2  # data.workers auto: the most decoding workers a run starts


def choose_workers(cfg: Config, device: torch.device) -> tuple[Config, str]:
    """``cfg`` with ``data.workers`` decided (never ``auto``), and the reason in words (empty when it was set).

    On a GPU the device computes and the CPU decodes beside it: 2 workers. On a CPU a worker only helps on a core the
    training threads leave free; on a busy core it takes turns with them, and with several processes the one a worker
    delays holds the others at the next collective. 2 processes x 1 thread on 2 cores, 1464 images of 96 px, batch
    128: 8.6 s with 2 workers each, 4.7 s decoding in the loop's process; one process of 2 threads, 3.47 s against
    3.42 s (docs/lab/performance.md §9, "Decoding workers"). Free cores: this process's (``os.sched_getaffinity``)
    less its training threads, for every process of the node unless each is bound to its own (``train.bind_cores``).
    """
    dc = cfg.data
    if dc.workers != "auto":
        return cfg, ""
    if device.type != "cpu":
        workers, why = AUTO_WORKERS, f"auto: the {device.type} device computes while the CPU decodes"
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads, local = torch.get_num_threads(), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        sharing = 1 if cores <= threads else local  # bound to its own cores, or sharing the node's with the others
        free = max(cores - threads * sharing, 0)
        workers = min(AUTO_WORKERS, free)
        why = f"auto: {free} of {cores} core(s) free of the training threads ({threads} x {sharing} process(es))"
    return replace(cfg, data=replace(dc, workers=workers)), why


def _train_count(dc) -> int:
    """Training images in a folder (its layout plan) or a set of shards (its index; bad images are reported later)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the load warns (loose files, bad images) once, after this count
        if not is_shard_spec(dc.source):
            plan = plan_layout(list_files(os.path.expanduser(dc.source)), dc.source).splits.get("train")
            return len(plan.paths) if plan is not None else 0
        try:
            return len(open_shards(dc.source, cache_dir=dc.cache_dir, skip_bad_images=True))
        except UserError:
            if is_url(dc.source):  # a shard missing, refused or unreachable after its retries: said once, now
                raise
            return 0  # (no readable image) the load says why


def load_train_data(cfg: Config, device: torch.device, why: str) -> TrainData:
    """The training split on the path ``cfg.data.mode`` names (decided by :func:`choose_mode`)."""
    dc = cfg.data
    if dc.mode == "stream":
        source = open_stream(dc.source, "train", cache_dir=dc.cache_dir, skip_bad_images=dc.skip_bad_images)
        source = split_validation(source, dc.validation)[0].subset(dc.limit, seed=cfg.train.seed)
        held = f"; {dc.validation} more held out as the validation split" if dc.validation else ""
        return TrainData(source, source.summary(dc.size, dc.workers, why) + held)
    full = load_images(dc.source, "train", size=dc.size, cache_dir=dc.cache_dir, skip_bad_images=dc.skip_bad_images)
    rest = split_validation(full, dc.validation)[0]  # never trained on: the validation rows (data.validation)
    data = rest.subset(dc.limit, seed=cfg.train.seed)
    source = ""
    if is_folder_spec(dc.source):  # the files' own sizes, from a spread of headers (the cache keeps none)
        root = Path(dc.source).expanduser()
        sizes = spread_sizes(lambda i: read_regular_file(root / data.paths[i]), len(data))
        source = f"; source {size_range(sizes, sampled=True)}"
    return TrainData(data, f"{data.summary(of=len(rest), validation=dc.validation)}{source}; memory path ({why})")


def load_validation(cfg: Config):
    """The run's validation split (``data.validation`` rows of the training split, never trained on) in memory at
    ``data.size``: the memory path's rows, or the streaming path's decoded; None when the run holds none out."""
    dc = cfg.data
    if not dc.validation:
        return None
    if dc.mode == "stream":
        source = open_stream(dc.source, "train", cache_dir=dc.cache_dir, skip_bad_images=dc.skip_bad_images)
        return split_validation(source, dc.validation)[1].decoded(dc.validation, dc.size)
    full = load_images(dc.source, "train", size=dc.size, cache_dir=dc.cache_dir, skip_bad_images=dc.skip_bad_images)
    return split_validation(full, dc.validation)[1]


def epoch_batches(train: TrainData, cfg: Config, specs: tuple, start: int, rank: int, world: int,
                  device: torch.device) -> Iterator[tuple[int, int, torch.Tensor, StreamBatch | None]]:
    """``(epoch, step in epoch, indices, stream batch)`` for every step from ``start`` to the run's end.

    Memory: ``indices`` int64 [B] is the global batch (each rank takes its slice in the step), no stream batch.
    Stream: ``indices`` int64 [B / W] are this rank's samples and the batch holds their crops.
    """
    tc, n = cfg.train, len(train)
    steps_per_epoch = len(batch_indices(n, tc.batch_size, 0, tc.seed))
    if train.stream is None:
        for epoch in range(start // steps_per_epoch, tc.epochs):
            for i, idx in enumerate(batch_indices(n, tc.batch_size, epoch, tc.seed)):
                if epoch * steps_per_epoch + i >= start:
                    yield epoch, i, idx, None
        return
    sampler = RunBatches(n, tc.batch_size, tc.seed, tc.epochs, start, rank, world)
    workers = cfg.data.workers
    loader = DataLoader(StreamViews(train.stream, specs, tc.seed, cfg.data.skip_bad_images), batch_sampler=sampler,
                        num_workers=workers, collate_fn=ViewCollate(specs), pin_memory=device.type == "cuda",
                        prefetch_factor=2 if workers else None, generator=torch.Generator().manual_seed(tc.seed),
                        worker_init_fn=ignore_stop_signals)
    for step, batch in enumerate(loader, start):
        yield step // steps_per_epoch, step % steps_per_epoch, batch.indices, batch


def ignore_stop_signals(worker: int) -> None:
    """In each decoding worker: SIGINT / SIGTERM sent to the whole process group (Ctrl-C, a scheduler) are the
    training process's to handle (finish the step, checkpoint, exit 130 / 143); a worker dying of them would
    end the run with a DataLoader error instead. The workers end with the training process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def check_batch(batch: StreamBatch | None, step: int, counters: dict, warn) -> tuple[str, str] | None:
    """Before step ``step``: ``(file, reason)`` of an unreadable sample (strict: the loop stops), else None; the
    samples replaced under ``skip_bad_images`` are counted and warned about."""
    if batch is None:
        return None
    for path, why in batch.replaced:
        counters["bad_images"] += 1
        warn("bad_image", f"unreadable image {path} ({why}) in step {step}; replaced by another sample "
                          f"({counters['bad_images']} so far)")
    return batch.bad[0] if batch.bad else None


def bad_image_error(bad: tuple[str, str], step: int, checkpoint) -> UserError:
    """The one line of a strict stop on an unreadable image met mid-epoch (or on shards at a URL that stopped
    answering: then resume once they do)."""
    if isinstance(bad[1], Unreachable):
        return UserError(f"cannot read {bad[0]}: {bad[1]}; stopped before step {step}, last good checkpoint: "
                         f"{checkpoint or 'none'}; resume with --resume once the storage answers")
    return UserError(f"unreadable image {bad[0]} ({bad[1]}) in the batch of step {step}; stopped before the step, "
                     f"last good checkpoint: {checkpoint or 'none'}; fix or remove the file and resume with --resume, "
                     "or resume with --skip-bad-images to replace it")
