"""Argument lists shared by the tests: the tiny settings every CLI run starts from.

Tiny: ResNet-18 at an eighth of its width on 16-px images, no progress bar. Each method's small heads, predictors,
prototypes and queues: support/sizes.py.
"""

from __future__ import annotations

TINY_ENCODER = {"name": "resnet18", "width": 0.125}  # as a config section, for resolve()
# for the ViT-only methods (iBOT)
TINY_VIT = {"name": "vit_tiny", "width": 0.125, "depth": 2, "patch_size": 4, "drop_path": 0.0}


def tiny_encoder(method: str) -> dict:
    """The tiny encoder section for ``method``: a ResNet, or a ViT where the method needs patch tokens."""
    from kontrast.methods import METHODS

    return dict(TINY_VIT if METHODS.get(method).needs.vit else TINY_ENCODER)
TINY_SETTINGS = ["encoder.width=0.125", "data.size=16"]
TINY = [arg for item in TINY_SETTINGS for arg in ("--set", item)] + ["--no-progress"]
ONE_CPU_THREAD = ["train.num_threads=1", "train.device=cpu"]
# runs on several processes: a rank stuck rather than dead ends the run after 2 minutes, not after gloo's default 30,
# with each waiting rank's line in stderr (the longest wait of a healthy test run, rank 0 writing a checkpoint under
# CI's load, is seconds)
HANG_LIMIT = "train.collective_timeout=120"  # runs whose numbers a test compares bit for bit


def sets(items: list[str]) -> list[str]:
    """``["a=1", "b=2"]`` -> ``["--set", "a=1", "--set", "b=2"]``."""
    return [arg for item in items for arg in ("--set", item)]


def train_command(out, *extra: str, method: str | None = None, data: str = "shapes:32", epochs: int = 2,
                  batch: int = 16, settings: list[str] = ()) -> list[str]:
    """``kontrast train`` at the tiny settings on one CPU thread (2 epochs of 2 steps by default), then ``settings``
    (``--set`` items) and the ``extra`` arguments as given."""
    args = ["train", *(["--method", method] if method else []), "--data", str(data), "--epochs", str(epochs),
            "--batch-size", str(batch), "--out", str(out), "--no-progress"]
    return args + sets([*TINY_SETTINGS, *ONE_CPU_THREAD, *settings]) + list(extra)
