"""``kontrast demo`` / ``make demo``: pretrain SimCLR on the built-in ``shapes`` data and
show, side by side, kNN top-1 on raw pixels, a randomly initialised encoder, and
the pretrained encoder. Everything runs on the CPU in a few minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kontrast.config import load_yaml, merge
from kontrast.data import load_images
from kontrast.decisions import view_specs
from kontrast.evaluate.options import EvalOptions
from kontrast.evaluate.protocol import evaluate_encoder, evaluate_raw_pixels
from kontrast.evaluate.run import evaluate_run
from kontrast.methods.build import create_method, resolve
from kontrast.train.loop import fit

DEMO_CONFIG = Path(__file__).parent / "demo.yaml"


def run_demo(out: str | Path, *, epochs: int | None = None, progress: bool = True) -> dict:
    raw = load_yaml(DEMO_CONFIG)
    if epochs is not None:
        raw = merge(raw, {"train": {"epochs": epochs}})
    cfg = resolve(raw)
    print(f"kontrast demo: {cfg.method.name} on {cfg.data.source}, {cfg.encoder.name} width {cfg.encoder.width}, "
          f"{cfg.train.epochs} epochs, batch {cfg.train.batch_size}, {cfg.train.precision}")
    if (Path(out) / "config.yaml").is_file():
        print(f"note: replacing the earlier demo run in {out} (pass --out DIR to keep it)")
    summary = fit(cfg, out, overwrite=True, progress=progress)

    kw = dict(size=cfg.data.size, cache_dir=cfg.data.cache_dir)
    train, test = load_images(cfg.data.source, "train", **kw), load_images(cfg.data.source, "test", **kw)
    torch.manual_seed(cfg.train.seed)
    untrained = create_method(cfg)  # the same initialisation the run started from
    spec = view_specs(cfg)[0]
    rows = {
        "raw pixels": evaluate_raw_pixels(train, test, cfg.eval),
        "random encoder": evaluate_encoder(untrained.encoder, train, test, cfg.eval, EvalOptions(clustering=False),
                                           mean=spec.mean, std=spec.std),
        "pretrained encoder": evaluate_run(out),
    }
    print(f"\n{'features':20s} {'kNN top-1':>10s} {'linear top-1':>13s}")
    for name, res in rows.items():
        print(f"{name:20s} {res['knn_top1']:10.4f} {res['linear_top1']:13.4f}")
    print(f"\npretraining: {summary['wall_s']:.0f} s, {summary['img_per_s']:.0f} images/s; run in {out}")
    result = {name: {k: res[k] for k in ("knn_top1", "linear_top1")} for name, res in rows.items()}
    (Path(out) / "demo.json").write_text(json.dumps(result, indent=1))
    return result
