"""Layout: from a tree of files to splits, classes and labels, before anything is decoded.

The rules (the same for folders and archives; paths are relative POSIX paths):

* ``train/`` and ``test/`` (or ``val/``) sub-folders of class folders: the given splits, with
  classes the union over both so labels agree.
* class folders only: every ``HOLDOUT_EVERY``-th image of each class, in sorted path order,
  is held out as test.
* a flat folder of images: one unlabelled train split.

The dataset may sit one or more levels down inside a single wrapping folder
(``cifar10/train/...``). Hidden folders and macOS resource forks are skipped; only image
extensions count. Pure functions apart from :func:`list_files`, which walks a folder.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from kontrast.data.cache import CachedSplit
from kontrast.errors import UserError

TEST_FOLDER_NAMES = ("test", "val", "valid", "validation")  # the first one present is "test"
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jfif", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm",
     ".pgm", ".pbm", ".pnm"}
)  # fmt: skip
HOLDOUT_EVERY = 10  # class-folders-only layout: the 10th, 20th, ... image of a class is test


def list_files(root: Path) -> list[str]:
    """Relative POSIX paths of all files below ``root``, following links, sorted."""
    found: list[str] = []
    seen: set[str] = set()  # real paths of visited folders: guards against link loops
    for folder, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        rel = Path(folder).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        found.extend(prefix + f for f in files)
    return sorted(found)


def is_image_path(path: str) -> bool:
    """An image by extension, outside hidden folders and macOS resource forks."""
    parts = path.split("/")
    if any(p.startswith(".") or p == "__MACOSX" for p in parts):
        return False
    return os.path.splitext(parts[-1])[1].lower() in IMAGE_EXTENSIONS


def _child_dirs(paths: list[str], prefix: str) -> set[str]:
    """Names of the folders directly below ``prefix`` that contain some of ``paths``."""
    n = len(prefix)
    return {p[n:].split("/", 1)[0] for p in paths if p.startswith(prefix) and "/" in p[n:]}


def _direct_files(paths: list[str], prefix: str) -> list[str]:
    """The paths directly inside ``prefix`` (not in a sub-folder)."""
    n = len(prefix)
    return [p for p in paths if p.startswith(prefix) and "/" not in p[n:]]


def _files_under(paths: list[str], prefix: str) -> list[str]:
    return [p for p in paths if p.startswith(prefix)]


@dataclass
class SplitPlan:
    """The files of one split in load order, with labels (None when unlabelled)."""

    paths: list[str]
    labels: list[int] | None


@dataclass
class LayoutPlan:
    """How a tree of images divides into splits and classes (before anything is decoded)."""

    layout: str  # "splits" (train/ + test/), "holdout" (class folders only) or "flat"
    classes: list[str]
    splits: dict[str, SplitPlan]

    def all_paths(self) -> list[str]:
        return sorted({p for s in self.splits.values() for p in s.paths})

    def assemble(
        self, images: dict[str, torch.Tensor], bad: dict[str, str], where: str, size: int
    ) -> dict[str, CachedSplit]:
        """Stack decoded images per split, in plan order; list each split's bad files."""
        return {
            name: _assemble_split(plan, images, bad, self, where, size)
            for name, plan in self.splits.items()
        }


def _assemble_split(
    plan: SplitPlan,
    images: dict[str, torch.Tensor],
    bad: dict[str, str],
    layout: LayoutPlan,
    where: str,
    size: int,
) -> CachedSplit:
    keep = [i for i, p in enumerate(plan.paths) if p in images]
    stacked = (
        torch.stack([images[plan.paths[i]] for i in keep])  # uint8 [N, 3, size, size]
        if keep
        else torch.empty(0, 3, size, size, dtype=torch.uint8)
    )
    labels = (
        torch.tensor([plan.labels[i] for i in keep], dtype=torch.int64)  # int64 [N]
        if plan.labels is not None
        else None
    )
    return CachedSplit(
        images=stacked,
        labels=labels,
        classes=list(layout.classes) if labels is not None else [],
        name=where,
        layout=layout.layout,
        paths=[plan.paths[i] for i in keep],
        bad_images=[(p, bad[p]) for p in plan.paths if p in bad],
    )


def plan_layout(paths: Iterable[str], where: str) -> LayoutPlan:
    """Split a tree of files into train/test and classes (see the module doc for the rules).

    ``paths`` are relative POSIX paths; non-image files are ignored. Raises UserError when
    there are no images or a ``train/`` folder has no test folder beside it.
    """
    images = sorted(p for p in paths if is_image_path(p))
    if not images:
        raise UserError(
            f"no images found in {where}; expected class sub-folders of image files "
            "(.jpg, .png, .bmp, .webp, ...) or a flat folder of images"
        )
    root = _dataset_root(images)
    dirs = _child_dirs(images, root)
    test_dir = next((d for d in TEST_FOLDER_NAMES if d in dirs), None)
    if "train" in dirs and test_dir is not None:
        return _plan_given_splits(images, {"train": root + "train/", "test": root + test_dir + "/"})
    if "train" in dirs:
        raise UserError(
            f"{where} has a train/ folder but no test/ (or val/) folder beside it; add one, "
            "or point at the train/ folder itself to hold out every 10th image per class"
        )
    if dirs:
        return _plan_holdout(images, root, sorted(dirs))
    return LayoutPlan("flat", [], {"train": SplitPlan(_direct_files(images, root), None)})


def _dataset_root(paths: list[str]) -> str:
    """Descend through single wrapping folders ('cifar10/' in 'cifar10/train/cat/1.jpg').

    Stops at a folder holding train/ and a test folder, at one with loose images or several
    sub-folders, or when the only sub-folder is a leaf (a single class folder, or train/).
    """
    root = ""
    while True:
        dirs = _child_dirs(paths, root)
        if "train" in dirs and any(d in dirs for d in TEST_FOLDER_NAMES):
            return root
        if len(dirs) != 1 or _direct_files(paths, root):
            return root
        below = root + next(iter(dirs)) + "/"
        if not _child_dirs(paths, below):
            return root
        root = below


def _plan_given_splits(paths: list[str], split_dirs: dict[str, str]) -> LayoutPlan:
    """train/ and test/ folders; classes are the union over both, so labels agree."""
    classes = sorted(set().union(*(_child_dirs(paths, d) for d in split_dirs.values())))
    index = {c: i for i, c in enumerate(classes)}
    splits = {name: _labelled_or_flat(paths, d, index) for name, d in split_dirs.items()}
    return LayoutPlan("splits", classes, splits)


def _labelled_or_flat(paths: list[str], folder: str, index: dict[str, int]) -> SplitPlan:
    """One split folder: class sub-folders if it has any, else its loose images unlabelled."""
    if not _child_dirs(paths, folder):
        return SplitPlan(_direct_files(paths, folder), None)
    _warn_loose_files(paths, folder)
    members = [p for p in _files_under(paths, folder) if "/" in p[len(folder) :]]
    labels = [index[p[len(folder) :].split("/", 1)[0]] for p in members]
    return SplitPlan(members, labels)


def _plan_holdout(paths: list[str], root: str, classes: list[str]) -> LayoutPlan:
    """Class folders only: per class, every HOLDOUT_EVERY-th image (sorted) is test."""
    _warn_loose_files(paths, root)
    train, test = SplitPlan([], []), SplitPlan([], [])
    for label, name in enumerate(classes):
        for i, path in enumerate(_files_under(paths, f"{root}{name}/")):
            target = test if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else train
            target.paths.append(path)
            target.labels.append(label)  # type: ignore[union-attr]
    return LayoutPlan("holdout", classes, {"train": train, "test": test})


def _warn_loose_files(paths: list[str], folder: str) -> None:
    loose = _direct_files(paths, folder)
    if loose:
        warnings.warn(
            f"ignoring {len(loose)} image(s) directly in {folder or './'} beside class "
            f"folders (e.g. {loose[0]}); move them into a class folder to use them",
            stacklevel=5,
        )
