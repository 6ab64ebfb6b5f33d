"""Hostile data: every kind of bad file at once. The pre-scan names exactly the bad files, strict
mode refuses before step 1, skip mode trains and reports the count, and every tensor that reaches
the model is finite and 3-channel. (tests/unit/data/test_data.py covers the ordinary modes and a corrupt
PNG / short JPEG; this adds the hostile rest.)"""

from __future__ import annotations

import io
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from kontrast.cli import main
from kontrast.data import load_images
from kontrast.errors import UserError

GOOD_PER_CLASS = 12
BAD = {"a/zero.jpg", "a/half.jpg", "a/random.jpg", "a/bomb.png", "a/bomb.jpg", "a/loop1.jpg", "a/loop2.jpg",
       "b/devzero.jpg", "b/fifo.png"}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KONTRAST_CACHE", str(tmp_path / "cache"))


def _jpeg(seed: int, size: int = 24) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def _png_claiming(width: int, height: int) -> bytes:
    """A small valid PNG whose header (CRC recomputed) claims ``width x height``."""
    out = io.BytesIO()
    Image.new("L", (8, 8), 7).save(out, "PNG")
    data = bytearray(out.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr : ihdr + 17])))
    return bytes(data)


def _jpeg_claiming(width: int, height: int) -> bytes:
    """A valid small JPEG whose frame header claims ``width x height`` (torchvision would allocate it)."""
    data = bytearray(_jpeg(0))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.fixture
def hostile(tmp_path) -> Path:
    root = tmp_path / "hostile"
    for cls in ("a", "b"):  # a clean test split; everything hostile is in train/
        (root / "test" / cls).mkdir(parents=True)
        (root / "test" / cls / "t.jpg").write_bytes(_jpeg(1000 + len(cls)))
    root = root / "train"
    a, b = root / "a", root / "b"
    a.mkdir(parents=True)
    b.mkdir()
    for i in range(GOOD_PER_CLASS - 4):  # ordinary JPEGs and PNGs of mixed sizes
        (a / f"ok{i}.jpg").write_bytes(_jpeg(i, 16 + 3 * i))
        Image.fromarray(np.full((9 + i, 20, 3), 20 * i, np.uint8)).save(b / f"ok{i}.png")
    # odd but readable: 1x1, palette with transparency, bilevel, 16-bit grey
    Image.new("RGB", (1, 1), (250, 10, 10)).save(a / "one_pixel.png")
    p = Image.new("P", (10, 10), 1)
    p.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    p.save(a / "palette_transparent.png", transparency=0)
    Image.new("1", (12, 12), 1).save(a / "bilevel.png")
    Image.fromarray(np.full((7, 5), 65535, np.uint16)).save(a / "sixteen_bit.png")
    for i, name in enumerate(("la.png", "rgba.png", "cmyk.jpg", "grey.jpg")):
        mode = {"la.png": "LA", "rgba.png": "RGBA", "cmyk.jpg": "CMYK", "grey.jpg": "L"}[name]
        Image.new("RGB", (6 + i, 11), (10, 200, 30)).convert(mode).save(b / name)
    # bad: empty, truncated halfway, random bytes, decompression bombs (PNG and JPEG headers)
    (a / "zero.jpg").write_bytes(b"")
    full = _jpeg(99, 64)
    (a / "half.jpg").write_bytes(full[: len(full) // 2])
    (a / "random.jpg").write_bytes(np.random.default_rng(5).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    (a / "bomb.png").write_bytes(_png_claiming(12000, 12000))  # 144 Mpx: PIL would only warn below 179 Mpx
    (a / "bomb.jpg").write_bytes(_jpeg_claiming(30000, 30000))  # 900 Mpx: 2.7 GB if decoded
    # links: a loop of two file links, a folder link back to the root, a link to a device, a FIFO
    os.symlink("loop2.jpg", a / "loop1.jpg")
    os.symlink("loop1.jpg", a / "loop2.jpg")
    os.symlink("..", b / "again")  # would list every file twice (and forever) if followed blindly
    os.symlink("/dev/zero", b / "devzero.jpg")  # an endless read if opened
    os.mkfifo(b / "fifo.png")  # a read that never returns if opened
    # a link to a good image outside the root: followed (datasets built from symlinks are common)
    outside = tmp_path / "elsewhere.jpg"
    outside.write_bytes(_jpeg(123))
    os.symlink(outside, b / "outside.jpg")
    # not classes: an empty class folder, a folder with only hidden files
    (root / "c").mkdir()
    (root / "d").mkdir()
    (root / "d" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "d" / ".hidden.jpg").write_bytes(_jpeg(7))
    return root.parent


def named_files(message: str) -> set[str]:
    return set(re.findall(r"hostile/train/([a-d]/[\w.]+)", message))


def test_prescan_names_exactly_the_bad_files(hostile):
    with pytest.raises(UserError) as info:
        load_images(str(hostile), size=16)
    message = str(info.value)
    assert f"{len(BAD)} unreadable image file(s)" in message and "\n" not in message
    assert named_files(message) == BAD
    with pytest.warns(UserWarning, match=f"skipped {len(BAD)} unreadable"):
        data = load_images(str(hostile), size=16, skip_bad_images=True)
    assert data.x.shape == (2 * GOOD_PER_CLASS + 1, 3, 16, 16)  # + the outside link
    assert data.x.dtype == torch.uint8 and data.classes == ["a", "b"]  # c (empty) and d (hidden) are no classes
    assert data.labels.bincount().tolist() == [GOOD_PER_CLASS - 4 + 4, GOOD_PER_CLASS - 4 + 4 + 1]


def test_each_bad_file_has_its_own_reason(hostile):
    from kontrast.data.folder import FolderReader

    src = FolderReader(hostile)
    built = src.build(16)
    reasons = dict(built["train"].bad_images)
    assert set(reasons) == {f"train/{name}" for name in BAD} and not built["test"].bad_images
    reasons = {name[len("train/"):]: why for name, why in reasons.items()}
    assert reasons["a/zero.jpg"] == "empty file (0 bytes)"
    assert "decompression-bomb" in reasons["a/bomb.jpg"] and "30000x30000" in reasons["a/bomb.jpg"]
    assert "decompression-bomb" in reasons["a/bomb.png"] or "DecompressionBomb" in reasons["a/bomb.png"]
    assert "symbolic links" in reasons["a/loop1.jpg"]
    assert reasons["b/devzero.jpg"].startswith("not a regular file")
    assert reasons["b/fifo.png"].startswith("not a regular")
    assert "truncated" in reasons["a/half.jpg"] and "not a recognised image" in reasons["a/random.jpg"]


def test_strict_mode_refuses_before_step_one(hostile, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--data", str(hostile), "--out", str(out), "--batch-size", "8", "--epochs", "1",
                 "--no-progress", "--set", "encoder.width=0.125", "--set", "data.size=16"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--skip-bad-images" in err
    assert named_files(err) == BAD
    assert not out.exists()


def test_skip_mode_trains_on_finite_three_channel_views(hostile, tmp_path, monkeypatch, capsys):
    """Every batch of views the model receives is finite, float and 3-channel."""
    import kontrast.train.plan as plan  # where the run's view pipeline is made

    seen = []

    def checked_maker(*args, **kwargs):
        make = real(*args, **kwargs)

        def checked_views(*batch):
            views = make(*batch)
            seen.extend((v.shape[1], v.dtype, bool(torch.isfinite(v).all())) for v in views)
            return views

        return checked_views

    real = plan.view_maker
    monkeypatch.setattr(plan, "view_maker", checked_maker)
    threads = torch.get_num_threads()
    with pytest.warns(UserWarning, match=f"skipped {len(BAD)} unreadable"):
        code = main(["train", "--data", str(hostile), "--out", str(tmp_path / "run"), "--batch-size", "8",
                     "--epochs", "1", "--no-progress", "--skip-bad-images", "--set", "encoder.width=0.125",
                     "--set", "data.size=32", "--set", "train.num_threads=1", "--set", "train.log_every=1"])
    torch.set_num_threads(threads)
    assert code == 0, capsys.readouterr().err
    assert len(seen) == 2 * 3 and set(seen) == {(3, torch.float32, True)}  # 3 steps x 2 views


def test_skip_mode_reports_the_count_on_stderr(hostile, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kontrast.cli", "train", "--data", str(hostile), "--out",
                           str(tmp_path / "run"), "--batch-size", "8", "--epochs", "1", "--no-progress",
                           "--skip-bad-images", "--set", "encoder.width=0.125", "--set", "data.size=16"],
                          capture_output=True, text=True, env={**os.environ, "KONTRAST_CACHE": str(tmp_path / "c")})
    assert proc.returncode == 0, proc.stderr
    assert f"skipped {len(BAD)} unreadable image file(s)" in proc.stderr


def test_fewer_images_than_the_batch(tmp_path, capsys):
    folder = tmp_path / "few"
    folder.mkdir()
    for i in range(5):
        (folder / f"{i}.jpg").write_bytes(_jpeg(i))
    out = tmp_path / "run"
    code = main(["train", "--data", str(folder), "--out", str(out), "--batch-size", "8", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "batch size 8 is larger than the dataset (5 images)" in err and err.count("\n") == 1
    assert not (out / "checkpoints").exists()
