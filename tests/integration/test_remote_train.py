"""``kontrast train --data http://HOST/train-{000000..000002}.tar``: shards at a URL train as the same shards on disk,
and a run stopped mid-epoch resumes bit for bit (the samples are numbered as on disk, so the order and the resume
point are the same); the decoding workers read the shards through the cache the index pass filled.

Tiny: 48 shape images of 40 px in 3 shards on a local HTTP server (tests/support/http_files.py), 16-px views,
ResNet-18 at width 0.125, 2 epochs of 3 steps, one thread.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from kontrast.data import write_shapes_files
from support import floors
from support.args import HANG_LIMIT, train_command
from support.cli import in_process
from support.http_files import serve_folder
from support.processes import free_port, process_env

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


@pytest.mark.slow  # two torchrun agents, one process and its nudged twin (about 40 s)
def test_two_nodes_reading_a_bucket_of_shards_equal_one_process(shards, tmp_path):
    """The several-node command of docs/distributed.md ("Several nodes, one bucket"): torchrun on each of two "nodes"
    (two agents here, c10d rendezvous on localhost, one process each) with ``--data`` the shards' URL; within the floor
    of tests/support/floors.py of one process on the same URL (float64, 3 steps: one epoch of the 48 images)."""
    with serve_folder(shards) as server:
        url = f"{server.url}/{PATTERN}"

        def args(out, *extra):
            return train_command(out, *extra, data=url, epochs=1, batch=BATCH, settings=[
                "train.log_every=1", "data.mode=stream", "data.size=16", floors.PRECISION,
                "train.channels_last=false", HANG_LIMIT])

        port = free_port()
        node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "kontrast-bucket",
                "-m", "kontrast.cli", *args(tmp_path / "two")]
        env = dict(process_env(), KONTRAST_CACHE=str(tmp_path / "cache"))
        agents = [subprocess.Popen(node, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
                  for _ in range(2)]
        errors = [agent.communicate(timeout=300)[1] for agent in agents]
        assert [agent.returncode for agent in agents] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
        for out, faults in (("one", ""), ("nudged", floors.NUDGE)):
            run = subprocess.run([sys.executable, "-m", "kontrast.cli", *args(tmp_path / out)], capture_output=True,
                                 text=True, timeout=300, env=dict(env, KONTRAST_FAULTS=faults))
            assert run.returncode == 0, run.stderr[-2000:]
    assert len(losses(tmp_path / "two")) == N // BATCH
    floors.assert_runs_agree(tmp_path / "one", tmp_path / "two", tmp_path / "nudged", "2 nodes vs 1 on a bucket")
