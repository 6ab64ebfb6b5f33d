"""Shards at a URL against the same shards on disk: images/s of what a training epoch reads, on this machine.

From the repository root, on a quiet machine:

    .venv/bin/python benchmarks/remote_shards.py --n 400 --size 256 --per-shard 100

Writes ``--n`` generated shape JPEGs of ``--size`` px as shards (``kontrast make-shapes --shards``) into a temporary
folder, serves it from a local HTTP server (tests/support/http_files.py: Python's threaded http.server with Range
requests, one process; an object store answers with more parallelism and more latency), and measures, each case
with a fresh kontrast cache unless said:

- open: :func:`kontrast.data.open_shards`, the index pass (disk: hash and header checks; URL: every shard copied
  whole into the shard cache, then the same), and again with the index records cached (URL: a HEAD per shard);
- epoch: ``read_sample`` of every sample once in the run's order (the permutation of (seed, epoch)), the bytes a
  training epoch's workers read before decoding: disk; URL from the cache's copies (the set fits
  KONTRAST_REMOTE_CACHE); URL by one range request per sample (KONTRAST_REMOTE_CACHE=0: a set over the limit).

Prints the command, then one JSON line per case (seconds and images/s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kontrast.data import epoch_permutation, open_shards, read_sample, write_shapes_files  # noqa: E402
from kontrast.data.remote import stat_files  # noqa: E402
from support.http_files import serve_folder  # noqa: E402


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _epoch(index) -> float:
    """Seconds to read every sample's bytes once in the order of epoch 0, seed 0."""
    order = epoch_permutation(len(index), 0, 0).tolist()
    return _timed(lambda: [read_sample(index, i) for i in order])[0]


def _case(name: str, spec: str, work: Path, limit: str | None = None) -> dict:
    """Open ``spec`` with a fresh cache, open it again, read one epoch; with a cache ``limit`` (``"0"``), the copies
    the index pass left are deleted first, so that every sample is read by a range request."""
    cache = Path(tempfile.mkdtemp(dir=work))
    os.environ["KONTRAST_CACHE"] = str(cache)
    os.environ.pop("KONTRAST_REMOTE_CACHE", None)
    if limit is not None:
        os.environ["KONTRAST_REMOTE_CACHE"] = limit
    first, index = _timed(lambda: open_shards(spec))
    again, index = _timed(lambda: open_shards(spec))
    if limit is not None:
        for copy in (cache / "remote-shards").glob("*.tar"):
            copy.unlink()
    epoch = _epoch(index)
    n = len(index)
    return {"case": name, "images": n, "open_s": round(first, 3), "open_again_s": round(again, 3),
            "epoch_s": round(epoch, 3), "epoch_img_per_s": round(n / epoch, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=400, help="training images")
    parser.add_argument("--size", type=int, default=256, help="their side in px")
    parser.add_argument("--per-shard", type=int, default=100)
    args = parser.parse_args()
    print(f"command: .venv/bin/python benchmarks/remote_shards.py --n {args.n} --size {args.size} "
          f"--per-shard {args.per_shard}")
    with tempfile.TemporaryDirectory() as tmp:
        work, folder = Path(tmp), Path(tmp) / "shards"
        written = write_shapes_files(folder, args.n, size=args.size, seed=0, shards=True, per_shard=args.per_shard)
        train = sorted(p.name for p in folder.glob("train-*.tar"))
        pattern = f"train-{{000000..{len(train) - 1:06d}}}.tar"
        mib = sum((folder / name).stat().st_size for name in train) / 2**20
        print(json.dumps({"shards": len(train), "train_mib": round(mib, 2), "size": args.size,
                          "images": written["train"]}))
        print(json.dumps(_case("disk", str(folder / pattern), work)))
        with serve_folder(folder) as server:
            url = f"{server.url}/{pattern}"
            stat_files([f"{server.url}/{train[0]}"])  # fsspec's HTTP imported, its session made: not timed
            print(json.dumps(_case("http, copied whole into the cache", url, work)))
            print(json.dumps(_case("http, one range request per sample", url, work, "0")))


if __name__ == "__main__":
    main()
