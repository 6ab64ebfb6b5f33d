"""On-disk cache of decoded datasets, keyed by content.

Decoding 60k JPEGs takes seconds; reading one uint8 tensor back takes a fraction of that. An
entry is two files named by its key: ``<key>.safetensors`` (images, and labels when labelled)
and ``<key>.json`` (classes, name, layout, each row's path, unreadable files, and the sha256 of
the tensor file). The key hashes what the result depends on (source kind, split, size, format
version and the source's bytes), so an edited dataset gets a new entry and a moved one keeps its own.

Writes are atomic (temp file in the same folder, fsync, ``os.replace``); the JSON is written
last, so its presence certifies a complete tensor file. Any entry that fails to read or
verify is ignored with a warning and rebuilt by the caller.

Reads map the tensor file into memory (safetensors' ``load_file``, its mmap backend) instead of
copying it: the processes that read one entry, such as the ranks of a distributed run on one node,
share one copy of its pages (docs/distributed.md, "Memory"). The mapping is private
(copy-on-write), so writing into the tensors never changes the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch

# 2: decompression-bomb and special-file guards; 3: row paths.
# Bump when decoding or the entry layout changes: old entries then miss
FORMAT_VERSION = 3
ENV_VAR = "KONTRAST_CACHE"


@dataclass
class CachedSplit:
    """One decoded split as stored: what :class:`~kontrast.data.Samples` needs, plus notes.

    ``paths`` names each row's file (relative to the source root, or ``"data_batch_1/123"`` for
    CIFAR pickles). ``bad_images`` holds ``(path inside the source, reason)`` for every unreadable
    file of the split, so a later load can report or skip them without decoding again. ``layout`` is how
    the source was read ("splits", "holdout", "flat", "cifar"), for error messages.
    """

    images: torch.Tensor  # uint8 [N, 3, size, size]
    labels: torch.Tensor | None  # int64 [N]
    classes: list[str]
    name: str
    layout: str
    paths: list[str]  # one per row
    bad_images: list[tuple[str, str]] = field(default_factory=list)


class ContentHasher:
    """sha256 over a sequence of named byte strings, unambiguous about where each one ends."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, name: str, data: bytes) -> None:
        encoded = name.encode("utf-8")
        for part in (encoded, data):
            self._h.update(len(part).to_bytes(8, "little"))
            self._h.update(part)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def bytes_in_words(n: float, spec: str = ".1f") -> str:
    """Bytes with a binary unit: ``"36.0 KiB"``, ``"23.5 GiB"`` (``spec``: the number's format, e.g. ``".3g"``)."""
    unit, power = next((u, p) for u, p in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10), ("B", 0))
                       if n >= 2**p or p == 0)
    return f"{n / 2**power:{spec}} {unit}"


def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, read in chunks (archives can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def entry_key(kind: str, split: str, size: int, content_digest: str) -> str:
    """The cache key of one split of one source at one image size."""
    header = f"kontrast-data v{FORMAT_VERSION}\0{kind}\0{split}\0{size}\0{content_digest}"
    return hashlib.sha256(header.encode("utf-8")).hexdigest()


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` if given, else ``$KONTRAST_CACHE``, else ``~/.cache/kontrast``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kontrast"


def load_entry(root: Path, key: str) -> CachedSplit | None:
    """The entry stored under ``key``, or None when absent or unusable (then rebuild it)."""
    meta_path = root / f"{key}.json"
    if not meta_path.is_file():
        return None
    try:
        return _read_entry(root, key)
    except Exception as exc:  # any failure means "not cached": corrupt JSON, bad tensors, ...
        warnings.warn(
            f"ignoring unreadable dataset cache entry {meta_path} ({exc}); rebuilding it",
            stacklevel=3,
        )
        return None


def save_entry(root: Path, key: str, entry: CachedSplit) -> None:
    """Store ``entry`` under ``key``; on a file-system error warn and carry on uncached."""
    tensors = {"images": entry.images.contiguous()}
    if entry.labels is not None:
        tensors["labels"] = entry.labels.contiguous()
    blob = safetensors.torch.save(tensors)
    meta = {
        "format": FORMAT_VERSION,
        "key": key,
        "count": int(entry.images.shape[0]),
        "size": int(entry.images.shape[-1]),
        "labelled": entry.labels is not None,
        "classes": entry.classes,
        "name": entry.name,
        "layout": entry.layout,
        "paths": entry.paths,
        "bad_images": [list(item) for item in entry.bad_images],
        "tensors_sha256": hashlib.sha256(blob).hexdigest(),
    }
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(root / f"{key}.safetensors", blob)
        write_atomic(root / f"{key}.json", json.dumps(meta, indent=1).encode("utf-8"))
    except OSError as exc:
        warnings.warn(
            f"could not write the dataset cache in {root} ({exc}); continuing without it "
            f"(set {ENV_VAR} or pass a writable cache_dir)",
            stacklevel=3,
        )


def _read_entry(root: Path, key: str) -> CachedSplit:
    """Read and verify one entry; raises on any inconsistency."""
    meta = json.loads((root / f"{key}.json").read_text(encoding="utf-8"))
    if meta["format"] != FORMAT_VERSION or meta["key"] != key:
        raise ValueError("entry written by another format version or for another key")
    path = root / f"{key}.safetensors"
    if file_digest(path) != meta["tensors_sha256"]:
        raise ValueError("tensor file does not match its checksum")
    tensors = safetensors.torch.load_file(path)  # memory-mapped: readers of one entry share its pages
    images, labels = tensors["images"], tensors.get("labels")
    _check_tensors(images, labels, meta)
    return CachedSplit(
        images=images,
        labels=labels,
        classes=[str(c) for c in meta["classes"]],
        name=str(meta["name"]),
        layout=str(meta["layout"]),
        paths=[str(p) for p in meta["paths"]],
        bad_images=[(str(p), str(r)) for p, r in meta["bad_images"]],
    )


def _check_tensors(images: torch.Tensor, labels: torch.Tensor | None, meta: dict) -> None:
    """Raise ValueError unless the tensors have the dtypes and shapes the JSON promises."""
    n, size = meta["count"], meta["size"]
    if images.dtype != torch.uint8 or tuple(images.shape) != (n, 3, size, size):
        raise ValueError(f"images are {images.dtype} {tuple(images.shape)}")
    if len(meta["paths"]) != n:
        raise ValueError(f"{len(meta['paths'])} paths for {n} images")
    if meta["labelled"] != (labels is not None):
        raise ValueError("labels present/absent disagrees with the metadata")
    if labels is not None and (labels.dtype != torch.int64 or tuple(labels.shape) != (n,)):
        raise ValueError(f"labels are {labels.dtype} {tuple(labels.shape)}")
    if labels is not None and n and not 0 <= labels.min() <= labels.max() < len(meta["classes"]):
        raise ValueError("labels outside the class list")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; a cache folder may be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
