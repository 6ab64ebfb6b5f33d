"""torchvision-format CIFAR pickles: ``cifar-10-batches-py/`` or ``cifar-100-python/``.

The folder itself, its parent (registered here as the ``cifar`` source), or the official
``.tar.gz`` that holds it (found by the tar reader, :mod:`kontrast.data.folder`). The pickles are
read with a restricted unpickler that can only build numpy arrays: never plain ``pickle.load``.
Each row's path is ``"<batch file>/<row>"`` (``"data_batch_1/123"``, ``"test_batch/17"``).
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kontrast.data import cache
from kontrast.data.cache import CachedSplit
from kontrast.data.decode import fit_batch
from kontrast.data.reader import Reader, load_cached
from kontrast.data.samples import Samples, SourceKind
from kontrast.errors import UserError
from kontrast.registry import SOURCES


@dataclass(frozen=True)
class CifarFormat:
    folder: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str
    names_key: str
    labels_key: str

    def files(self) -> tuple[str, ...]:
        return (*self.train, *self.test, self.meta)


CIFAR_FORMATS = {
    "cifar10": CifarFormat(
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        ("test_batch",),
        "batches.meta",
        "label_names",
        "labels",
    ),
    "cifar100": CifarFormat(
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


def find_cifar_folder(path: Path) -> tuple[str, Path] | None:
    """(kind, folder) when ``path`` is, or directly contains, a CIFAR pickle folder."""
    for kind, fmt in CIFAR_FORMATS.items():
        for folder in (path, path / fmt.folder):
            if (folder / fmt.meta).is_file() and (folder / fmt.train[0]).is_file():
                return kind, folder
    return None


def is_cifar_member(name: str) -> bool:
    """Whether an archive member is one of a CIFAR pickle folder's files."""
    parts = name.split("/")
    return len(parts) >= 2 and any(
        parts[-2] == fmt.folder and parts[-1] in fmt.files() for fmt in CIFAR_FORMATS.values()
    )


def find_cifar_members(extras: dict[str, bytes]) -> tuple[str, str] | None:
    """(kind, member prefix) of a CIFAR pickle folder found inside an archive."""
    for kind, fmt in CIFAR_FORMATS.items():
        for name in extras:
            if name.endswith(f"{fmt.folder}/{fmt.meta}"):
                return kind, name[: -len(fmt.meta)]
    return None


def member_reader(extras: dict[str, bytes], prefix: str, where: str) -> Callable[[str], bytes]:
    """``read(file name)`` over CIFAR members stashed while streaming an archive."""

    def read(name: str) -> bytes:
        if prefix + name not in extras:
            raise UserError(f"{where} lacks {prefix}{name}; download the CIFAR archive again")
        return extras[prefix + name]

    return read


class CifarReader(Reader):
    """``cifar-10-batches-py`` / ``cifar-100-python``; keyed by the bytes of its files."""

    def __init__(self, given: Path, kind: str, folder: Path):
        self.kind, self.folder, self.where = kind, folder, str(given)
        self.format = CIFAR_FORMATS[kind]

    def digest(self) -> str:
        hasher = cache.ContentHasher()
        for name in self.format.files():
            hasher.add(name, self._read(name))
        return hasher.hexdigest()

    def build(self, size: int) -> dict[str, CachedSplit]:
        return build_cifar(self.kind, self._read, self.where, size)

    def _read(self, name: str) -> bytes:
        try:
            return (self.folder / name).read_bytes()
        except OSError as exc:
            raise UserError(
                f"{self.folder} is missing or cannot read {name} ({exc}); download the "
                "CIFAR dataset again"
            ) from exc


def build_cifar(
    kind: str, read: Callable[[str], bytes], where: str, size: int
) -> dict[str, CachedSplit]:
    """Both splits of a CIFAR pickle folder; ``read(file name)`` returns a file's bytes."""
    fmt = CIFAR_FORMATS[kind]
    meta = _bytes_keys(safe_unpickle(read(fmt.meta), f"{where}/{fmt.meta}"), where)
    classes = [_text(c) for c in meta.get(fmt.names_key, [])]
    if not classes:
        raise UserError(f"{where}/{fmt.meta} has no {fmt.names_key}; download it again")
    out = {}
    for split, files in (("train", fmt.train), ("test", fmt.test)):
        parts = [_cifar_batch(read(f), f"{where}/{f}", fmt.labels_key, len(classes)) for f in files]
        images = torch.cat([p[0] for p in parts])  # uint8 [N, 3, 32, 32]
        labels = torch.cat([p[1] for p in parts])  # int64 [N]
        paths = [f"{f}/{i}" for f, p in zip(files, parts) for i in range(len(p[1]))]
        out[split] = CachedSplit(images=fit_batch(images, size), labels=labels, classes=classes, name=where,
                                 layout="cifar", paths=paths)
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


def _is_cifar_folder(source: str) -> bool:
    path = Path(source).expanduser()
    return path.is_dir() and find_cifar_folder(path) is not None


def load_cifar(
    source: str | os.PathLike, split: str, *, size: int, cache_dir: str | Path | None = None,
    skip_bad_images: bool = False,
) -> Samples:
    """One split of a CIFAR pickle folder (or its parent), through the cache."""
    path = Path(source).expanduser()
    found = find_cifar_folder(path)
    if found is None:
        raise UserError(f"{path} holds no cifar-10-batches-py or cifar-100-python folder")
    reader = CifarReader(path, *found)
    return load_cached(reader, split, size=size, cache_dir=cache_dir, skip_bad_images=skip_bad_images)


SOURCES.register("cifar")(SourceKind(order=2, matches=_is_cifar_folder, load=load_cifar))
