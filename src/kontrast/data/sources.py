"""Read an image dataset from any supported source into one uint8 tensor: :func:`load_images`.

Sources (the ``source`` string):

* ``"shapes"`` / ``"shapes:N"``: the built-in procedural dataset (:mod:`kontrast.data.shapes`).
* a folder in ImageFolder layout: ``train/`` and ``test/`` (or ``val/``) sub-folders of class
  folders; or class folders only (every 10th image of each class, in sorted path order, is
  held out as test); or a flat folder of unlabelled images. The dataset may sit one or more
  levels down inside a single wrapping folder (``cifar10/train/...``).
* a ``.tar`` / ``.tar.gz`` / ``.tgz`` (also ``.tar.bz2``, ``.tar.xz``) archive of such a tree,
  streamed with :mod:`tarfile`, never unpacked to disk.
* a ``.jsonl`` / ``.csv`` paired file of image paths and captions (CLIP; :mod:`kontrast.data.pairs`).
* torchvision-format CIFAR pickles: ``cifar-10-batches-py/`` or ``cifar-100-python/`` (the
  folder itself, its parent, or the official ``.tar.gz`` that holds it). They are read with
  a restricted unpickler that can only build numpy arrays: never plain ``pickle.load``.

Every image becomes RGB uint8 at ``size`` x ``size`` (shorter side resized with bilinear
antialiasing, then centre-cropped). Decoded splits are cached on disk by content
(:mod:`kontrast.data.cache`); a miss decodes every split of the source in one pass and caches
them all, so loading ``test`` after ``train`` is a cache hit.

Decoding: JPEGs go through ``torchvision.io.decode_jpeg`` on lists of 256 (about 4x faster
than PIL here: 34 vs 132 us per 32x32 CIFAR JPEG); everything else, and any JPEG that
torchvision refuses, goes through PIL. Thread and process pools did not pay on 2 cores.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
import tarfile
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from kontrast.data import cache
from kontrast.data.cache import CachedSplit
from kontrast.data.sequences import SEQUENCE_CLASSES, make_sequences
from kontrast.data.shapes import SHAPE_CLASSES, make_shapes
from kontrast.errors import UserError

try:  # deprecated since torchvision 0.29 (TorchCodec replaces it); PIL decodes all without it
    from torchvision.io import ImageReadMode, decode_jpeg
except ImportError:  # pragma: no cover - depends on the installed torchvision
    decode_jpeg = None

SPLITS = ("train", "test")
TEST_FOLDER_NAMES = ("test", "val", "valid", "validation")  # the first one present is "test"
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jfif", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm",
     ".pgm", ".pbm", ".pnm"}
)  # fmt: skip
PAIR_SUFFIXES = (".jsonl", ".csv")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
SHAPES_TRAIN_DEFAULT = 10_000  # "shapes" = "shapes:10000"; test is always N // 5
SEQUENCES_TRAIN_DEFAULT = 10_000  # "sequences" = "sequences:10000"; test is N // 5
HOLDOUT_EVERY = 10  # class-folders-only layout: the 10th, 20th, ... image of a class is test
SHAPES_SEEDS = {"train": 0, "test": 1}

_DECODE_CHUNK = 256  # images per torchvision decode call
_BAD_SHOWN = 10  # unreadable paths named in the error message
_JPEG_MAGIC = b"\xff\xd8\xff"
# Decompression-bomb guard: PIL's own threshold (it only warns between 1x and 2x of it, and
# torchvision's JPEG decoder has none: a 30000x30000 header would allocate 2.7 GB). Larger images
# are reported as unreadable before any pixel is decoded.
MAX_IMAGE_PIXELS = 89_478_485
MAX_FILE_BYTES = 512 << 20  # larger files are not images to train on (and a link to /dev/zero has no end)

Blob = tuple[str, bytes]  # (path inside the source, file bytes)


@dataclass
class ImageSet:
    """A whole split in memory: what every other part of kontrast consumes."""

    images: torch.Tensor  # uint8 [N, 3, size, size], CPU, contiguous (float32 [N, C, T] for `sequences`)
    labels: torch.Tensor | None  # int64 [N], None when unlabelled
    classes: list[str]  # class names ([] when unlabelled)
    name: str  # human-readable source description
    captions: list[str] | None = None  # one text per image (paired files, kontrast.data.pairs), else None

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def subset(self, n: int, seed: int = 0) -> "ImageSet":
        """A fixed random subset of ``n`` images (sources are often sorted by class); self if n covers all."""
        if not 0 < n < len(self):
            return self
        keep = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:n]  # [n]
        labels = None if self.labels is None else self.labels[keep]
        captions = None if self.captions is None else [self.captions[i] for i in keep.tolist()]
        return ImageSet(self.images[keep], labels, self.classes, self.name, captions)


def load_images(
    source: str | os.PathLike,
    split: str = "train",
    *,
    size: int = 32,
    cache_dir: str | Path | None = None,
    skip_bad_images: bool = False,
) -> ImageSet:
    """Load one split of ``source`` as RGB uint8 ``[N, 3, size, size]`` (see module doc).

    Raises :class:`UserError` for a missing path, an empty or unrecognised source, a test
    split of unlabelled data, or unreadable image files (unless ``skip_bad_images``, which
    skips them with a warning). Results are cached under ``cache_dir`` (default:
    ``$KONTRAST_CACHE`` or ``~/.cache/kontrast``); ``shapes`` is generated, never cached.
    """
    source = os.fspath(source)
    _check_split(split)
    _check_size(size)
    if _is_shapes(source):
        return _load_shapes(source, split, size)
    if _is_sequences(source):
        return _load_sequences(source, split)
    if source.lower().endswith(PAIR_SUFFIXES):  # image path + caption per line (CLIP)
        from kontrast.data.pairs import load_pairs

        return load_pairs(source, split, size=size, skip_bad_images=skip_bad_images)
    src = _open_source(Path(source).expanduser())
    src.check_split(split)
    entry = _cached_or_built(src, split, size, cache.cache_root(cache_dir))
    return _finish(entry, split, src, skip_bad_images)


# ----------------------------------------------------------------------------------------
# Argument checks and the built-in dataset


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; use 'train' or 'test'")


def _check_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 4:
        raise UserError(f"image size must be an integer >= 4, got {size!r}")


def _is_shapes(source: str) -> bool:
    return source == "shapes" or source.startswith("shapes:")


def _load_shapes(source: str, split: str, size: int) -> ImageSet:
    """Generate the built-in dataset: N train images with seed 0, N // 5 test with seed 1."""
    n_train = _shapes_count(source)
    n = n_train if split == "train" else n_train // 5
    images, labels = make_shapes(n, seed=SHAPES_SEEDS[split], size=size)
    return ImageSet(images, labels, list(SHAPE_CLASSES), f"shapes:{n_train} ({split})")


def _is_sequences(source: str) -> bool:
    return source == "sequences" or source.startswith("sequences:")


def _load_sequences(source: str, split: str) -> ImageSet:
    """The built-in sequences (:mod:`kontrast.data.sequences`): float32 ``[N, 1, T]``, not images."""
    n_train = SEQUENCES_TRAIN_DEFAULT if source == "sequences" else _count_after_colon(source, "sequences")
    n = n_train if split == "train" else n_train // 5
    x, labels = make_sequences(n, seed=SHAPES_SEEDS[split])
    return ImageSet(x, labels, list(SEQUENCE_CLASSES), f"sequences:{n_train} ({split})")


def _count_after_colon(source: str, kind: str) -> int:
    text = source.split(":", 1)[1]
    if not text.isdigit() or int(text) < 5:
        raise UserError(f"bad dataset {source!r}: write {kind}:N with N >= 5 training items")
    return int(text)


def _shapes_count(source: str) -> int:
    """N from ``"shapes:N"`` (default 10000); at least 5 so the test split is not empty."""
    if source == "shapes":
        return SHAPES_TRAIN_DEFAULT
    text = source.split(":", 1)[1]
    if not text.isdigit() or int(text) < 5:
        raise UserError(f"bad dataset {source!r}: write shapes:N with N >= 5 train images")
    return int(text)


# ----------------------------------------------------------------------------------------
# Cache orchestration and the final checks


def _cached_or_built(src: "_Source", split: str, size: int, root: Path) -> CachedSplit | None:
    """The cached entry for ``split``; on a miss build every split and cache them all."""
    digest = src.digest()
    entry = cache.load_entry(root, cache.entry_key(src.kind, split, size, digest))
    if entry is not None:
        return entry
    built = src.build(size)
    for name, part in built.items():
        cache.save_entry(root, cache.entry_key(src.kind, name, size, digest), part)
    return built.get(split)


def _finish(entry: CachedSplit | None, split: str, src: "_Source", skip_bad: bool) -> ImageSet:
    """Apply the bad-image policy and the labelled/non-empty checks; make the ImageSet."""
    if entry is None or (split == "test" and entry.labels is None):
        raise _unlabelled_test_error(src.where)
    if entry.bad_images:
        _report_bad_images(entry.bad_images, src, skip_bad)
    if entry.images.shape[0] == 0:
        hint = (
            f" (with class folders only, every {HOLDOUT_EVERY}th image of a class is held "
            f"out for test, so each class needs at least {HOLDOUT_EVERY} images)"
            if entry.layout == "holdout" and split == "test"
            else ""
        )
        raise UserError(f"no readable {split} images in {src.where}{hint}")
    return ImageSet(entry.images, entry.labels, entry.classes, f"{src.where} ({split})")


def _unlabelled_test_error(where: str) -> UserError:
    return UserError(
        f"{where} has no labelled test split (its images are not in class sub-folders); "
        "evaluation needs labelled data: put the images in one sub-folder per class"
    )


def _report_bad_images(bad: list[tuple[str, str]], src: "_Source", skip_bad: bool) -> None:
    """Refuse unreadable files (UserError) or, when skipping, warn about them."""
    shown = ", ".join(src.locate(path) for path, _ in bad[:_BAD_SHOWN])
    more = f" and {len(bad) - _BAD_SHOWN} more" if len(bad) > _BAD_SHOWN else ""
    if skip_bad:
        warnings.warn(
            f"skipped {len(bad)} unreadable image file(s) in {src.where}: {shown}{more}",
            stacklevel=4,
        )
        return
    raise UserError(
        f"{len(bad)} unreadable image file(s) in {src.where}: {shown}{more} "
        f"(first error: {bad[0][1]}); fix or remove them, or pass --skip-bad-images"
    )


# ----------------------------------------------------------------------------------------
# Sources: each knows its kind, how to hash its content, and how to build all its splits


class _Source:
    """A resolved source: ``digest()`` keys the cache, ``build(size)`` decodes every split."""

    kind: str
    where: str  # the path as the user gave it, for messages

    def digest(self) -> str:
        raise NotImplementedError

    def build(self, size: int) -> dict[str, CachedSplit]:
        raise NotImplementedError

    def check_split(self, split: str) -> None:
        """Raise early when ``split`` is known to be unusable before decoding anything."""

    def locate(self, path: str) -> str:
        """How to name a file of this source in a message."""
        return f"{self.where}/{path}"


def _open_source(path: Path) -> _Source:
    """Decide what kind of source ``path`` is (see the module doc)."""
    if not path.exists():
        raise UserError(
            f"dataset not found: {path} does not exist; pass a folder of images, a .tar/.tar.gz "
            "archive, a CIFAR folder, or 'shapes'"
        )
    if path.is_dir():
        found = _find_cifar_folder(path)
        return _CifarFolder(path, *found) if found else _FolderSource(path)
    if _is_tar(path):
        return _TarSource(path)
    raise UserError(
        f"unknown dataset format: {path} is neither a folder nor a .tar/.tar.gz archive; "
        "pass an ImageFolder-style folder, an archive of one, or a CIFAR folder"
    )


def _is_tar(path: Path) -> bool:
    """By suffix, or by content for archives with an unusual name."""
    if path.name.lower().endswith(TAR_SUFFIXES):
        return True
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


class _FolderSource(_Source):
    """An ImageFolder-style directory tree; read file by file, only images it will use."""

    kind = "folder"

    def __init__(self, path: Path):
        self.path, self.where = path, str(path)
        self.plan = plan_layout(_list_files(path), self.where)

    def digest(self) -> str:
        hasher = cache.ContentHasher()
        for rel, data in self._blobs():
            hasher.add(rel, data)
        return hasher.hexdigest()

    def build(self, size: int) -> dict[str, CachedSplit]:
        images, bad = decode_blobs(self._blobs(), size)
        bad.update({rel: why for rel, why in self.read_errors.items() if rel in bad})  # the precise reason
        return self.plan.assemble(images, bad, self.where, size)

    def check_split(self, split: str) -> None:
        plan = self.plan.splits.get(split)
        if split == "test" and (plan is None or plan.labels is None):
            raise _unlabelled_test_error(self.where)

    def _blobs(self) -> Iterator[Blob]:
        """(path, bytes) of every planned file; an unreadable one yields empty bytes (its reason
        goes to ``read_errors``), so decoding reports it with the others."""
        self.read_errors: dict[str, str] = {}
        for rel in self.plan.all_paths():
            data = read_regular_file(self.path / rel)
            if isinstance(data, str):
                self.read_errors[rel] = data
                data = b""
            yield rel, data


def read_regular_file(path: Path) -> bytes | str:
    """The bytes of ``path`` (symbolic links followed), or why they cannot be used.

    Only regular files up to MAX_FILE_BYTES are read: a link to a device (``/dev/zero``) or a FIFO
    would never end or never answer; a symbolic-link loop or a dangling link is an OS error.
    """
    try:
        info = path.stat()
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a device, FIFO or socket)"
    if info.st_size > MAX_FILE_BYTES:
        return f"{info.st_size} bytes, larger than the {MAX_FILE_BYTES >> 20} MiB limit for an image file"
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"


class _TarSource(_Source):
    """A tar archive, streamed once; its cache key is the archive file's bytes."""

    kind = "tar"

    def __init__(self, path: Path):
        self.path, self.where = path, str(path)

    def digest(self) -> str:
        return cache.file_digest(self.path)

    def locate(self, path: str) -> str:
        return f"{self.where}:{path}"

    def build(self, size: int) -> dict[str, CachedSplit]:
        extras: dict[str, bytes] = {}  # CIFAR pickle members, if this is the official tarball
        images, bad = decode_blobs(self._members(extras), size)
        bad.update({name: why for name, why in self.read_errors.items() if name in bad})
        names = sorted(set(images) | set(bad))
        if not names:
            found = _find_cifar_members(extras)
            if found:
                kind, prefix = found
                read = _member_reader(extras, prefix, self.where)
                return _build_cifar(kind, read, self.where, size)
        return plan_layout(names, self.where).assemble(images, bad, self.where, size)

    def _members(self, extras: dict[str, bytes]) -> Iterator[Blob]:
        """Stream (path, bytes) of image members; stash CIFAR pickle members in ``extras``."""
        self.read_errors: dict[str, str] = {}
        try:
            with tarfile.open(self.path, mode="r|*") as archive:
                for member in archive:
                    name = _clean_member_name(member.name)
                    if not member.isfile() or not name:
                        continue
                    if _is_image_path(name) and member.size > MAX_FILE_BYTES:
                        self.read_errors[name] = f"{member.size} bytes, larger than the {MAX_FILE_BYTES >> 20} MiB limit"
                        yield name, b""
                    elif _is_image_path(name):
                        yield name, _read_member(archive, member)
                    elif _is_cifar_member(name):
                        extras[name] = _read_member(archive, member)
        except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            raise UserError(
                f"cannot read archive {self.where} ({exc}); it may be truncated or corrupt: "
                "download or create it again"
            ) from exc


def _member_reader(extras: dict[str, bytes], prefix: str, where: str) -> Callable[[str], bytes]:
    """``read(file name)`` over CIFAR members stashed while streaming an archive."""

    def read(name: str) -> bytes:
        if prefix + name not in extras:
            raise UserError(f"{where} lacks {prefix}{name}; download the CIFAR archive again")
        return extras[prefix + name]

    return read


def _read_member(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = archive.extractfile(member)
    return f.read() if f is not None else b""


def _clean_member_name(name: str) -> str:
    """Archive member name as a relative POSIX path ('./a/b' -> 'a/b')."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    return "/".join(parts)


def _list_files(root: Path) -> list[str]:
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


# ----------------------------------------------------------------------------------------
# Layout: from a list of paths to splits, classes and labels (pure; folders and archives)


def _is_image_path(path: str) -> bool:
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
        bad_images=[(p, bad[p]) for p in plan.paths if p in bad],
    )


def plan_layout(paths: Iterable[str], where: str) -> LayoutPlan:
    """Split a tree of files into train/test and classes (see the module doc for the rules).

    ``paths`` are relative POSIX paths; non-image files are ignored. Raises UserError when
    there are no images or a ``train/`` folder has no test folder beside it.
    """
    images = sorted(p for p in paths if _is_image_path(p))
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


# ----------------------------------------------------------------------------------------
# Decoding: bytes -> RGB uint8 [3, size, size], JPEGs in batches via torchvision


def decode_blobs(
    blobs: Iterable[Blob], size: int
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Decode ``(path, bytes)`` pairs to RGB uint8 ``[3, size, size]``, in chunks.

    Returns ``(images, bad)``: path -> image for the readable files, path -> reason for the
    rest. Never raises for a bad file, so every bad file can be reported at once.
    """
    images: dict[str, torch.Tensor] = {}
    bad: dict[str, str] = {}
    for chunk in _chunks(blobs, _DECODE_CHUNK):
        for path, result in _decode_chunk(chunk, size):
            if isinstance(result, str):
                bad[path] = result
            else:
                images[path] = result
    return images, bad


def _chunks(items: Iterable[Blob], n: int) -> Iterator[list[Blob]]:
    chunk: list[Blob] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _decode_chunk(chunk: list[Blob], size: int) -> list[tuple[str, torch.Tensor | str]]:
    """JPEGs through torchvision in one call, the rest (and any it refuses) through PIL."""
    bombs = {i: _too_large(*_jpeg_size(data)) for i, (_, data) in enumerate(chunk) if data.startswith(_JPEG_MAGIC)}
    bombs = {i: why for i, why in bombs.items() if why}  # never handed to a decoder
    jpegs = [i for i, (_, data) in enumerate(chunk) if data.startswith(_JPEG_MAGIC) and i not in bombs]
    decoded: dict[int, torch.Tensor | None] = dict(
        zip(jpegs, _decode_jpegs([chunk[i][1] for i in jpegs]))
    )
    results: list[tuple[str, torch.Tensor | str]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PIL's per-file chatter (EXIF, palettes, ...)
        for i, (path, data) in enumerate(chunk):
            image = decoded.get(i)
            if i in bombs:
                result = bombs[i]
            else:
                result = _decode_with_pil(data) if image is None else image
            results.append((path, result if isinstance(result, str) else fit_image(result, size)))
    return results


def _decode_jpegs(datas: list[bytes]) -> list[torch.Tensor | None]:
    """RGB uint8 ``[3, H, W]`` per JPEG, None where torchvision cannot decode it."""
    if not datas or decode_jpeg is None:
        return [None] * len(datas)
    joined = torch.frombuffer(bytearray(b"".join(datas)), dtype=torch.uint8)  # one copy
    tensors = list(joined.split([len(d) for d in datas]))  # uint8 [file bytes] each
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        try:
            return list(decode_jpeg(tensors, mode=ImageReadMode.RGB))
        except RuntimeError:  # one bad file fails the whole call: retry one by one
            return [_decode_one_jpeg(t) for t in tensors]


_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """(height, width) from a JPEG's frame header, read without decoding; (0, 0) if none is found."""
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return 0, 0
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF_MARKERS:
            return int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big")
        if marker == 0xDA:  # start of scan before any frame header: not a valid JPEG
            return 0, 0
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return 0, 0


def _too_large(height: int, width: int) -> str | None:
    if height * width > MAX_IMAGE_PIXELS:
        return (f"{width}x{height} pixels, over the decompression-bomb limit of {MAX_IMAGE_PIXELS} "
                "(not decoded)")
    return None


def _decode_one_jpeg(data: torch.Tensor) -> torch.Tensor | None:
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB)  # uint8 [3, H, W]
    except RuntimeError:  # corrupt, truncated, or an image extension that failed to load
        return None


def _decode_with_pil(data: bytes) -> torch.Tensor | str:
    """RGB uint8 ``[3, H, W]``, or the reason the bytes are not a readable image."""
    if not data:
        return "empty file (0 bytes)"
    try:
        with Image.open(io.BytesIO(data)) as im:  # reads the header only
            too_large = _too_large(im.height, im.width)
            if too_large:
                return too_large
            im.load()  # decode now: truncated and corrupt files fail here
            rgb = pil_to_rgb_array(im)  # uint8 [H, W, 3]
    except UnidentifiedImageError:
        return "not a recognised image format"
    except Exception as exc:  # PIL raises many types for bad files (OSError, SyntaxError, ...)
        return " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
    return torch.from_numpy(rgb).permute(2, 0, 1).contiguous()


def pil_to_rgb_array(im: Image.Image) -> np.ndarray:
    """Any PIL mode as uint8 ``[H, W, 3]``.

    16- and 32-bit integer images keep their top 8 bits (PIL's own convert would clip them
    to white); float images are taken as [0, 1] when they fit there, else as [0, 255].
    Alpha is dropped, like ``convert("RGB")``.
    """
    if im.mode.startswith("I"):
        a = np.asarray(im).astype(np.int64)  # [H, W]
        if im.mode.startswith("I;16") or a.max(initial=0) > 255:
            a = np.clip(a, 0, 65535) >> 8
        return np.repeat(np.clip(a, 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    if im.mode == "F":
        a = np.asarray(im).astype(np.float64)  # [H, W]
        if a.max(initial=0) <= 1.0:
            a = a * 255
        return np.repeat(np.clip(np.round(a), 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    if im.mode in ("P", "PA") and "transparency" in im.info:
        im = im.convert("RGBA")  # PIL wants palette transparency resolved through RGBA
    return np.asarray(im.convert("RGB"))


def fit_image(image: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``[C, H, W]`` -> ``[C, size, size]``: shorter side to ``size``, centre crop."""
    if image.shape[-2] == size and image.shape[-1] == size:
        return image
    image = TF.resize(image, [size], interpolation=InterpolationMode.BILINEAR, antialias=True)
    return TF.center_crop(image, [size, size]).contiguous()


# ----------------------------------------------------------------------------------------
# CIFAR pickles (torchvision format), read with a restricted unpickler


@dataclass(frozen=True)
class _CifarFormat:
    folder: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str
    names_key: str
    labels_key: str

    def files(self) -> tuple[str, ...]:
        return (*self.train, *self.test, self.meta)


_CIFAR_FORMATS = {
    "cifar10": _CifarFormat(
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        "batches.meta",
        "label_names",
        "labels",
    ),
    "cifar100": _CifarFormat(
        "cifar-100-python", ("train",), ("test",), "meta", "fine_label_names", "fine_labels"
    ),
}

# Exactly what pickled numpy arrays of numbers (and Python 2 strings) need; nothing callable
# beyond array construction, so a pickle cannot run code through os.system, eval, etc.
_PICKLE_ALLOWED = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }
)


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler that can build numpy arrays and builtins, and nothing else."""

    def __init__(self, file: io.BytesIO, where: str):
        super().__init__(file, encoding="bytes")
        self.where = where

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _PICKLE_ALLOWED:
            raise UserError(
                f"refusing to load {self.where}: the pickle asks for {module}.{name}, which a "
                "CIFAR file never needs; it is not a genuine CIFAR file (download it again)"
            )
        return super().find_class(_numpy_module(module), name)


def _numpy_module(module: str) -> str:
    """numpy 2 renamed numpy.core to numpy._core; map between them for old/new pickles."""
    has_new = hasattr(np, "_core") and hasattr(np._core, "multiarray")
    if has_new and module.startswith("numpy.core."):
        return "numpy._core." + module[len("numpy.core.") :]
    if not has_new and module.startswith("numpy._core."):
        return "numpy.core." + module[len("numpy._core.") :]
    return module


def safe_unpickle(data: bytes, where: str) -> object:
    """Unpickle CIFAR-style data with :class:`_ArrayUnpickler`; UserError if it is not that."""
    try:
        return _ArrayUnpickler(io.BytesIO(data), where).load()
    except UserError:
        raise
    except Exception as exc:  # any unpickling failure means "not a CIFAR pickle"
        raise UserError(
            f"cannot read {where} as a CIFAR pickle ({type(exc).__name__}: {exc}); "
            "download the dataset again"
        ) from exc


def _find_cifar_folder(path: Path) -> tuple[str, Path] | None:
    """(kind, folder) when ``path`` is, or directly contains, a CIFAR pickle folder."""
    for kind, fmt in _CIFAR_FORMATS.items():
        for folder in (path, path / fmt.folder):
            if (folder / fmt.meta).is_file() and (folder / fmt.train[0]).is_file():
                return kind, folder
    return None


def _is_cifar_member(name: str) -> bool:
    parts = name.split("/")
    return len(parts) >= 2 and any(
        parts[-2] == fmt.folder and parts[-1] in fmt.files() for fmt in _CIFAR_FORMATS.values()
    )


def _find_cifar_members(extras: dict[str, bytes]) -> tuple[str, str] | None:
    """(kind, member prefix) of a CIFAR pickle folder found inside an archive."""
    for kind, fmt in _CIFAR_FORMATS.items():
        for name in extras:
            if name.endswith(f"{fmt.folder}/{fmt.meta}"):
                return kind, name[: -len(fmt.meta)]
    return None


class _CifarFolder(_Source):
    """``cifar-10-batches-py`` / ``cifar-100-python``; keyed by the bytes of its files."""

    def __init__(self, given: Path, kind: str, folder: Path):
        self.kind, self.folder, self.where = kind, folder, str(given)
        self.format = _CIFAR_FORMATS[kind]

    def digest(self) -> str:
        hasher = cache.ContentHasher()
        for name in self.format.files():
            hasher.add(name, self._read(name))
        return hasher.hexdigest()

    def build(self, size: int) -> dict[str, CachedSplit]:
        return _build_cifar(self.kind, self._read, self.where, size)

    def _read(self, name: str) -> bytes:
        try:
            return (self.folder / name).read_bytes()
        except OSError as exc:
            raise UserError(
                f"{self.folder} is missing or cannot read {name} ({exc}); download the "
                "CIFAR dataset again"
            ) from exc


def _build_cifar(
    kind: str, read: Callable[[str], bytes], where: str, size: int
) -> dict[str, CachedSplit]:
    """Both splits of a CIFAR pickle folder; ``read(file name)`` returns a file's bytes."""
    fmt = _CIFAR_FORMATS[kind]
    meta = _bytes_keys(safe_unpickle(read(fmt.meta), f"{where}/{fmt.meta}"), where)
    classes = [_text(c) for c in meta.get(fmt.names_key, [])]
    if not classes:
        raise UserError(f"{where}/{fmt.meta} has no {fmt.names_key}; download it again")
    out = {}
    for split, files in (("train", fmt.train), ("test", fmt.test)):
        parts = [_cifar_batch(read(f), f"{where}/{f}", fmt.labels_key, len(classes)) for f in files]
        images = torch.cat([p[0] for p in parts])  # uint8 [N, 3, 32, 32]
        labels = torch.cat([p[1] for p in parts])  # int64 [N]
        out[split] = CachedSplit(_fit_batch(images, size), labels, classes, where, "cifar")
    return out


def _cifar_batch(
    data: bytes, where: str, labels_key: str, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pickled batch -> (uint8 [N, 3, 32, 32], int64 [N]), checked for consistency."""
    batch = _bytes_keys(safe_unpickle(data, where), where)
    pixels, labels = batch.get("data"), batch.get(labels_key)
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or pixels.ndim != 2:
        raise UserError(f"{where} has no uint8 'data' array; it is not a CIFAR batch file")
    if pixels.shape[1] != 3 * 32 * 32 or labels is None or len(labels) != len(pixels):
        raise UserError(f"{where} has mismatched 'data'/{labels_key!r}; download it again")
    label_t = torch.as_tensor(np.asarray(labels, dtype=np.int64))  # int64 [N]
    if len(label_t) and (int(label_t.min()) < 0 or int(label_t.max()) >= num_classes):
        raise UserError(f"{where} has labels outside 0..{num_classes - 1}; download it again")
    images = torch.from_numpy(np.ascontiguousarray(pixels)).view(-1, 3, 32, 32)  # [N,3,32,32]
    return images.clone(), label_t


def _bytes_keys(obj: object, where: str) -> dict[str, object]:
    """A pickled dict with bytes or str keys, as str keys."""
    if not isinstance(obj, dict):
        raise UserError(f"{where} does not hold a dict; it is not a CIFAR file")
    return {_text(k): v for k, v in obj.items()}


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _fit_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``[N, 3, H, W]`` -> ``[N, 3, size, size]`` in chunks (same rule as fit_image)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images.contiguous()
    return torch.cat([fit_image(part, size) for part in images.split(4096)])
