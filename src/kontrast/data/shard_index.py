"""The shard index: every sample of a set of tar shards addressable by number, with one seek.

Shards follow the WebDataset convention (https://github.com/webdataset/webdataset): members
grouped by key (the path up to the first dot of the file name), ``KEY.jpg`` (or ``.png``, ...)
the image, ``KEY.cls`` the class index, ``KEY.json`` optional metadata (``path``, ``class``).
:func:`open_shards` takes

* a folder written by ``kontrast shards`` (:mod:`kontrast.data.shard_writer`): its
  ``index.json`` gives every member's offset, and each shard's sha256 is checked against it
  (a changed shard is a one-line error naming it: write the shards again);
* a brace pattern (``"shards/train-{000000..000003}.tar"``, :mod:`kontrast.data.braces`), one
  ``.tar``, or a folder of ``.tar`` files without an index: each shard is scanned once
  (:mod:`kontrast.data.shard_scan`), and a changed shard is scanned anew;
* either at a URL (``s3://``, ``gs://``, ``https://``; :mod:`kontrast.data.remote`): a brace pattern or one
  ``.tar``, or a folder written by ``kontrast shards`` (its ``index.json`` read once). The index pass copies
  each shard whole into a bounded local cache and indexes the copy; samples are read from the copies, or by
  range requests when the set is larger than the cache (:mod:`kontrast.data.shard_cache`). The samples are
  numbered as they are from the same shards on disk, so a run's order and its resume do not depend on where
  the shards are.

Either way the result per shard (its offsets, and the images whose header is bad) is cached
under the kontrast cache dir (``shard-index/``), with the shard's sha256 and its size and
mtime (at a URL: its size and ETag): a later open whose stamp matches reads nothing but the
record; otherwise the shard is hashed (at a URL: copied) again. Every image is checked from its header only
(:func:`kontrast.data.headers.check_image_header`), and bad ones are refused or skipped
(``skip_bad_images``) with the memory path's one-line message (:func:`report_bad_images`).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from kontrast.data import cache
from kontrast.data.braces import expand_braces
from kontrast.data.decode import report_bad_images
from kontrast.data.headers import check_image_header
from kontrast.data.remote import is_url, read_file, scheme_of, stat_files
from kontrast.data.shard_cache import RemoteShard, remote_shards
from kontrast.data.shard_scan import image_member, scan_shard
from kontrast.data.shard_writer import INDEX_FORMAT, INDEX_NAME
from kontrast.errors import UserError

RECORD_FORMAT = 1  # of the cached per-shard records; bump when an entry's layout changes


@dataclass
class ShardIndex:
    """The samples of a set of shards, numbered 0..N-1 in shard order (bad ones skipped)."""

    where: str  # the spec as the user gave it, for messages
    shards: list[Path | RemoteShard]  # on disk, or at a URL
    shard_of: np.ndarray  # int32 [N]: which of ``shards`` holds sample i
    offsets: np.ndarray  # int64 [N]: byte offset of sample i's image data inside its tar
    sizes: np.ndarray  # int64 [N]: its size in bytes
    labels: np.ndarray | None  # int64 [N] (-1 where a sample of a labelled set has none); None: unlabelled
    keys: list[str]
    paths: list[str]  # the source path of each sample (its KEY.json), else its key
    classes: list[str]

    def __len__(self) -> int:
        return int(self.offsets.shape[0])


def read_sample(index: ShardIndex, i: int) -> tuple[bytes, int | None]:
    """Sample ``i``'s image bytes (as stored, not decoded) and label, read with one seek."""
    if not 0 <= i < len(index):
        raise IndexError(f"sample {i} of {len(index)}")
    shard, size = index.shards[int(index.shard_of[i])], int(index.sizes[i])
    if isinstance(shard, RemoteShard):
        data = shard.read(int(index.offsets[i]), size)
    else:
        with open(shard, "rb") as f:
            f.seek(int(index.offsets[i]))
            data = f.read(size)
    if len(data) != size:
        raise UserError(f"shard {shard} ends before sample {index.keys[i]} ({index.paths[i]}); it was "
                        "truncated after it was indexed: copy or write it again")
    return data, None if index.labels is None else int(index.labels[i])


def open_shards(spec: str | os.PathLike, *, split: str = "train", cache_dir: str | Path | None = None,
                skip_bad_images: bool = False) -> ShardIndex:
    """The index of the shards ``spec`` names (see the module doc); ``split`` picks the shards of an
    indexed folder (a pattern is its own split). Raises UserError for missing or changed shards and,
    unless ``skip_bad_images``, for bad images."""
    where = os.fspath(spec)
    folder = Path(where).expanduser()
    if is_url(where):
        listing, classes = _remote_listing(where, split, cache_dir)
    elif folder.is_dir() and (folder / INDEX_NAME).is_file():
        listing, classes = _listed_shards(folder, split)
    else:
        listing, classes = [(p, None) for p in shard_files(where)], None
    root = cache.cache_root(cache_dir) / "shard-index"
    entries, bad, skip = [], [], set()
    for path, listed in listing:
        entry, shard_bad = _verified_entry(path, listed, root, where)
        entries.append(entry)
        source_path = dict(zip(entry["keys"], entry["paths"])) if shard_bad else {}
        for key, member, why in shard_bad:  # named as shard:member, with the source path where it differs
            rel = source_path.get(key, key)
            bad.append((f"{path.name}:{member}" + (f" ({rel})" if rel != key else ""), why))
            skip.add((path.name, key))
    if bad:
        report_bad_images(bad, where, skip_bad_images, stacklevel=3)
    shards = [replace(s, sha256=e["sha256"]) if isinstance(s, RemoteShard) else s  # later copies checked against it
              for (s, _), e in zip(listing, entries)]
    return _assemble(where, shards, entries, skip, classes)


def names_index_folder(spec: str) -> bool:
    """Whether ``spec`` is a folder written by ``kontrast shards`` (with ``index.json``: train and test splits), not
    a pattern or a folder of ``.tar`` files (one split). At a URL: anything but ``.tar`` files names such a folder."""
    if is_url(spec):
        return not _names_tar_files(spec)
    return (Path(spec).expanduser() / INDEX_NAME).is_file()


def _names_tar_files(spec: str) -> bool:
    """A pattern of ``.tar`` files or one (at a URL its path does, a query such as a signature aside)."""
    path = urlsplit(spec).path if is_url(spec) else spec
    return path.endswith(".tar") or ("{" in path and ".tar" in path)


def _listed_shards(folder: Path, split: str) -> tuple[list[tuple[Path, dict]], list[str]]:
    text = (folder / INDEX_NAME).read_bytes()
    shards, classes = _split_of_index(text, str(folder), split)
    return [(folder / s["name"], s) for s in shards], classes


def _split_of_index(text: bytes, folder: str, split: str) -> tuple[list[dict], list[str]]:
    """The entries of ``split``'s shards in the text of ``folder``'s index.json, and the class names."""
    try:
        index = json.loads(text)
        if index.get("format") != INDEX_FORMAT:
            raise ValueError(f"format {index.get('format')!r}, not {INDEX_FORMAT!r}")
        shards = [s for s in index["shards"] if s["split"] == split]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"cannot read {folder}/{INDEX_NAME} ({exc}); write the shards again with "
                        "`kontrast shards`, or pass a pattern of the .tar files to index them anew") from exc
    if not shards:
        have = ", ".join(sorted(index.get("splits", {}))) or "none"
        raise UserError(f"{folder} has no {split} shards (its splits: {have})")
    return shards, [str(c) for c in index.get("classes", [])]


def _remote_listing(spec: str, split: str, cache_dir) -> tuple[list[tuple[RemoteShard, dict | None]], list | None]:
    """The shards a URL names (a pattern, one .tar, or a folder with index.json: read once), each found and
    stamped; ``(shard, its index.json entry or None)`` and the index's class names (None without one)."""
    scheme_of(spec)  # an unknown scheme: one line naming those kontrast reads
    if _names_tar_files(spec):
        try:
            urls, listed, classes = expand_braces(spec), None, None
        except ValueError as exc:
            raise UserError(f"bad shard pattern: {exc}") from exc
    else:
        folder = spec.rstrip("/")
        if "." in urlsplit(folder).path.rsplit("/", 1)[-1]:  # a file of another kind (an archive, a .jsonl)
            raise UserError(f"{spec} is not a .tar shard; at a URL kontrast reads tar shards: a .tar, a pattern "
                            "'.../train-{000000..000009}.tar', or a folder written by `kontrast shards`")
        text = read_file(f"{folder}/{INDEX_NAME}")
        if text is None:
            raise UserError(f"{folder}/{INDEX_NAME} not found: pass a folder written by `kontrast shards` (with "
                            f"its {INDEX_NAME}) or a pattern of .tar files: '{folder}/train-{{000000..000003}}.tar'")
        listed, classes = _split_of_index(text, folder, split)
        urls = [f"{folder}/{s['name']}" for s in listed]
    stats = stat_files(urls)
    missing = [u for u, s in zip(urls, stats) if s is None]
    if missing:
        raise UserError(f"shard not found: {missing[0]} ({len(missing)} of the {len(urls)} shards that {spec} names "
                        "are missing)")
    return list(zip(remote_shards(urls, stats, cache_dir), listed or [None] * len(urls))), classes


def shard_files(spec: str) -> list[Path]:
    """The shard files a pattern, a .tar or a folder of .tar files names, all present."""
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.tar"))
        if not files:
            raise UserError(f"{path} holds no .tar shards and no {INDEX_NAME}; pass a folder written by "
                            "`kontrast shards` or a pattern like 'shards/train-{000000..000003}.tar'")
        return files
    try:
        names = expand_braces(os.path.expanduser(spec))
    except ValueError as exc:
        raise UserError(f"bad shard pattern: {exc}") from exc
    missing = [n for n in names if not Path(n).is_file()]
    if missing:
        raise UserError(f"shard not found: {missing[0]} ({len(missing)} of the {len(names)} shards that "
                        f"{spec} names are missing)")
    return [Path(n) for n in names]


def _verified_entry(shard: Path | RemoteShard, listed: dict | None, root: Path, where: str) -> tuple[dict, list]:
    """A shard's index entry and its bad images: from the cached record when its stamp (size and mtime; at a
    URL size and ETag) still matches, else hashed (and checked against ``listed``, or scanned) and cached again;
    a shard at a URL is copied into the shard cache first, and the copy is what is read."""
    if isinstance(shard, RemoteShard):
        stamp, name = [shard.size, shard.stamp], shard.url
    elif not shard.is_file():
        raise UserError(f"shard not found: {shard} (listed in {where}/{INDEX_NAME}); copy it back, or write "
                        "the shards again with `kontrast shards`")
    else:
        stat = shard.stat()
        stamp, name = [stat.st_size, stat.st_mtime_ns], str(shard.resolve())
    how = "listed" if listed is not None else "scanned"  # an index.json's entry, or a scan's (with class names)
    record_path = root / (hashlib.sha256(f"{how}\0{name}".encode()).hexdigest() + ".json")
    record = _load_record(record_path)
    if record and record["stamp"] == stamp and (listed is None or record["entry"]["sha256"] == listed["sha256"]):
        return listed or record["entry"], record["bad"]
    path = shard.cache.fetch(shard) if isinstance(shard, RemoteShard) else shard
    digest = cache.file_digest(path)
    if listed is not None and digest != listed["sha256"]:
        raise UserError(f"shard {shard} changed since {INDEX_NAME} was written (sha256 {digest[:12]}..., "
                        f"index says {listed['sha256'][:12]}...); write the shards again with `kontrast "
                        "shards`, or pass a pattern of the .tar files to index them anew")
    entry, bad = (listed, _check_listed(path, listed)) if listed is not None else scan_shard(path, digest, str(shard))
    kept = entry if listed is None else {"sha256": digest}  # a listed entry stays in its index.json
    _save_record(record_path, {"format": RECORD_FORMAT, "path": name, "stamp": stamp, "entry": kept, "bad": bad})
    return entry, bad


def _load_record(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["format"] != RECORD_FORMAT:
            return None
        return record
    except (ValueError, KeyError, TypeError, OSError) as exc:
        warnings.warn(f"ignoring unreadable shard index record {path} ({exc}); indexing the shard anew",
                      stacklevel=4)
        return None


def _save_record(path: Path, record: dict) -> None:
    """Write atomically; an unwritable cache only costs a new index pass next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cache.write_atomic(path, json.dumps(record, separators=(",", ":")).encode("utf-8"))
    except OSError as exc:
        warnings.warn(f"could not cache the shard index in {path.parent} ({exc}); continuing without it",
                      stacklevel=4)


def _check_listed(path: Path, entry: dict) -> list[list[str]]:
    """Header check of every image an index lists, each read with one seek: ``[key, member, reason]`` of the bad."""
    bad = []
    with open(path, "rb") as f:
        for key, members in zip(entry["keys"], entry["members"]):
            ext = image_member(members)
            if ext is None:
                bad.append([key, key, "no image member (KEY.jpg, KEY.png, ...)"])
                continue
            offset, size = members[ext]
            f.seek(offset)
            why = check_image_header(f.read(size))
            if isinstance(why, str):
                bad.append([key, f"{key}.{ext}", why])
    return bad


def _assemble(where: str, shards: list[Path], entries: list[dict], skip: set[tuple[str, str]],
              classes: list[str] | None) -> ShardIndex:
    """Concatenate the shards' entries into arrays, leaving out the bad samples (``(shard name, key)``)."""
    shard_of, offsets, sizes, labels, keys, paths, names = [], [], [], [], [], [], {}
    labelled = any(e.get("labels") is not None for e in entries)
    for s, (shard, entry) in enumerate(zip(shards, entries)):
        names.update({int(k): v for k, v in entry.get("class_names", {}).items()})
        entry_labels = entry.get("labels") or [None] * entry["count"]
        for key, members, label, rel in zip(entry["keys"], entry["members"], entry_labels, entry["paths"]):
            ext = image_member(members)
            if ext is None or (shard.name, key) in skip:
                continue
            shard_of.append(s)
            offsets.append(members[ext][0])
            sizes.append(members[ext][1])
            labels.append(-1 if label is None else label)
            keys.append(key)
            paths.append(rel)
    if not offsets:
        raise UserError(f"no readable images in the shards of {where}")
    if classes is None:  # scanned shards: names from KEY.json where given, else the numbers
        top = max([*labels, *names, -1]) + 1
        classes = [names.get(i, str(i)) for i in range(top)] if labelled else []
    return ShardIndex(where, shards, np.array(shard_of, dtype=np.int32), np.array(offsets, dtype=np.int64),
                      np.array(sizes, dtype=np.int64), np.array(labels, dtype=np.int64) if labelled else None,
                      keys, paths, classes)
