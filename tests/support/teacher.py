"""A distillation teacher for the tests that build every method (support/steps.py, support/sizes.py): a tiny
ResNet-18 (width 1/16, CIFAR stem, seeded random weights) written once per test process as a `kontrast export`
folder, so that CLI runs in this process and the ranks of ``--nproc`` read it by path. Random weights suffice
there: those tests check what the method computes, not what it learns (tests/learning/test_distill_learning.py
trains a real teacher)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from kontrast.encoders import create_encoder
from kontrast.outputs.export import backbone_info, write_backbone

WIDTH = 0.0625


def teacher_network(seed: int = 0) -> torch.nn.Module:
    """The tiny teacher's network, the same weights for the same seed (the global generator left as it was)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return create_encoder("resnet18", stem="cifar", width=WIDTH)


@functools.cache
def tiny_teacher() -> str:
    """The path of this process's tiny teacher export (written on first use, removed when the process ends)."""
    root = Path(tempfile.mkdtemp(prefix="kontrast-teacher-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    network = teacher_network()
    write_backbone(network, backbone_info(network, "resnet18", stem="cifar", width=WIDTH), root / "teacher")
    return str(root / "teacher")


def with_teacher(cfg):
    """``cfg`` with the tiny teacher where it is a distill config without one; any other config as it is."""
    params = cfg.method.params
    if cfg.method.name != "distill" or params.teacher:
        return cfg
    return replace(cfg, method=replace(cfg.method, params=replace(params, teacher=tiny_teacher())))


def teacher_args(method: str) -> list[str]:
    """``--set method.teacher=<the tiny teacher>`` for distill, nothing for another method: for the CLI runs of
    every method that take no other per-method settings."""
    return ["--set", f"method.teacher={tiny_teacher()}"] if method == "distill" else []
