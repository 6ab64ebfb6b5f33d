"""Sharded training (``train.shard``, kontrast/train/sharding.py): FSDP2 computes what DDP computes, and its
checkpoints resume at another world size.

Launched as a user launches a run, ``kontrast train --nproc 2 --set train.shard=true`` (gloo on CPU): tiny encoders,
16-px images, three steps, float64, one thread per process. Each comparison is within the floor measured beside it
(tests/support/floors.py): the unsharded one-process run with its weights nudged one ulp.
"""

import json
import shutil
from pathlib import Path

import pytest

from support import floors
from support.args import HANG_LIMIT
from support.cli import cli_run
from support.sizes import rank_settings

# a ResNet (stages sharded, global BN) with LARS; an EMA target (its stages sharded alike); a ViT (blocks sharded)
# whose prototypes are frozen for its first steps (a parameter without gradient in a sharded root)
CASES = {"simclr": [], "byol": [],
         "dino": ["encoder.name=vit_tiny", "encoder.depth=2", "method.freeze_last_layer_epochs=0.5"]}


def _args(out: Path, name: str, *extra: str, epochs: int = 1) -> list[str]:
    args = ["train", "--method", name, "--data", "shapes:36", "--epochs", str(epochs), "--batch-size", "12",
            "--out", str(out), "--no-progress"]
    for item in ["data.size=16", "encoder.width=0.0625", "train.log_every=1", "train.num_threads=1",
                 "train.channels_last=false", floors.PRECISION, HANG_LIMIT, *rank_settings(name), *CASES[name],
                 *extra]:
        args += ["--set", item]
    return args


def _train(out: Path, name: str, nproc: int, *extra: str, epochs: int = 1, faults: str = ""):
    run = cli_run([*_args(out, name, *extra, epochs=epochs), "--nproc", str(nproc)], faults=faults)
    assert run.returncode == 0, (out.name, run.stderr[-3000:])
    return run


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_equals_replicated_on_two_processes(name, tmp_path):
    """3 steps on 2 ranks with the parameters sharded = the same on 2 ranks under DDP (losses, every weight, EMA
    target and buffers, within the floor)."""
    sharded = _train(tmp_path / "sharded", name, 2, "train.shard=true")
    assert "each process holding 1/2 of them" in sharded.stdout, sharded.stdout
    _train(tmp_path / "replicated", name, 2)
    _train(tmp_path / "nudged", name, 1, faults=floors.NUDGE)
    assert len(floors.losses(tmp_path / "sharded")) == 3
    floors.assert_runs_agree(tmp_path / "replicated", tmp_path / "sharded", tmp_path / "nudged",
                             f"{name}: sharded vs replicated")


def test_a_sharded_checkpoint_resumes_sharded_and_at_another_world_size(tmp_path):
    """The checkpoint holds whole tensors: a sharded run stopped by SIGTERM after step 3 of 6 and resumed on the same
    two processes ends bit for bit as the uninterrupted run does; resumed on one process it continues as well."""
    whole, stopped = tmp_path / "whole", tmp_path / "two"
    _train(whole, "byol", 2, "train.shard=true", epochs=2)
    run = cli_run([*_args(stopped, "byol", "train.shard=true", epochs=2), "--nproc", "2"],
                  faults="signal_after_step=3,signal=TERM,rank=0")
    assert run.returncode == 143, run.stderr[-3000:]
    shutil.copytree(stopped, tmp_path / "one")
    for out, nproc in ((stopped, 2), (tmp_path / "one", 1)):
        run = cli_run([*_args(out, "byol", "train.shard=true", epochs=2), "--resume", "--nproc", str(nproc)])
        assert run.returncode == 0, run.stderr[-3000:]
        assert "resuming from step 3 of 6" in run.stdout
        assert json.loads(run.stdout.strip().splitlines()[-1])["steps"] == 6
    diff = floors.difference(whole, stopped)
    assert diff.loss == diff.weights == 0.0  # bit for bit: the same processes, the same arithmetic


def test_sharding_refuses_the_knn_monitor_in_one_line(tmp_path):
    run = cli_run([*_args(tmp_path / "run", "simclr", "train.shard=true", "train.knn_every=1"), "--nproc", "2"])
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "train.knn_every=0" in errors[0], run.stderr[-2000:]
