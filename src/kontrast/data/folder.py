"""Trees of image files: an ImageFolder-style folder, or a tar archive of one.

Folders are read file by file (only the images the layout uses); archives (``.tar``,
``.tar.gz`` / ``.tgz``, ``.tar.bz2``, ``.tar.xz``) are streamed once with :mod:`tarfile`, never
unpacked to disk. Both divide into splits by :func:`kontrast.data.layout.plan_layout`, and each
row's path is the file's path relative to the folder, or inside the archive. An archive with no
images but a CIFAR pickle folder (the official ``cifar-10-python.tar.gz``) is read as CIFAR.
"""

from __future__ import annotations

import os
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from kontrast.data import cache
from kontrast.data.cache import CachedSplit
from kontrast.data.cifar import build_cifar, find_cifar_folder, find_cifar_members, is_cifar_member, member_reader
from kontrast.data.decode import MAX_FILE_BYTES, Blob, decode_blobs, read_regular_file
from kontrast.data.layout import is_image_path, list_files, plan_layout
from kontrast.data.reader import Reader, load_cached, unlabelled_test_error
from kontrast.data.samples import Samples, SourceKind
from kontrast.errors import UserError
from kontrast.registry import SOURCES

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


class FolderReader(Reader):
    """An ImageFolder-style directory tree; read file by file, only images it will use."""

    kind = "folder"

    def __init__(self, path: Path):
        self.path, self.where = path, str(path)
        self.plan = plan_layout(list_files(path), self.where)

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
            raise unlabelled_test_error(self.where)

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


class TarReader(Reader):
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
            found = find_cifar_members(extras)
            if found:
                kind, prefix = found
                read = member_reader(extras, prefix, self.where)
                return build_cifar(kind, read, self.where, size)
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
                    if is_image_path(name) and member.size > MAX_FILE_BYTES:
                        self.read_errors[name] = (f"{member.size} bytes, larger than the "
                                                  f"{MAX_FILE_BYTES >> 20} MiB limit")
                        yield name, b""
                    elif is_image_path(name):
                        yield name, _read_member(archive, member)
                    elif is_cifar_member(name):
                        extras[name] = _read_member(archive, member)
        except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            raise UserError(
                f"cannot read archive {self.where} ({exc}); it may be truncated or corrupt: "
                "download or create it again"
            ) from exc


def _read_member(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = archive.extractfile(member)
    return f.read() if f is not None else b""


def _clean_member_name(name: str) -> str:
    """Archive member name as a relative POSIX path ('./a/b' -> 'a/b')."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    return "/".join(parts)


def is_tar(path: Path) -> bool:
    """By suffix, or by content for archives with an unusual name."""
    if path.name.lower().endswith(TAR_SUFFIXES):
        return True
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


def _is_folder(source: str) -> bool:
    path = Path(source).expanduser()
    return path.is_dir() and find_cifar_folder(path) is None


def _is_archive(source: str) -> bool:
    path = Path(source).expanduser()
    return path.exists() and not path.is_dir() and is_tar(path)


def load_folder(
    source: str | os.PathLike, split: str, *, size: int, cache_dir: str | Path | None = None,
    skip_bad_images: bool = False,
) -> Samples:
    """One split of an ImageFolder-style folder, through the cache."""
    reader = FolderReader(Path(source).expanduser())
    return load_cached(reader, split, size=size, cache_dir=cache_dir, skip_bad_images=skip_bad_images)


def load_tar(
    source: str | os.PathLike, split: str, *, size: int, cache_dir: str | Path | None = None,
    skip_bad_images: bool = False,
) -> Samples:
    """One split of a tar archive of an ImageFolder tree (or of CIFAR pickles), through the cache."""
    reader = TarReader(Path(source).expanduser())
    return load_cached(reader, split, size=size, cache_dir=cache_dir, skip_bad_images=skip_bad_images)


SOURCES.register("folder")(SourceKind(order=2, matches=_is_folder, load=load_folder))
SOURCES.register("tar")(SourceKind(order=2, matches=_is_archive, load=load_tar))
