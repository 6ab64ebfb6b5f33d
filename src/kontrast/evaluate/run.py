"""Evaluate a finished (or running) pretraining run from its directory."""

from __future__ import annotations

import json
from pathlib import Path

from kontrast.augment import ViewSpec
from kontrast.checkpoint import RUN_CONFIG, STATE_FILE, latest_checkpoint, load_weights, read_run_config
from kontrast.config import Config
from kontrast.data import Samples, load_images, split_validation
from kontrast.data.cache import write_atomic
from kontrast.decisions import check_source_kind, view_specs
from kontrast.errors import UserError
from kontrast.evaluate.finetune import check_finetune_args, finetune_top1
from kontrast.evaluate.options import DEFAULTS, EvalOptions
from kontrast.evaluate.protocol import evaluate_encoder
from kontrast.evaluate.zeroshot import supports_zeroshot, zeroshot_top1
from kontrast.methods.base import Method
from kontrast.methods.build import create_method, resolve
from kontrast.plugins import load_plugins
from kontrast.precision import in_precision

EVAL_FILE = "eval.json"  # the latest `kontrast eval` of a run, inside it


def load_run(path: str | Path) -> tuple[Config, Method, Path]:
    """``path`` is a run directory (newest checkpoint is used) or one checkpoint folder."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint path not found: {path}")
    if path.name == "checkpoints" and (path.parent / RUN_CONFIG).is_file():
        path = path.parent  # RUN/checkpoints means the run
    if (path / STATE_FILE).is_file():
        ckpt, run_dir = path, path.parent.parent
    else:
        run_dir, ckpt = path, latest_checkpoint(path)
        if ckpt is None:
            raise UserError(f"no complete checkpoint under {path}/checkpoints; "
                            f"train first (kontrast train --out {path})")
    if not (run_dir / RUN_CONFIG).is_file():
        raise UserError(f"{run_dir}/{RUN_CONFIG} is missing; --checkpoint must point at a kontrast run directory")
    load_plugins(run_dir=run_dir)  # a method from a user's file (the run names it) or an installed package
    raw, _ = read_run_config(run_dir)
    cfg = resolve(raw)
    method = create_method(cfg, num_samples=_num_samples(ckpt), pretrained=False)  # the checkpoint's weights follow
    method = in_precision(method, cfg.train.precision)  # a run trained in float64 kept its weights so
    load_weights(ckpt, method)
    return cfg, method, ckpt


def run_views(ckpt: Path, cfg: Config, method: Method) -> tuple[ViewSpec, ...]:
    """The views the run trained with (their normalisation is what its encoder expects), as its plan in
    ``RUN/config.yaml`` recorded them; recomputed from the config for a run written before plans were kept.
    ``()`` for a sequence method."""
    plan = read_run_config(ckpt.parent.parent)[1]
    try:
        return tuple(ViewSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in view.items()})
                     for view in plan["views"])
    except (KeyError, TypeError, ValueError):  # no plan, or one from another version of ViewSpec
        return view_specs(cfg)


def _num_samples(ckpt: Path) -> int:
    """The training-set size recorded in a checkpoint's state (sizes memory banks); 0 if absent."""
    try:
        return int(json.loads((ckpt / STATE_FILE).read_text()).get("num_samples", 0))
    except (OSError, ValueError, AttributeError):
        return 0  # load_weights reports a damaged checkpoint more precisely


def evaluate_run(path: str | Path, data: str | None = None, options: EvalOptions = DEFAULTS) -> dict:
    """kNN and linear-probe top-1 of a run's encoder on ``data`` (default: its training source), k-means
    clustering of its test features (NMI, AMI, ARI, Hungarian accuracy, each with its chance level), and with
    ``options.labels_fraction`` the test top-1 after fine-tuning on that class-balanced fraction of the training
    labels (evaluate/finetune.py); ``options`` (:class:`~kontrast.evaluate.options.EvalOptions`) says which of
    these, where and in which arithmetic, by default as ``kontrast eval``. The result is also kept in the run as
    ``RUN/eval.json`` (the report shows it)."""
    if options.labels_fraction or options.finetune_epochs < 0:
        check_finetune_args(options.labels_fraction, options.finetune_epochs)
    cfg, method, ckpt = load_run(path)
    source = data or cfg.data.source
    kw = dict(size=cfg.data.size, cache_dir=cfg.data.cache_dir, skip_bad_images=cfg.data.skip_bad_images)
    train, test = _splits(cfg, source, options.split, kw)
    check_source_kind(cfg, train.name, train.x.is_floating_point())  # evaluation reads labels, not the method's
    specs = run_views(ckpt, cfg, method)  # the recipe's normalisation; none for sequences
    spec = specs[0] if specs else None
    mean, std = (spec.mean, spec.std) if spec else (None, None)
    device, precision = options.device, options.precision
    result = evaluate_encoder(method.encoder.to(device), train, test, cfg.eval, options, mean=mean, std=std)
    if options.labels_fraction:
        result.update(finetune_top1(method.encoder, train, test, options, mean=mean, std=std, seed=cfg.train.seed))
    if supports_zeroshot(method) and test.classes:  # image-text models classify from class-name prompts
        result["zeroshot_top1"] = zeroshot_top1(method.to(device), test, mean=spec.mean, std=spec.std,
                                                device=device, precision=precision)
    result = {"checkpoint": str(ckpt), "method": cfg.method.name, "data": source, "split": options.split,
              "precision": precision, **result}
    _keep_in_run(ckpt.parent.parent / EVAL_FILE, result)
    return result


def _splits(cfg, source: str, split: str, kw: dict) -> tuple[Samples, Samples]:
    """(what the kNN bank and probe fit on, what is scored): the training and test splits, or for ``validation``
    the training rows the run trained on and the ones it held out (``data.validation``)."""
    train = load_images(source, "train", **kw)
    if split != "validation":
        return train, load_images(source, "test", **kw)
    if not cfg.data.validation:
        raise UserError("this run held out no validation images (data.validation 0); train with --set "
                        "data.validation=N to choose settings on N held-out training images, or score --split test")
    return split_validation(train, cfg.data.validation)


def _keep_in_run(path: Path, result: dict) -> None:
    """The latest scores, in the run (``RUN/eval.json``: the report shows them); written whole or not at all."""
    try:
        write_atomic(path, json.dumps(result, indent=1).encode())
    except OSError:  # a read-only run directory: the scores are still printed
        pass
