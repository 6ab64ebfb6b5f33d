"""The streaming path end to end through the CLI: a run on a folder, exact mid-epoch resume with 0 and 2
workers (SIGTERM, and kill -9 with workers), shards training as their folder does, and a bad file found
mid-epoch (strict stop naming it and the last good checkpoint; --skip-bad-images replaces it deterministically).

Tiny on purpose: 48 images of 40 px, 16-px views, ResNet-18 at width 0.125, 2 epochs of 3 steps.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from kontrast.checkpoint import latest_checkpoint
from kontrast.data import batch_indices, write_folder_shards, write_shapes_files
from kontrast.data.stream_source import open_stream
from kontrast.methods import METHODS
from support import floors
from support.args import train_command
from support.cli import in_process
from support.teacher import teacher_args

N, BATCH, EPOCHS = 48, 16, 2
STEPS = EPOCHS * N // BATCH


def train_args(data: Path | str, out: Path, *extra: str) -> list[str]:
    return train_command(out, *extra, data=data, epochs=EPOCHS, batch=BATCH,
                         settings=["train.log_every=1", "data.mode=stream"])


def final_state(run: Path) -> dict[str, torch.Tensor]:
    ckpt = run / "checkpoints" / f"step-{STEPS:08d}"
    return {**{f"model.{k}": v for k, v in load_file(str(ckpt / "model.safetensors")).items()},
            **{f"opt.{k}": v for k, v in load_file(str(ckpt / "optimizer.safetensors")).items()}}


def loss_trace(run: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "img_per_s"} for line in lines]


def assert_same_run(run: Path, ref: Path) -> None:
    a, b = final_state(run), final_state(ref)
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} tensors differ from the reference run, e.g. {differ[:3]}"
    assert loss_trace(run) == loss_trace(ref)  # every step's loss, embedding_std, lr: bit for bit


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stream_train") / "shapes"
    write_shapes_files(root, N, size=40, seed=2)
    return root


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory) -> Path:
    """The uninterrupted streaming run, decoded in the loop's own process (workers=0)."""
    out = tmp_path_factory.mktemp("stream_ref") / "run"
    assert in_process(train_args(folder, out, "--set", "data.workers=0")) == 0
    return out


def test_the_memory_paths_line_names_the_source_resolutions_too(folder, tmp_path, monkeypatch, capsys):
    assert in_process(train_args(folder, tmp_path / "run", "--set", "data.mode=auto", "--epochs", "1")) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(f"data: {N} training images from {folder} (train); labelled, 10 classes;")
    assert ("; 16x16 px; source 40x40 px (headers of 48 samples); memory path (auto: 36.0 KiB decoded at 16 px fits"
            in line)


def test_a_stream_run_says_so_and_checkpoints(folder, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert in_process(train_args(folder, out, "--set", "data.mode=auto", "--set", "data.memory_budget=1e-12",
                                 "--set", "data.workers=2")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"data: streaming {N} training images from {folder} (train); labelled, 10 classes")
    assert ("source 40x40 px, cropped at decode time to 16x16 px in 2 worker(s); auto: 36.0 KiB decoded at 16 px "
            "is over data.memory_budget (1e-12 of ") in lines[0]
    assert json.loads(lines[-1])["bad_images_replaced"] == 0
    assert "mode: stream" in (out / "config.yaml").read_text()  # a resume takes the same path on any machine
    assert_same_run(out, reference)  # 2 workers: the run of 0 workers, bit for bit


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_stopped_mid_epoch_resumes_bit_for_bit(workers, folder, reference, tmp_path, monkeypatch):
    """SIGTERM after step 4 (epoch 2, step 1 of 3): checkpoint, exit 143; the resumed run = the uninterrupted one."""
    out, args = tmp_path / "run", train_args(folder, tmp_path / "run", "--set", f"data.workers={workers}")
    assert in_process(args, "signal_after_step=4") == 143
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000003", "step-00000004"]
    assert in_process([*args, "--resume"]) == 0
    assert_same_run(out, reference)


@pytest.mark.lifecycle
@pytest.mark.slow  # new processes (about 10 s)
def test_a_run_killed_mid_epoch_with_workers_resumes_bit_for_bit(folder, reference, tmp_path):
    """kill -9 after step 5 with 2 decoding workers; the step-4 checkpoint is newest; step 5 is redone."""
    args = train_args(folder, tmp_path / "run", "--set", "data.workers=2", "--set", "train.checkpoint_every=2")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-m", "kontrast.cli", *args], capture_output=True, text=True,
                            env={**env, "KONTRAST_FAULTS": "kill_after_step=5"})
    assert killed.returncode == -9, killed.stderr
    resumed = subprocess.run([sys.executable, "-m", "kontrast.cli", *args, "--resume"], capture_output=True, text=True,
                             env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(tmp_path / "run", reference)


def test_shards_train_as_their_folder_does(folder, reference, tmp_path, monkeypatch, capsys):
    write_folder_shards(folder, tmp_path / "shards", per_shard=20)  # train-000000..000002.tar
    pattern = str(tmp_path / "shards" / "train-{000000..000002}.tar")
    args = train_args(pattern, tmp_path / "run", "--set", "data.mode=auto", "--set", "data.memory_budget=1e-12",
                      "--set", "data.workers=0")
    assert in_process(args) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(f"data: streaming {N} training images from {pattern} (train); labelled, 10 classes")
    assert "source 40x40 px (headers of 48 samples)" in line and "auto: 36.0 KiB decoded at 16 px is over" in line
    assert_same_run(tmp_path / "run", reference)  # same samples in the same order: the same run


def _corrupt_png() -> bytes:
    """A PNG whose header and IEND are intact (the header pass accepts it) but whose pixel data is garbled."""
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 40, 3), 128, dtype=np.uint8)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    at = data.find(b"IDAT")
    data[at + 6:at + 20] = bytes(b ^ 0x5A for b in data[at + 6:at + 20])
    return bytes(data)


def _photos_with_a_bad_file(tmp_path: Path) -> tuple[Path, Path, int, int]:
    """(folder, its bad file, a seed that puts the file in step 2 or later, that step)."""
    photos = tmp_path / "photos"
    write_shapes_files(photos, N - 1, size=40, seed=3)
    bad = photos / "train" / "circle" / "zz_bad.png"
    bad.write_bytes(_corrupt_png())
    number = open_stream(photos).paths.index("train/circle/zz_bad.png")
    seed = next(s for s in range(20) if number not in batch_indices(N, BATCH, 0, s)[0].tolist())  # not in step 1
    first = next(i + 1 for i, idx in enumerate(batch_indices(N, BATCH, 0, seed)) if number in idx.tolist())
    return photos, bad, seed, first


def test_a_bad_file_mid_epoch_stops_strictly_or_is_replaced_deterministically(tmp_path, monkeypatch, capsys):
    photos, bad, seed, first = _photos_with_a_bad_file(tmp_path)
    common = ["--set", f"train.seed={seed}", "--set", "data.workers=2"]  # checkpoints at epoch ends only
    out = tmp_path / "run"
    capsys.readouterr()
    assert in_process(train_args(photos, out, *common)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    last_good = out / "checkpoints" / f"step-{first - 1:08d}"
    assert err == [f"error: unreadable image {bad} (OSError: broken data stream when reading image file) in the batch "
                   f"of step {first}; stopped before the step, last good checkpoint: {last_good}; fix or remove the "
                   "file and resume with --resume, or resume with --skip-bad-images to replace it"]
    # no checkpoint existed mid-epoch 1: the state before the bad batch was checkpointed at the stop, nothing after
    assert first in (2, 3) and max(p.name for p in (out / "checkpoints").iterdir()) == last_good.name
    assert in_process([*train_args(photos, out, *common), "--resume", "--skip-bad-images"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["bad_images_replaced"] == EPOCHS  # once per epoch
    whole = tmp_path / "whole"
    assert in_process([*train_args(photos, whole, *common), "--skip-bad-images", "--set", "data.workers=0"]) == 0
    assert_same_run(out, whole)  # stopped, resumed and replaced = replaced from the start, bit for bit
    warnings = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines() if "warning" in line]
    assert [w["warning"] for w in warnings] == ["bad_image"] * EPOCHS and str(bad) in warnings[0]["message"]
    shutil.rmtree(photos)


@pytest.mark.lifecycle
@pytest.mark.slow  # new processes (about 15 s)
def test_a_bad_file_on_one_of_two_processes_stops_both_after_a_checkpoint(tmp_path):
    """--nproc 2, strict: the rank that meets the file tells the other (one flag a step), both stop before the
    same step, the state before it is checkpointed once, and each names the file; then --skip-bad-images resumes."""
    photos, bad, seed, first = _photos_with_a_bad_file(tmp_path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    out = tmp_path / "run"
    args = [sys.executable, "-m", "kontrast.cli", *train_args(photos, out, "--set", f"train.seed={seed}",
                                                              "--set", "data.workers=0"), "--nproc", "2"]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and all(f"unreadable image {bad}" in e and f"step-{first - 1:08d}" in e for e in errors), errors
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step-{first - 1:08d}"]
    done = subprocess.run([*args, "--resume", "--skip-bad-images"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["bad_images_replaced"] >= 1


@pytest.mark.slow  # new processes (about 10 s)
def test_two_processes_read_only_their_own_samples_and_equal_one(folder, tmp_path):
    """--nproc 2 on the streaming path: each rank decodes only its half of every global batch (traced), and the
    run equals one process on the global batch (float64; within the floor of tests/support/floors.py)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    runs = {}
    for name, nproc, faults in (("p1", 1, ""), ("p2", 2, ""), ("nudged", 1, floors.NUDGE)):
        out, trace = tmp_path / name, tmp_path / f"{name}.trace"
        args = [*train_args(folder, out, "--set", "data.workers=0", "--set", floors.PRECISION, "--epochs", "1"),
                "--nproc", str(nproc)]  # float64, as every pair compared with a floor (support/floors.py)
        done = subprocess.run([sys.executable, "-m", "kontrast.cli", *args], capture_output=True, text=True,
                              env={**env, "KONTRAST_FAULTS": ",".join(filter(None, [f"trace={trace}", faults]))},
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[name] = (out, [json.loads(line) for line in trace.read_text().splitlines()])
    records = runs["p2"][1]
    for step, idx in enumerate(batch_indices(N, BATCH, 0, 0), 1):
        halves = [r["indices"] for r in records if r["step"] == step]
        assert len(halves) == 2 and all(len(h) == BATCH // 2 for h in halves)
        assert sorted(halves[0] + halves[1]) == sorted(idx.tolist()) and not set(halves[0]) & set(halves[1])
    assert latest_checkpoint(runs["p2"][0]).name == "step-00000003"
    floors.assert_runs_agree(runs["p1"][0], runs["p2"][0], runs["nudged"][0], "streamed: 2 ranks vs 1")


def test_the_knn_monitor_runs_on_a_streamed_shard_folder(folder, tmp_path, monkeypatch, capsys):
    """Indexed shards (train + test): the monitor's bank is the training set decoded whole (at most knn_max_train),
    scored against the test shards; a pattern without an index has no test split, and says so."""
    write_folder_shards(folder, tmp_path / "shards", per_shard=20)
    out = tmp_path / "run"
    assert in_process(train_args(tmp_path / "shards", out, "--set", "train.knn_every=1", "--set",
                                 "train.knn_max_train=30", "--set", "data.workers=0")) == 0
    knn = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "knn_top1" in line]
    assert [r["epoch"] for r in knn] == [0, 1, 2] and all(0 <= r["knn_top1"] <= 1 for r in knn)
    pattern = str(tmp_path / "shards" / "train-{000000..000002}.tar")
    capsys.readouterr()
    assert in_process(train_args(pattern, tmp_path / "p", "--set", "train.knn_every=1", "--epochs", "1")) == 0
    assert "note: no kNN monitor: " in capsys.readouterr().err


IMAGE_METHODS = [name for name in METHODS.names() if name != "cpc"]  # cpc trains on sequences, never streamed


@pytest.mark.parametrize("name", IMAGE_METHODS)
def test_every_image_method_trains_on_the_streaming_path(name, folder, tmp_path, monkeypatch, capsys):
    """One epoch (3 steps) per registered image method: multi-crop (swav, dino: views of two sizes cropped at
    decode time), CLIP's captions from the folder's labels, InstDisc's memory bank by sample number."""
    size = "32" if name in ("amdim", "yadim", "cpc_v2") else "16"  # their encoders and patch grids need 32 px
    args = train_args(folder, tmp_path / "run", "--method", name, "--epochs", "1", "--set", f"data.size={size}",
                      "--set", "data.workers=0", *teacher_args(name))
    assert in_process(args) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["steps"] == 3 and np.isfinite(summary["final_loss"])


@pytest.mark.lifecycle
@pytest.mark.slow  # new processes (about 10 s)
def test_a_signal_to_the_whole_process_group_with_workers_still_checkpoints_and_resumes(folder, reference, tmp_path):
    """Ctrl-C in a terminal or a scheduler's SIGTERM reaches the DataLoader workers too: they ignore it and the
    training process stops as without workers (step finished, checkpoint, exit 143), then resumes bit for bit."""
    args = train_args(folder, tmp_path / "run", "--set", "data.workers=2")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    stopped = subprocess.run([sys.executable, "-m", "kontrast.cli", *args], capture_output=True, text=True,
                             env={**env, "KONTRAST_FAULTS": "signal_after_step=4,signal_group=1"},
                             start_new_session=True, timeout=300)  # its own group: the signal stays in it
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1].startswith("stopped: SIGTERM after step 4 of 6; checkpoint ")
    resumed = subprocess.run([sys.executable, "-m", "kontrast.cli", *args, "--resume"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(tmp_path / "run", reference)
