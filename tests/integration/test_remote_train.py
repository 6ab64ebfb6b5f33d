"""``kontrast train --data http://HOST/train-{000000..000002}.tar``: shards at a URL train as the same shards on disk,
and a run stopped mid-epoch resumes bit for bit (the samples are numbered as on disk, so the order and the resume
point are the same); the decoding workers read the shards through the cache the index pass filled.

Tiny: 48 shape images of 40 px in 3 shards on a local HTTP server (tests/support/http_files.py), 16-px views,
ResNet-18 at width 0.125, 2 epochs of 3 steps, one thread.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from kontrast.data import write_shapes_files
from support.args import train_command
from support.cli import in_process
from support.http_files import serve_folder

N, BATCH, EPOCHS = 48, 16, 2
STEPS = EPOCHS * N // BATCH
PATTERN = "train-{000000..000002}.tar"


def train_args(data: str, out, *extra: str) -> list[str]:
    return train_command(out, *extra, data=data, epochs=EPOCHS, batch=BATCH,
                         settings=["train.log_every=1", "data.mode=stream", "data.size=16"])


def final_state(run) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step-{STEPS:08d}" / "model.safetensors"))


def losses(run) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("remote_train") / "shards"
    write_shapes_files(out, N, size=40, seed=2, shards=True, per_shard=20)  # train-000000..000002, test-000000
    return out


def test_a_run_on_http_shards_trains_as_on_disk_and_resumes_bit_for_bit(shards, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KONTRAST_CACHE", str(tmp_path / "cache"))
    reference = tmp_path / "local"
    assert in_process(train_args(str(shards / PATTERN), reference, "--set", "data.workers=0")) == 0
    with serve_folder(shards) as server:
        url, run = f"{server.url}/{PATTERN}", tmp_path / "remote"
        args = train_args(url, run, "--set", "data.workers=2")
        capsys.readouterr()
        assert in_process(args, "signal_after_step=4") == 143  # SIGTERM after step 4 (epoch 2): checkpoint, exit
        line = capsys.readouterr().out.splitlines()[0]
        assert line.startswith(f"data: streaming {N} training images from {url} (train); labelled, 10 classes")
        assert re.search(r"; remote shards \([\d.]+ KiB\) copied whole into \S+/remote-shards "
                         r"\(KONTRAST_REMOTE_CACHE: 8 GiB\); data\.mode=stream$", line), line
        assert in_process([*args, "--resume"]) == 0
    a, b = final_state(run), final_state(reference)
    assert len(losses(reference)) == STEPS and losses(run) == losses(reference)  # every step's loss, bit for bit
    assert all(torch.equal(a[k], b[k]) for k in b)
