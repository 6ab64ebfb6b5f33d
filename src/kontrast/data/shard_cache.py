"""Shards at a URL read through a bounded local cache: each shard copied whole, least recently used ones evicted.

A training epoch visits samples in the global random order of (seed, epoch), so consecutive reads hit shards at
random. Reading each sample by an HTTP range request costs one round trip per image (an object store's first byte
takes tens of ms, where decoding the image takes about one) and one billed request; copying each shard whole once
and reading samples from the copy with one seek costs one download per shard per cache lifetime and makes later
epochs local. So:

* the index pass (:func:`kontrast.data.shard_index.open_shards`) copies every shard whole, as it must read every
  member's header anyway (and hash the shard, checked against ``index.json`` where there is one);
* while the whole set fits the cache limit (``KONTRAST_REMOTE_CACHE``, default :data:`DEFAULT_LIMIT`), a read
  from a shard that is not on disk (evicted, or a later run) copies it whole again (:meth:`ShardCache.fetch`);
* a set larger than the limit would make that thrash (a shard copied for every sample), so it is read by one
  range request per sample instead, shards still on disk read from there.

The choice is made once per open (:attr:`ShardCache.whole`) and said on the run's start-up line. A copy is named
by the shard's URL, size and ETag (or generation, Last-Modified), so a changed object is never read from an old
copy; it is downloaded in ranges of :data:`CHUNK` bytes, a few at once, each retried on its own
(:mod:`kontrast.data.remote`), hashed on the way and checked against the sha256 the index recorded, written to a
temp file and renamed, under a lock file so that DataLoader workers and ranks wanting the same shard download it
once. After each download the least recently used copies (by mtime, touched on use) are deleted until the folder
is within the limit; a reader whose copy was evicted under it copies it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from kontrast.data import cache
from kontrast.data.remote import read_ranges
from kontrast.errors import UserError

LIMIT_VAR = "KONTRAST_REMOTE_CACHE"
DEFAULT_LIMIT = 8 << 30  # 8 GiB
CHUNK = 8 << 20  # bytes of one range request of a download
PARALLEL = 4  # of them in flight: one connection rarely fills a link to an object store
TOUCH_EVERY = 60.0  # seconds between two mtime updates of a copy in use, per process
FOLDER = "remote-shards"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_touched: dict[Path, float] = {}


def cache_limit() -> int:
    """Bytes of shard copies to keep: ``$KONTRAST_REMOTE_CACHE`` (``8G``, ``500M``; ``0``: only the last copy made)."""
    text = os.environ.get(LIMIT_VAR, "").strip()
    if not text:
        return DEFAULT_LIMIT
    match = re.fullmatch(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?", text.lower())
    if not match:
        raise UserError(f"{LIMIT_VAR}={text!r} is not a size; give bytes with an optional unit: 8G, 500M, 0")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


@dataclass(frozen=True)
class ShardCache:
    """Where copies of one open's remote shards live, how much they may take, and whether to copy or read ranges."""

    folder: Path
    limit: int  # bytes
    total: int  # bytes of the shards of this open

    @property
    def whole(self) -> bool:
        """Copy shards whole on a miss (the set fits the limit), else read a missing sample by a range request."""
        return self.total <= self.limit

    def summary(self) -> str:
        """How samples are read, for the start-up line."""
        size, limit = cache.bytes_in_words(self.total, ".3g"), cache.bytes_in_words(self.limit, ".3g")
        if self.whole:
            return f"remote shards ({size}) copied whole into {self.folder} ({LIMIT_VAR}: {limit})"
        return (f"remote shards ({size}) over {LIMIT_VAR} ({limit}): samples read by one range request each (raise "
                f"it to copy shards whole into {self.folder})")

    def path_of(self, shard: RemoteShard) -> Path:
        key = hashlib.sha256(f"{shard.url}\0{shard.size}\0{shard.stamp}".encode()).hexdigest()[:24]
        return self.folder / f"{key}-{shard.name}"

    def local(self, shard: RemoteShard) -> Path | None:
        """The copy of ``shard`` on disk (its mtime touched as used), or None."""
        path = self.path_of(shard)
        if not path.is_file():
            return None
        if time.monotonic() - _touched.get(path, -TOUCH_EVERY) >= TOUCH_EVERY:
            with contextlib.suppress(OSError):  # evicted just now: the caller's read finds out
                _touch(path)
        return path

    def fetch(self, shard: RemoteShard) -> Path:
        """The copy of ``shard``, downloaded whole first when not on disk; then the cache brought within its limit."""
        path = self.local(shard)
        if path is not None:
            return path
        path = self.path_of(shard)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with _locked(path.with_name(f".{path.name}.lock")):
                if not path.is_file():  # another process may have copied it while this one waited
                    _download(shard, path)
                _touch(path)
            self._evict(keep=path)
        except OSError as exc:
            raise UserError(f"cannot write the shard cache {self.folder} ({exc.strerror or exc}); free space there, "
                            f"set KONTRAST_CACHE to another folder, or {LIMIT_VAR} lower") from exc
        return path

    def read(self, shard: RemoteShard, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of ``shard``: from its copy (made now when the set fits), else by a range."""
        for _ in range(2):  # a copy evicted between finding and opening it is fetched again, once
            path = self.local(shard) or (self.fetch(shard) if self.whole else None)
            if path is None:
                return read_ranges(shard.url, [(offset, offset + size)])[0]
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    return f.read(size)
            except FileNotFoundError:
                continue
        return read_ranges(shard.url, [(offset, offset + size)])[0]

    def _evict(self, keep: Path) -> None:
        """Delete the least recently used copies until the folder is within the limit (``keep`` stays)."""
        copies = []
        for path in self.folder.glob("*.tar"):
            with contextlib.suppress(FileNotFoundError):  # another process evicted it
                stat = path.stat()
                copies.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in copies)
        for _, size, path in sorted(copies):
            if total <= self.limit:
                break
            if path != keep:
                path.unlink(missing_ok=True)
                path.with_name(f".{path.name}.lock").unlink(missing_ok=True)
                total -= size


@dataclass(frozen=True)
class RemoteShard:
    """One shard at a URL, as it was when listed: what :class:`ShardIndex` holds in place of a local path."""

    url: str
    size: int
    stamp: str  # ETag, generation or Last-Modified: a copy is named by it
    cache: ShardCache
    sha256: str = ""  # set once indexed: every later download is checked against it

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return self.url

    def read(self, offset: int, size: int) -> bytes:
        return self.cache.read(self, offset, size)


def remote_shards(urls: list[str], stats: list[dict], cache_dir: str | Path | None) -> list[RemoteShard]:
    """The shards at ``urls`` (``stats``: their sizes and stamps), sharing one cache under the kontrast cache dir."""
    shared = ShardCache(cache.cache_root(cache_dir) / FOLDER, cache_limit(), sum(s["size"] for s in stats))
    return [RemoteShard(url, s["size"], s["stamp"], shared) for url, s in zip(urls, stats)]


def _download(shard: RemoteShard, path: Path) -> None:
    """Copy ``shard`` to ``path``: ranges of CHUNK bytes, PARALLEL at a time, hashed; a temp file renamed at the end."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            for first in range(0, shard.size, CHUNK * PARALLEL):
                last = min(first + CHUNK * PARALLEL, shard.size)
                for part in read_ranges(shard.url, [(s, min(s + CHUNK, last)) for s in range(first, last, CHUNK)]):
                    f.write(part)
                    digest.update(part)
        if shard.sha256 and digest.hexdigest() != shard.sha256:
            raise UserError(f"shard {shard.url} changed since it was indexed (sha256 {digest.hexdigest()[:12]}..., "
                            f"indexed {shard.sha256[:12]}..., same size and stamp); open the shards again to index "
                            f"them anew (delete {path.parent.parent / 'shard-index'} if the store gives no ETag)")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _touch(path: Path) -> None:
    """Mark ``path`` used now: its mtime set to the clock's nanoseconds (the kernel's own stamp is coarse, a few ms,
    and copies made in a row would tie)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))
    _touched[path] = time.monotonic()


@contextlib.contextmanager
def _locked(lock: Path):
    """An exclusive lock on ``lock`` (created if absent) for the block: one download of a shard at a time."""
    import fcntl  # POSIX (Linux, macOS), imported here so that importing kontrast.data needs it nowhere else

    with open(lock, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
