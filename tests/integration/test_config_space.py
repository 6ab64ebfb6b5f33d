"""Every method at the settings its users run: a covering array over batch, encoder, resolution, precision,
memory layout, data path, process count and micro-batches (gradient caching).

Each cell goes through the CLI as a user's run does: ``kontrast train`` stopped by SIGTERM after step 1 (its
checkpoint written), ``--resume`` to step 2 (the checkpoint reloads; the steps' losses are finite), then
``kontrast embed`` of a few images (features come out, finite, one row per image). A cell that the code refuses
must refuse at start-up in one line (exit 2, no traceback) naming the limit and what to change, and only the
cells listed in :data:`REFUSED` may refuse. Every pair of factor values (method included) is in at least one
cell (``test_every_pair_of_values_is_in_a_cell``); tiny widths and small heads keep a cell to seconds.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from kontrast.cli import main
from kontrast.config import merge, parse_override
from kontrast.decisions import decide, smallest_size
from kontrast.errors import Refusal
from kontrast.methods import METHODS
from kontrast.methods.build import resolve
from support.args import HANG_LIMIT
from support.cli import cli_run
from support.covering import all_pairs, covering_array, pairs_of
from support.sizes import small_heads
from support.steps import IMAGE_METHODS

DEVICE = os.environ.get("KONTRAST_TEST_DEVICE", "cpu")  # benchmarks/gpu.sh runs the same cells with cuda
# past every size switch: NT-Xent's row blocks from 2B x 2BW > 2^20 (B > 512 on 1 process, > 724 on 2); 4 | 732
LARGE = 732
ODD = 26  # divides by 2 processes (13 each); not by MoCo's 4 or 8 BN groups, nor by multi-crop's 6 or 8 views
ENCODERS = {
    "resnet18-cifar": ["encoder.name=resnet18", "encoder.stem=cifar", "encoder.width=0.25"],
    "resnet18-imagenet": ["encoder.name=resnet18", "encoder.stem=imagenet", "encoder.width=0.25"],
    "vit_tiny": ["encoder.name=vit_tiny", "encoder.width=0.125", "encoder.depth=2"],
}
FACTORS = {
    "method": IMAGE_METHODS,
    "batch": ["min", "large", "odd"],
    "encoder": list(ENCODERS),
    "size": ["min", 32, 96],
    "precision": ["fp32", "bf16"],
    "channels_last": [False, True],
    "data": ["memory", "stream"],
    "world": [1, 2],
    "accumulate": [1, 2],
}
# AMDIM and YADIM compare feature maps at three scales: a ViT has one (refused in one line by design, as CPC v2's
# 8-px patches are on the ImageNet stem;
# tests/unit/methods/test_sizes.py::test_a_combination_that_cannot_train_is_refused_in_one_line). Large batches at
# 96 px on the CIFAR stem (16x the ImageNet stem's activations) would cost minutes and cover no pair that other cells
# do not.
MULTISCALE = ("amdim", "yadim")


def allowed(cell: dict) -> bool:
    if cell.get("method") in MULTISCALE and cell.get("encoder") == "vit_tiny":
        return False
    if (cell.get("method") in IMAGE_METHODS and METHODS.get(cell["method"]).needs.vit
            and cell.get("encoder", "vit_tiny") != "vit_tiny"):
        return False  # iBOT masks patch tokens: a ResNet is refused in one line (tests/unit/methods/test_sizes.py)
    if cell.get("method") == "cpc_v2" and cell.get("encoder") == "resnet18-imagenet":
        # 8-px patches through a stem that reduces 32x: refused
        # (tests/unit/methods/test_sizes.py::test_a_combination_that_cannot_train_is_refused_in_one_line)
        return False
    if (cell.get("batch"), cell.get("size"), cell.get("encoder")) == ("min", "min", "resnet18-imagenet"):
        # the three together (each pair stays covered): 4-px views through a stem that reduces 32x, so every BN
        # from layer 1 on normalises 2 values per channel (batch 2, 1x1 maps); its backward divides by their spread
        # and 2 SGD steps at lr 5e-4 grow BN weights to ~800: SimCLR v2's features reach 1e38 (inf) at this folder's
        # first images, 760 at a folder of 4 fewer. Training such a network is degenerate, not a code path to test
        return False
    return not (cell.get("batch") == "large" and cell.get("size") == 96 and cell.get("encoder") == "resnet18-cifar")


def cost(cell: dict) -> float:
    batch = {"min": 16, "large": LARGE, "odd": ODD}[cell.get("batch", "min")]
    size = 96 if cell.get("size") == 96 else 32
    return batch * size * size * (16 if cell.get("encoder") == "resnet18-cifar" else 1) * cell.get("world", 1)


CELLS = covering_array(FACTORS, allowed, cost)
# CPC v1 reads sequences: no encoder, resolution, layout or stream path of images; its own pairs
SEQUENCE_CELLS = [{"method": "cpc", **c} for c in covering_array(
    {"batch": ["min", "large", "odd"], "precision": ["fp32", "bf16"], "world": [1, 2], "accumulate": [1, 2]})]
POOL = {"cpc": 2, "cpc_v2": 32}  # negatives pooled over this many images (CPC v1: set small below; CPC v2: default)
# cells refused by design: (predicate, fragment of the one-line error). CPC keeps each pool of negatives on one
# process, so that two processes compute what one does: on two, its pool must divide each process's batch.
# A batch must cut into micro-batches of 2 or more on every process: the odd batch on 2 processes does not in 2 each.
REFUSED: list[tuple] = [
    (lambda c: c["method"] in POOL and c["world"] == 2 and batch_of(c) // 2 % POOL[c["method"]],
     "'method.negative_pool' ({pool}) must divide the batch of each process"),
    (lambda c: batch_of(c) % (c["world"] * c["accumulate"]), "micro-batches of 2 images or more"),
    # multi-crop's local crops at 32 px are 16 px, below what the ImageNet stem takes (32)
    (lambda c: (c["method"] in ("dino", "swav", "lejepa") and c.get("encoder") == "resnet18-imagenet"
                and c.get("size") == 32),
     "is too small for"),
]


def cell_id(cell: dict) -> str:
    keys = ("method", "batch", "encoder", "size", "precision", "channels_last", "data", "world", "accumulate")
    names = {"channels_last": lambda v: "cl" if v else "nchw", "accumulate": lambda v: f"k{v}"}
    return "-".join(names.get(k, str)(cell[k]) for k in keys if k in cell)


def test_every_pair_of_values_is_in_a_cell():
    names = list(FACTORS)
    covered = set().union(*(pairs_of(cell, names) for cell in CELLS))
    assert all_pairs(FACTORS, allowed) <= covered
    assert len(CELLS) < 3 * len(IMAGE_METHODS) + 10  # near the lower bound (methods x 3 batches): cheap enough for CI
    assert {m for m in IMAGE_METHODS} == {c["method"] for c in CELLS}


def smallest_batch(method: str, world: int, accumulate: int = 1) -> int:
    """The smallest global batch the method takes: 2 samples a micro-batch of a process, MoCo's 2 per BN group,
    CPC's pool a process."""
    if method in POOL:
        return max(2 * accumulate, POOL[method]) * world
    groups = getattr(resolve({"method": {"name": method}}).method.params, "bn_groups", 1)
    return max(2 * world * accumulate, 2 * groups)


def batch_of(cell: dict) -> int:
    smallest = smallest_batch(cell["method"], cell["world"], cell["accumulate"])
    return {"min": smallest, "large": LARGE, "odd": ODD}[cell["batch"]]


def size_of(cell: dict) -> int:
    if cell["size"] != "min":
        return cell["size"]
    raw = {"method": {"name": cell["method"]}, "data": {"size": 32}}
    for item in ENCODERS[cell["encoder"]] + small_heads(cell["method"]):
        raw = merge(raw, parse_override(item))
    cfg = resolve(raw)
    return smallest_size(cfg)


@pytest.fixture(scope="module")
def shapes_folder(tmp_path_factory) -> Path:
    """2 x LARGE training images at 96 px (JPEG, class folders): enough for two steps of the largest batch."""
    root = tmp_path_factory.mktemp("config-space") / "shapes"
    assert main(["make-shapes", "--out", str(root), "--n", str(2 * LARGE), "--size", "96"]) == 0
    return root


@pytest.fixture(scope="module")
def embed_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("config-space") / "few"
    assert main(["make-shapes", "--out", str(root), "--n", "10", "--size", "40"]) == 0
    return root


def train_args(cell: dict, data: Path, run: Path) -> list[str]:
    batch = batch_of(cell)
    sets = [f"data.limit={2 * batch}", "train.log_every=1", "train.num_threads=1",
            f"train.precision={cell['precision']}"]
    if cell["method"] == "cpc":
        source = f"sequences:{max(2 * batch, 8)}"  # (data.limit keeps 2 batches of the 8 the source needs at least)
        # the sequence encoder at the image cells' width (128 channels, not 512): a sixteenth of the convolutions'
        # cost, the same code paths
        sets += ["method.context_dim=32", "method.steps=3", f"method.negative_pool={POOL['cpc']}", "encoder.width=0.25"]
    else:
        source = str(data)
        sets += [f"data.size={size_of(cell)}", f"data.mode={cell['data']}",
                 f"train.channels_last={str(cell['channels_last']).lower()}", *ENCODERS[cell["encoder"]],
                 *small_heads(cell["method"])]
    args = ["train", "--method", cell["method"], "--data", source, "--epochs", "1", "--batch-size", str(batch),
            "--accumulate", str(cell["accumulate"]), "--out", str(run), "--no-progress", "--device", DEVICE]
    for item in sets:
        args += ["--set", item]
    return args


def cell_config(cell: dict) -> dict:
    """The cell's configuration as its train command sets it (flags and ``--set`` items), on the built-in shapes."""
    args = train_args(cell, Path("shapes"), Path("run"))
    flags = dict(zip(args[1::2], args[2::2]))  # after "train": flag, value pairs; --set repeats (read below)
    raw = {"method": {"name": cell["method"]}, "train": {"batch_size": int(flags["--batch-size"]),
                                                         "accumulate": int(flags["--accumulate"])}}
    for flag, item in zip(args, args[1:]):
        if flag == "--set" and not item.startswith(("data.limit", "data.mode")):
            raw = merge(raw, parse_override(item))
    return raw


def _cli(args: list[str], world: int, faults: str = "") -> tuple[int, str]:
    """The CLI in this process, as a user's command runs (``--nproc 2`` forks its two workers from it): the exit
    code and everything written to stderr, by this process or the workers."""
    several = ["--nproc", "2", "--set", HANG_LIMIT] if world == 2 and args[0] == "train" else []
    run = cli_run([*args, *several], faults)
    return run.returncode, run.stderr


def run_cell(cell: dict, data: Path, few: Path, tmp: Path) -> dict:
    """Train (stopped after step 1), resume to step 2, embed: what happened at each stage."""
    run = tmp / "run"
    code, err = _cli(train_args(cell, data, run), cell["world"], "signal_after_step=1,signal=TERM")
    if code != 143:
        return {"stage": "train", "code": code, "stderr": err}
    code, err = _cli(["train", "--out", str(run), "--resume", "--no-progress"], cell["world"])
    if code != 0:
        return {"stage": "resume", "code": code, "stderr": err}
    feats = tmp / "features.npy"
    code, err = _cli(["embed", "--checkpoint", str(run), "--out", str(feats), "--no-progress", "--device", DEVICE]
                     + (["--split", "train"] if cell["method"] == "cpc" else ["--data", str(few)]), 1)
    if code != 0:
        return {"stage": "embed", "code": code, "stderr": err}
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    return {"stage": "done", "losses": losses, "features": np.load(feats),
            "summary": json.loads((run / "summary.json").read_text())}


def expected_refusal(cell: dict) -> str | None:
    return next((fragment.format(pool=POOL.get(cell["method"])) for when, fragment in REFUSED if when(cell)), None)


@pytest.mark.parametrize("cell", CELLS + SEQUENCE_CELLS, ids=cell_id)
def test_cell_trains_resumes_and_embeds_or_refuses_in_one_line(cell, shapes_folder, embed_folder, tmp_path):
    if DEVICE != "cpu" and cell["world"] == 2 and torch.cuda.device_count() < 2:
        pytest.skip("a two-process cell on cuda needs two GPUs (nccl); the CPU run covers it with gloo")
    result = run_cell(cell, shapes_folder, embed_folder, tmp_path)
    refusal = expected_refusal(cell)
    if refusal is not None:
        assert result["stage"] == "train" and result["code"] == 2, result
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and refusal in lines[0], result["stderr"]
        return
    assert result["stage"] == "done", f"{result['stage']} ended with {result['code']}:\n{result['stderr'][-3000:]}"
    assert len(result["losses"]) == 2 and all(np.isfinite(result["losses"])), result["losses"]
    assert result["summary"]["steps"] == 2
    feats = result["features"]
    # the source's training sequences, or 10 + 2 images
    rows = max(2 * batch_of(cell), 8) if cell["method"] == "cpc" else 12
    assert feats.shape[0] == rows and feats.ndim == 2 and np.isfinite(feats).all()


REFUSED_CELLS = [cell for cell in CELLS + SEQUENCE_CELLS if expected_refusal(cell)]


@pytest.mark.parametrize("cell", REFUSED_CELLS, ids=cell_id)
def test_a_refused_cell_advises_a_setting_the_plan_then_takes(cell):
    """Every refusal the cells produce carries the setting it advises (kontrast.errors.Refusal); applied to the
    cell's config, the run's decisions are made without refusal (the accepted cells show that such plans train)."""
    raw, world = cell_config(cell), cell["world"]
    with pytest.raises(Refusal, match=re.escape(expected_refusal(cell))) as refused:
        decide(resolve(raw), world)
    advice = dict(refused.value.advice)
    assert advice, refused.value
    world = advice.pop("nproc", world)
    for key, value in advice.items():
        raw = merge(raw, parse_override(f"{key}={'null' if value is None else value}"))
    decide(resolve(raw), world)
