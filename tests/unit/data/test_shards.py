"""Tar shards in the WebDataset convention: the shapes generator, the writer, the index, header checks.

Tiny data (12 + 2 shape images at 48 px): folder -> shards -> index -> every sample read back
byte-identical with its label; determinism; brace expansion; changed shards; bad files named in
one line (exit 2) or skipped; the two commands end to end in a subprocess.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from kontrast.cli import main
from kontrast.data import cache
from kontrast.data.braces import expand_braces
from kontrast.data.headers import check_image_header
from kontrast.data.shapes_files import write_shapes_files
from kontrast.data.shard_index import open_shards, read_sample
from kontrast.data.shard_writer import write_folder_shards
from kontrast.errors import UserError

N, SIZE = 12, 48  # 12 train + 2 test images


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KONTRAST_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shapes") / "tree"
    write_shapes_files(out, N, size=SIZE, seed=0)
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _jpeg(seed: int = 0, size: int = 24) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def _jpeg_claiming(width: int, height: int) -> bytes:
    data = bytearray(_jpeg())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


BAD_FILES = {  # file -> what makes it bad; all with image names
    "a/truncated.jpg": _jpeg(1, size=64)[:-1500],  # cut inside the scan data: the header is intact
    "a/corrupt_header.jpg": b"\xff\xd8\xff" + bytes(np.random.default_rng(3).integers(0, 256, 400, dtype=np.uint8)),
    "b/not_an_image.jpg": b"hello, I am text\n",
    "b/empty.png": b"",
    "b/bomb.jpg": _jpeg_claiming(20000, 20000),
}


@pytest.fixture
def bad_tree(tmp_path) -> Path:
    root = tmp_path / "bad"
    for cls in "ab":
        (root / cls).mkdir(parents=True)
        for i in range(10):
            (root / cls / f"{i:02d}.jpg").write_bytes(_jpeg(i))
    for rel, data in BAD_FILES.items():
        (root / rel).write_bytes(data)
    return root


def test_shapes_tree_is_an_imagefolder_at_the_requested_size(tree, tmp_path):
    files = _files(tree)
    assert len(files) == N + N // 5
    assert all(p.split("/")[0] in ("train", "test") and p.endswith(".jpg") for p in files)
    with Image.open(io.BytesIO(next(iter(files.values())))) as im:
        assert (im.format, im.size) == ("JPEG", (SIZE, SIZE))
    big = write_shapes_files(tmp_path / "big", 5, size=256, seed=0)  # drawn at 256 px, not upscaled
    with Image.open(next((tmp_path / "big" / "train").rglob("*.jpg"))) as im:
        assert (big["train"], big["test"], im.size) == (5, 1, (256, 256))


def test_shapes_files_are_deterministic_and_extend(tree, tmp_path):
    write_shapes_files(tmp_path / "again", N, size=SIZE, seed=0)
    assert _files(tmp_path / "again") == _files(tree)
    write_shapes_files(tmp_path / "more", 25, size=SIZE, seed=0)  # a larger n keeps the first images
    more = _files(tmp_path / "more")
    assert all(more[p] == data for p, data in _files(tree).items() if p.startswith("train/"))
    write_shapes_files(tmp_path / "other", N, size=SIZE, seed=1)
    assert _files(tmp_path / "other") != _files(tree)


def test_round_trip_folder_shards_index_samples(tree, tmp_path):
    index = write_folder_shards(tree, tmp_path / "s", per_shard=5)
    assert [s["name"] for s in index["shards"]] == ["train-000000.tar", "train-000001.tar", "train-000002.tar",
                                                    "test-000000.tar"]
    assert [s["count"] for s in index["shards"]] == [5, 5, 2, 2] and index["splits"] == {"train": 12, "test": 2}
    for split, count in index["splits"].items():
        shards = open_shards(tmp_path / "s", split=split)
        assert len(shards) == count and shards.classes == index["classes"]
        for i in range(len(shards)):
            data, label = read_sample(shards, i)
            rel = shards.paths[i]
            assert data == (tree / rel).read_bytes()  # original bytes, never re-encoded
            assert shards.classes[label] == rel.split("/")[1]
    entry = index["shards"][1]
    with tarfile.open(tmp_path / "s" / entry["name"]) as tar:  # the tar is a plain WebDataset shard
        names = tar.getnames()
        assert names[:3] == ["000005.jpg", "000005.cls", "000005.json"] and len(names) == entry["member_count"]
        raw = (tmp_path / "s" / entry["name"]).read_bytes()
        for key, members in zip(entry["keys"], entry["members"]):
            for ext, (offset, size) in members.items():
                assert raw[offset : offset + size] == tar.extractfile(f"{key}.{ext}").read()
    assert cache.file_digest(tmp_path / "s" / entry["name"]) == entry["sha256"]


def test_pattern_index_matches_the_written_index(tree, tmp_path):
    write_folder_shards(tree, tmp_path / "s", per_shard=5)
    train, test = open_shards(tmp_path / "s"), open_shards(tmp_path / "s", split="test")
    scanned = open_shards(str(tmp_path / "s" / "{train-{000000..000002},test-000000}.tar"))  # no index.json read
    assert np.array_equal(scanned.offsets, np.concatenate([train.offsets, test.offsets]))
    assert np.array_equal(scanned.labels, np.concatenate([train.labels, test.labels]))
    assert (scanned.keys, scanned.paths) == (train.keys + test.keys, train.paths + test.paths)
    assert scanned.classes == train.classes  # names from each sample's KEY.json
    assert len(open_shards(tmp_path / "s" / "test-000000.tar")) == 2


def test_shards_are_byte_identical_across_runs(tree, tmp_path):
    write_folder_shards(tree, tmp_path / "one", per_shard=5)
    write_folder_shards(tree, tmp_path / "two", per_shard=5)
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    write_shapes_files(tmp_path / "w1", N, size=SIZE, seed=0, shards=True, per_shard=5)
    write_shapes_files(tmp_path / "w2", N, size=SIZE, seed=0, shards=True, per_shard=5)
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2")


def test_brace_expansion():
    assert expand_braces("s/train-{000000..000003}.tar") == [f"s/train-{i:06d}.tar" for i in range(4)]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    assert expand_braces("x{3..1}") == ["x3", "x2", "x1"]
    assert expand_braces("{a,b{1,2}}") == ["a", "b1", "b2"]
    assert expand_braces("plain.tar") == ["plain.tar"] and expand_braces("odd{x}.tar") == ["odd{x}.tar"]
    with pytest.raises(ValueError):
        expand_braces("{0..99999999}")


def test_a_changed_shard_is_named_or_indexed_anew(tree, tmp_path):
    out = tmp_path / "s"
    write_folder_shards(tree, out, per_shard=5)
    assert len(open_shards(out)) == 12
    shard = out / "train-000001.tar"
    raw = bytearray(shard.read_bytes())
    raw[2000] ^= 0xFF  # one byte inside a member: the size stays, the sha256 does not
    shard.write_bytes(bytes(raw))
    with pytest.raises(UserError, match=r"train-000001\.tar changed since index\.json was written"):
        open_shards(out)
    pattern = str(out / "train-{000000..000002}.tar")
    assert len(open_shards(pattern)) == 12
    (out / "train-000002.tar").write_bytes((out / "train-000000.tar").read_bytes())  # 5 samples, not 2
    assert len(open_shards(pattern)) == 15


def test_a_second_open_reads_only_the_cached_records(tree, tmp_path, monkeypatch):
    write_folder_shards(tree, tmp_path / "s", per_shard=5)
    first = open_shards(str(tmp_path / "s" / "train-{000000..000002}.tar"))
    monkeypatch.setattr(cache, "file_digest", lambda *a: pytest.fail("a shard was hashed again"))
    again = open_shards(str(tmp_path / "s" / "train-{000000..000002}.tar"))
    assert again.keys == first.keys and np.array_equal(again.offsets, first.offsets)


def test_header_checks_name_each_kind_of_bad_file():
    reasons = {rel: check_image_header(data) for rel, data in BAD_FILES.items()}
    assert all(isinstance(why, str) and "\n" not in why for why in reasons.values()), reasons
    assert "truncated JPEG" in reasons["a/truncated.jpg"]
    assert "decompression-bomb" in reasons["b/bomb.jpg"]
    assert check_image_header(_jpeg()) == ("JPEG", 24, 24)


def test_bad_images_are_refused_in_one_line_or_skipped(bad_tree, tmp_path):
    with pytest.raises(UserError) as err:
        write_folder_shards(bad_tree, tmp_path / "s")
    message = str(err.value)
    assert "\n" not in message and "5 unreadable image file(s)" in message and "--skip-bad-images" in message
    assert all(rel in message for rel in BAD_FILES)
    assert not (tmp_path / "s").exists()  # nothing left behind
    with pytest.warns(UserWarning, match="skipped 5 unreadable"):
        index = write_folder_shards(bad_tree, tmp_path / "s", skip_bad_images=True)
    assert sum(index["splits"].values()) == 20


def test_the_index_pass_names_bad_members_of_foreign_shards(tmp_path):
    shard = tmp_path / "foreign-000000.tar"
    with tarfile.open(shard, "w") as tar:  # as another WebDataset writer would: ./key.ext, class 1 text
        for key, (image, label) in {"s0": (_jpeg(0), 1), "s1": (_jpeg(1)[:300], 0), "s2": (_jpeg(2), 0)}.items():
            for ext, data in (("jpg", image), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"./{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UserError, match=r"1 unreadable image file\(s\) in .*foreign-000000\.tar:s1\.jpg"):
        open_shards(shard)
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        shards = open_shards(shard, skip_bad_images=True)
    assert shards.keys == ["s0", "s2"] and shards.classes == ["0", "1"]
    assert read_sample(shards, 0) == (_jpeg(0), 1)


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "kontrast.cli", *args], capture_output=True, text=True, env=env)


def test_make_shapes_and_shards_through_the_cli(bad_tree, tmp_path):
    proc = _run_cli("make-shapes", "--out", str(tmp_path / "f"), "--n", "10", "--size", "32", "--seed", "3")
    assert proc.returncode == 0 and "10 train + 2 test" in proc.stdout, proc.stderr
    proc = _run_cli("shards", "--data", str(tmp_path / "f"), "--out", str(tmp_path / "s"), "--per-shard", "4")
    assert proc.returncode == 0 and "wrote 4 shards" in proc.stdout, proc.stderr
    assert json.loads((tmp_path / "s" / "index.json").read_text())["splits"] == {"train": 10, "test": 2}
    proc = _run_cli("shards", "--data", str(bad_tree), "--out", str(tmp_path / "bad_out"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: 5 unreadable"), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv, fragment", [
    (["shards", "--data", "{missing}", "--out", "{out}"], "dataset not found"),
    (["shards", "--data", "{tree}", "--out", "{out}", "--per-shard", "0"],
     "--per-shard must be an integer of at least 1"),
    (["shards", "--data", "{tree}", "--out", "{tree}"], "is not an empty folder"),
    (["make-shapes", "--out", "{out}", "--n", "3"], "--n must be an integer of at least 5"),
    (["make-shapes", "--out", "{out}", "--shards", "--per-shard", "0"], "--per-shard must be"),
    (["shards", "--data", "{tree}"], "the following arguments are required: --out"),
])
def test_bad_arguments_are_one_line_errors(argv, fragment, tree, tmp_path, capsys):
    names = {"missing": tmp_path / "nope", "out": tmp_path / "out", "tree": tree}
    assert main([arg.format(**names) for arg in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err
    assert not (tmp_path / "out").exists()
