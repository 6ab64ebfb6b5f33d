"""The choices of one evaluation: which scores, where, in which arithmetic. The defaults are ``kontrast eval``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class EvalOptions:
    """How :func:`kontrast.evaluate.run.evaluate_run`, :func:`kontrast.evaluate.protocol.evaluate_encoder` and
    :func:`kontrast.evaluate.finetune.finetune_top1` evaluate an encoder, beside the run's ``eval`` section (kNN's k
    and temperature, the probe's epochs, the feature batch: :class:`kontrast.config.EvalConfig`).

    ``device``: where the encoder runs. ``precision``: its arithmetic, fp32 whatever the run trained in, so scores do
    not depend on the machine (``auto``: bf16 where the device computes it natively).
    ``linear``: the linear probe on frozen features. ``clustering``: k-means of the test features against their
    labels (NMI, AMI, ARI, Hungarian accuracy, each with its chance level). ``linear_weight_decay``: the probe's,
    over the config's ``eval.linear_weight_decay`` (None: the config's; ``auto``: chosen on a held-out tenth of the
    training labels).
    ``labels_fraction``: in (0, 1], also fine-tune a copy of the encoder with a linear head on that class-balanced
    fraction of the training labels (SimCLR's semi-supervised protocol, :mod:`kontrast.evaluate.finetune`); 0: no
    fine-tuning. ``finetune_epochs``: its epochs (0: SimCLR's, 60 on 1 % of the labels or fewer and 30 above);
    ``finetune_batch_size`` and ``finetune_lr`` (per 256 images): SimCLR's. ``split``: what is scored, ``test``,
    or ``validation``: the rows a run held out of its training split (``data.validation``), every score fit on the
    other training rows, so settings are chosen without the test split.
    """

    device: str = "cpu"
    precision: str = "fp32"
    linear: bool = True
    clustering: bool = True
    linear_weight_decay: float | Literal["auto"] | None = None
    labels_fraction: float = 0.0
    finetune_epochs: int = 0
    finetune_batch_size: int = 256
    finetune_lr: float = 0.05
    split: str = "test"  # or "validation": the run's held-out training rows (data.validation), fit on the rest


DEFAULTS = EvalOptions()  # kontrast eval's: kNN, linear probe and clustering in fp32 on the CPU, no fine-tuning
