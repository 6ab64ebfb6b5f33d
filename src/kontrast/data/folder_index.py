"""The header pass of the streaming path over an ImageFolder tree: every file's size, or why it is unusable.

The streaming path (:mod:`kontrast.data.stream_source`) decodes each image when a batch needs it, so an
unreadable file would otherwise surface mid-epoch. One pass at start-up reads every planned file once and
checks its header (:func:`kontrast.data.headers.check_image_header`: format, size, the decompression-bomb
limit, truncation from end markers) without decoding a pixel, and records each image's width and height
(the start-up line reports their range). The result is cached under the kontrast cache dir
(``folder-index/``), keyed by every file's relative path, byte size and mtime: a later start that finds
the same stamps reads nothing but the record; any change (a file added, edited, touched) redoes the pass.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

from kontrast.data import cache
from kontrast.data.decode import read_regular_file
from kontrast.data.headers import check_image_header

RECORD_FORMAT = 1  # bump when the record's layout or the checks change


def _stamp(root: Path, paths: list[str]) -> str:
    """sha256 over (path, size, mtime) of every file: what the cached record must match."""
    hasher = hashlib.sha256(str(root.resolve()).encode("utf-8"))
    for rel in paths:
        try:
            info = (root / rel).stat()
            hasher.update(f"\0{rel}\0{info.st_size}\0{info.st_mtime_ns}".encode())
        except OSError:
            hasher.update(f"\0{rel}\0missing".encode())
    return hasher.hexdigest()


def check_folder_headers(root: Path, paths: list[str], cache_dir: str | Path | None = None) -> list[list | str]:
    """Per path of ``paths`` (relative to ``root``): ``[width, height]``, or the reason it is unusable.

    Cached by the files' stamps (see the module doc); an unwritable cache only costs the pass next time.
    """
    stamp = _stamp(root, paths)
    record_path = cache.cache_root(cache_dir) / "folder-index" / f"{stamp}.json"
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if record["format"] == RECORD_FORMAT and len(record["headers"]) == len(paths):
            return record["headers"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no record yet (or an unreadable one): do the pass
    headers: list[list | str] = []
    for rel in paths:
        data = read_regular_file(root / rel)
        checked = data if isinstance(data, str) else check_image_header(data)
        headers.append(checked if isinstance(checked, str) else [checked[1], checked[2]])
    try:
        record_path.parent.mkdir(parents=True, exist_ok=True)
        body = {"format": RECORD_FORMAT, "root": str(root.resolve()), "headers": headers}
        cache.write_atomic(record_path, json.dumps(body, separators=(",", ":")).encode("utf-8"))
    except OSError as exc:
        warnings.warn(f"could not cache the folder's header pass in {record_path.parent} ({exc}); continuing",
                      stacklevel=3)
    return headers
