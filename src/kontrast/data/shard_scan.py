"""Index a tar shard that nobody indexed, in the WebDataset convention, by one pass over its headers.

The convention (https://github.com/webdataset/webdataset): a sample is the run of consecutive
members that share a key, the member path up to the first dot of its file name
(``dir/abc.seg.png``: key ``dir/abc``, extension ``seg.png``); ``KEY.jpg`` (or ``.png``, ...) is
the image, ``KEY.cls`` the class index as text, ``KEY.json`` optional metadata (``path``,
``class``). :func:`scan_shard` reads the tar with :mod:`tarfile` in random-access mode (member
data is seeked over), reads only the small members and each image once for its header check,
and holds one sample's bytes at a time.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

from kontrast.data.decode import MAX_FILE_BYTES
from kontrast.data.headers import check_image_header
from kontrast.errors import UserError

IMAGE_MEMBERS = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "pnm", "bmp", "gif", "tif", "tiff")
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's split: key up to the first dot


def image_member(members: dict) -> str | None:
    """The extension of a sample's image member (the first of IMAGE_MEMBERS it has), or None."""
    return next((ext for ext in IMAGE_MEMBERS if ext in members), None)


class _Scan:
    """What a scan of one shard collects, sample by sample (only the current sample's bytes are held)."""

    def __init__(self) -> None:
        self.keys, self.members, self.labels, self.paths = [], [], [], []
        self.names: dict[int, str] = {}
        self.bad: list[list[str]] = []

    def finish_sample(self, payloads: dict) -> None:
        """Label and path from KEY.cls and KEY.json; the image's header checked into ``bad``."""
        key, members = self.keys[-1], self.members[-1]
        try:
            meta = json.loads(payloads.get("json", b"{}"))
        except ValueError:
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        label = None
        if "cls" in payloads:
            try:
                label = int(payloads["cls"].decode("ascii").strip())
            except ValueError:
                self.bad.append([key, f"{key}.cls", f"not a class index: {payloads['cls'][:20]!r}"])
        if label is not None and isinstance(meta.get("class"), str):
            self.names[label] = meta["class"]
        ext = image_member(members)
        data = payloads.get(ext, b"") if ext else b""
        why = "no image member (KEY.jpg, KEY.png, ...)" if ext is None else (
            data if isinstance(data, str) else check_image_header(data))
        if isinstance(why, str):
            self.bad.append([key, f"{key}.{ext}" if ext else key, why])
        self.labels.append(label)
        self.paths.append(meta["path"] if isinstance(meta.get("path"), str) else key)


def scan_shard(path: Path, digest: str, source: str | None = None) -> tuple[dict, list[list[str]]]:
    """Index a shard nobody indexed: group members by key in tar order (as WebDataset does), read the
    small ones (``.cls``, ``.json``) and every image's header. Returns the entry and the bad samples.
    ``source``: where the shard is when ``path`` is a local copy of it (a URL), for its name and messages."""
    scan, payloads = _Scan(), {}
    try:
        with tarfile.open(path, mode="r:") as tar:  # random access: headers read, member data seeked over
            for member in tar:
                name = member.name[2:] if member.name.startswith("./") else member.name
                match = _KEY_EXT.match(name) if member.isfile() else None
                if match is None:
                    continue
                key, ext = match.group(1), match.group(2).lower()
                if not scan.keys or scan.keys[-1] != key:
                    if scan.keys:
                        scan.finish_sample(payloads)
                    scan.keys.append(key)
                    scan.members.append({})
                    payloads = {}
                scan.members[-1][ext] = [member.offset_data, member.size]
                if ext in IMAGE_MEMBERS and member.size > MAX_FILE_BYTES:
                    payloads[ext] = f"{member.size} bytes, larger than the {MAX_FILE_BYTES >> 20} MiB limit"
                elif ext in ("cls", "json", *IMAGE_MEMBERS):
                    payloads[ext] = tar.extractfile(member).read()
            if scan.keys:
                scan.finish_sample(payloads)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UserError(f"cannot read shard {source or path} ({exc}); it may be truncated or not a tar: copy or "
                        "write it again") from exc
    name = source.rstrip("/").rsplit("/", 1)[-1] if source else path.name
    entry = {"name": name, "split": None, "sha256": digest, "bytes": path.stat().st_size,
             "count": len(scan.keys), "member_count": sum(len(m) for m in scan.members), "keys": scan.keys,
             "labels": scan.labels if any(label is not None for label in scan.labels) else None,
             "paths": scan.paths, "members": scan.members,
             "class_names": {str(k): v for k, v in sorted(scan.names.items())}}
    return entry, scan.bad
