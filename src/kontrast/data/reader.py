"""File-backed sources (folders, archives, CIFAR pickles): the :class:`Reader` interface, and
:func:`load_cached`, which serves one split from the content-keyed cache or builds it.

A miss decodes every split of the source in one pass and caches them all, so loading ``test``
after ``train`` is a cache hit (:mod:`kontrast.data.cache`).
"""

from __future__ import annotations

from pathlib import Path

from kontrast.data import cache
from kontrast.data.cache import CachedSplit
from kontrast.data.decode import report_bad_images
from kontrast.data.layout import HOLDOUT_EVERY
from kontrast.data.samples import Samples
from kontrast.errors import UserError


class Reader:
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


def load_cached(
    reader: Reader, split: str, *, size: int, cache_dir: str | Path | None, skip_bad_images: bool
) -> Samples:
    """One split of ``reader``'s source: cached or built, bad images refused or skipped, checked.

    Raises UserError for an unlabelled test split, unreadable files (unless
    ``skip_bad_images``, which warns), or a split with no readable image.
    """
    reader.check_split(split)
    entry = _cached_or_built(reader, split, size, cache.cache_root(cache_dir))
    if entry is None or (split == "test" and entry.labels is None):
        raise unlabelled_test_error(reader.where)
    if entry.bad_images:  # stacklevel 5: the caller of load_images
        report_bad_images(entry.bad_images, reader.where, skip_bad_images, locate=reader.locate, stacklevel=5)
    if entry.images.shape[0] == 0:
        hint = (
            f" (with class folders only, every {HOLDOUT_EVERY}th image of a class is held "
            f"out for test, so each class needs at least {HOLDOUT_EVERY} images)"
            if entry.layout == "holdout" and split == "test"
            else ""
        )
        raise UserError(f"no readable {split} images in {reader.where}{hint}")
    return Samples(entry.images, entry.labels, entry.classes, f"{reader.where} ({split})", entry.paths,
                   layout=entry.layout)


def _cached_or_built(reader: Reader, split: str, size: int, root: Path) -> CachedSplit | None:
    """The cached entry for ``split``; on a miss build every split and cache them all."""
    digest = reader.digest()
    entry = cache.load_entry(root, cache.entry_key(reader.kind, split, size, digest))
    if entry is not None:
        return entry
    built = reader.build(size)
    for name, part in built.items():
        cache.save_entry(root, cache.entry_key(reader.kind, name, size, digest), part)
    # read back (mapped, shared with other readers) when the cache took it; else the decoded copy
    key = cache.entry_key(reader.kind, split, size, digest)
    return (cache.load_entry(root, key) or built.get(split)) if split in built else None


def unlabelled_test_error(where: str) -> UserError:
    return UserError(
        f"{where} has no labelled test split (its images are not in class sub-folders): `kontrast diagnose` "
        "and `kontrast embed` work on it with --split train; kNN and linear scores (`kontrast eval`) need "
        "labels: put the images in one sub-folder per class, or pass --data a labelled source"
    )
