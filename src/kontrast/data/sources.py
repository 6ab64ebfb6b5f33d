"""Read one split of a dataset from any supported source: :func:`load_images`.

Sources (the ``source`` string), each a kind registered in :data:`kontrast.registry.SOURCES`:

* ``"shapes"`` / ``"shapes:N"``, ``"sequences"`` / ``"sequences:N"``: the built-in generated
  datasets (:mod:`kontrast.data.builtin`).
* a ``.jsonl`` / ``.csv`` paired file of image paths and captions (CLIP; :mod:`kontrast.data.pairs`).
* a folder in ImageFolder layout: ``train/`` and ``test/`` (or ``val/``) sub-folders of class
  folders; or class folders only (every 10th image of each class, in sorted path order, is
  held out as test); or a flat folder of unlabelled images (:mod:`kontrast.data.layout`). The
  dataset may sit one or more levels down inside a single wrapping folder (``cifar10/train/...``).
* a ``.tar`` / ``.tar.gz`` / ``.tgz`` (also ``.tar.bz2``, ``.tar.xz``) archive of such a tree,
  streamed with :mod:`tarfile`, never unpacked to disk (:mod:`kontrast.data.folder`).
* torchvision-format CIFAR pickles: ``cifar-10-batches-py/`` or ``cifar-100-python/`` (the
  folder itself, its parent, or the official ``.tar.gz`` that holds it), read with a
  restricted unpickler that can only build numpy arrays (:mod:`kontrast.data.cifar`).

Every image becomes RGB uint8 at ``size`` x ``size`` (:mod:`kontrast.data.decode`). Decoded
splits of files on disk are cached by content (:mod:`kontrast.data.cache`). Every row keeps the
path (or key) it came from in :attr:`Samples.paths`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from kontrast.data.remote import is_url
from kontrast.data.samples import Samples
from kontrast.errors import UserError
from kontrast.registry import SOURCES

SPLITS = ("train", "test")


def load_images(
    source: str | os.PathLike,
    split: str = "train",
    *,
    size: int = 32,
    cache_dir: str | Path | None = None,
    skip_bad_images: bool = False,
) -> Samples:
    """Load one split of ``source``: images as RGB uint8 ``[N, 3, size, size]`` (see module doc); ``split="all"``:
    train and test together, in path order.

    Raises :class:`UserError` for a missing path, an empty or unrecognised source, a test
    split of unlabelled data, or unreadable image files (unless ``skip_bad_images``, which
    skips them with a warning). Results are cached under ``cache_dir`` (default:
    ``$KONTRAST_CACHE`` or ``~/.cache/kontrast``); ``shapes`` is generated, never cached.
    """
    source = os.fspath(source)
    if split == "all":
        return _all_splits(source, size=size, cache_dir=cache_dir, skip_bad_images=skip_bad_images)
    check_split(split)
    check_size(size)
    kinds = sorted(SOURCES.names(), key=lambda name: (SOURCES.get(name).order, name))
    for name in kinds:
        kind = SOURCES.get(name)
        if kind.matches(source):
            return kind.load(source, split, size=size, cache_dir=cache_dir, skip_bad_images=skip_bad_images)
    path = Path(source).expanduser()
    if not path.exists():
        raise UserError(
            f"dataset not found: {path} does not exist; pass a folder of images, a .tar/.tar.gz "
            "archive, a CIFAR folder, or 'shapes'"
        )
    raise UserError(
        f"unknown dataset format: {path} is neither a folder nor a .tar/.tar.gz archive; "
        "pass an ImageFolder-style folder, an archive of one, or a CIFAR folder"
    )


def _all_splits(source: str, **kw) -> Samples:
    """Train and test together, in path order (an unlabelled source has every image in train)."""
    train = load_images(source, "train", **kw)
    try:
        parts = [train, load_images(source, "test", **kw)]
    except UserError:
        if train.labels is not None:  # a labelled source whose test split is unreadable: say so
            raise
        parts = [train]  # unlabelled: every image is in the train split
    order = sorted(range(sum(len(p) for p in parts)), key=[path for p in parts for path in p.paths].__getitem__)
    x = torch.cat([p.x for p in parts])[order]  # [N, 3, H, W] in path order
    labelled = all(p.labels is not None for p in parts)
    labels = torch.cat([p.labels for p in parts])[order] if labelled else None  # [N]
    paths = [path for p in parts for path in p.paths]
    return Samples(x, labels, parts[0].classes if labelled else [], source, [paths[i] for i in order])


def absolute_source(source: str) -> str:
    """``source`` with a path on disk made absolute (a run's config then works from any folder);
    built-in names (``shapes``, ``sequences:N``), URLs and missing paths are returned as given."""
    for name in SOURCES.names():
        kind = SOURCES.get(name)
        if kind.order == 0 and kind.matches(source):
            return source
    if is_url(source):
        return source
    path = Path(source).expanduser()
    if "{" in source and not path.exists():  # a brace pattern of shards: its folder made absolute
        return os.path.abspath(os.path.expanduser(source))
    return str(path.resolve()) if path.exists() else source


def check_split(split: str) -> None:
    """UserError unless ``split`` is ``"train"`` or ``"test"``."""
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; use 'train' or 'test'")


def check_size(size: int) -> None:
    """UserError unless ``size`` is an integer of at least 4 (pixels per side)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 4:
        raise UserError(f"image size must be an integer >= 4, got {size!r}")
