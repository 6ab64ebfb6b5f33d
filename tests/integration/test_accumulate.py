"""``--accumulate K`` (gradient caching, kontrast/micro_batches.py) from the CLI: a network without BatchNorm (a ViT
with DINO's BN-free head) trains as on the plain batch; batches and BN groups that cannot be cut are refused in one
line. (Every method's equality with K processes: tests/integration/test_distributed.py; resume between
micro-batches: tests/integration/test_reliability_resume.py.)"""

import pytest

from kontrast.checkpoint import latest_checkpoint
from support import floors
from support.args import train_command
from support.cli import cli_run
from support.sizes import small_heads

VIT = ["encoder.name=vit_tiny", "data.size=32", "encoder.drop_path=0", *small_heads("dino"), floors.PRECISION,
       "train.log_every=1"]


def test_a_vit_in_micro_batches_trains_as_on_the_plain_batch(tmp_path):
    """DINO on a ViT (no BatchNorm anywhere): 2 steps of 16 in 4 micro-batches = the plain steps (float64; within the
    floor of tests/support/floors.py). Stochastic depth is off: each micro-batch draws its own masks, as each process
    does (docs/memory.md)."""
    for name, k, faults in (("k1", 1, ""), ("k4", 4, ""), ("nudged", 1, floors.NUDGE)):
        run = cli_run(train_command(tmp_path / name, "--accumulate", str(k), method="dino", epochs=1, settings=VIT),
                      faults=faults)
        assert run.returncode == 0, run.stderr[-2000:]
    assert latest_checkpoint(tmp_path / "k4").name == "step-00000002"
    floors.assert_runs_agree(tmp_path / "k1", tmp_path / "k4", tmp_path / "nudged",
                             "dino on a ViT: 4 micro-batches vs 1")


@pytest.mark.parametrize("method, extra, message", [
    ("simclr", ["--batch-size", "16", "--accumulate", "3"],
     "train.batch_size (16) must divide into 3 micro-batches of 2 images or more (train.accumulate 3); use a batch "
     "that is a multiple of 6 or a smaller train.accumulate"),
    ("simclr", ["--batch-size", "16", "--accumulate", "16"], "must divide into 16 micro-batches of 2 images or more"),
    ("moco_v2", ["--batch-size", "48", "--accumulate", "3", "--set", "method.queue_size=96"],
     "train.accumulate (3) needs config key 'method.bn_groups' (8) divisible by it"),
    ("simclr", ["--accumulate", "0"], "train.accumulate"),
])
def test_micro_batches_that_cannot_be_cut_are_refused_in_one_line(method, extra, message, tmp_path):
    args = train_command(tmp_path / "run", method=method, epochs=1)
    run = cli_run([*args, *extra])
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.count("\n") == 1 and message in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
