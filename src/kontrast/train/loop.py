"""One training loop for every method: data on the device, batched views, hooks.

Per step: indices -> uint8 images (already on the device) -> ``make_views`` ->
``method.training_step`` under optional bf16 autocast -> backward -> optimizer
step with the precomputed lr -> ``method.after_step``. The loop knows no
method; a method knows no device.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import torch
from tqdm import tqdm

from kontrast.augment import make_views
from kontrast.config import Config, dump
from kontrast.data import batch_indices, load_images
from kontrast.errors import UserError
from kontrast.evaluate.protocol import evaluate_encoder
from kontrast.methods.build import create_method, view_specs
from kontrast.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from kontrast.train.optim import create_optimizer, lr_schedule, peak_lr

RUN_MARKERS = ("config.yaml", "checkpoints", "metrics.jsonl")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but no CUDA device is available; use --set train.device=cpu")
    return torch.device(name)


def holds_run(run_dir: Path) -> bool:
    return any((run_dir / m).exists() for m in RUN_MARKERS)


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber an existing run unless asked (checked before any work)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"output path {run_dir} is a file; choose a directory for --out")
    if holds_run(run_dir) and not (resume or overwrite):
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it or --overwrite to replace it")


def prepare_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Create the run directory; ``overwrite`` clears an earlier run's files first."""
    if overwrite and not resume:
        for marker in (*RUN_MARKERS, "tb", "summary.json"):
            target = run_dir / marker
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)


def step_seed(seed: int, epoch: int, step_in_epoch: int) -> int:
    """Augmentation randomness is a function of (seed, epoch, step), so a resumed run sees the same views."""
    return hash((seed, epoch, step_in_epoch)) & 0x7FFF_FFFF_FFFF_FFFF


class MetricLog:
    """One JSON line per logged step, mirrored to TensorBoard."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.file = open(run_dir / "metrics.jsonl", "a")
        self.tb = SummaryWriter(str(run_dir / "tb"))

    def write(self, step: int, values: dict) -> None:
        self.file.write(json.dumps({"step": step, **values}) + "\n")
        self.file.flush()
        for key, value in values.items():
            if isinstance(value, (int, float)) and key != "epoch":
                self.tb.add_scalar(key, value, step)

    def close(self) -> None:
        self.file.close()
        self.tb.close()


def _all_finite(module: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


def fit(cfg: Config, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    """Pretrain ``cfg.method`` on ``cfg.data``; write checkpoints and metrics under ``run_dir``."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir, resume=resume, overwrite=overwrite)
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    device = resolve_device(cfg.train.device)
    tc = cfg.train
    if tc.precision not in ("fp32", "bf16"):
        raise UserError(f"train.precision must be fp32 or bf16, got {tc.precision!r}")

    data = load_images(cfg.data.source, "train", size=cfg.data.size, cache_dir=cfg.data.cache_dir,
                       skip_bad_images=cfg.data.skip_bad_images)
    data = data.subset(cfg.data.limit, seed=tc.seed)
    n = len(data.images)
    steps_per_epoch = len(batch_indices(n, tc.batch_size, 0, tc.seed))
    total_steps = tc.epochs * steps_per_epoch

    torch.manual_seed(tc.seed)
    method = create_method(cfg, num_samples=n).to(device)
    if tc.channels_last:
        method = method.to(memory_format=torch.channels_last)
    specs = view_specs(cfg, method)
    optimizer = create_optimizer(method, cfg.optim, tc.batch_size)
    warmup = round(cfg.optim.warmup_epochs * steps_per_epoch)
    lrs = lr_schedule(peak_lr(cfg.optim, tc.batch_size), total_steps, warmup, cfg.optim.min_lr).tolist()

    prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)  # inputs are valid: now touch the disk
    start_step = 0
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise UserError(f"--resume: no complete checkpoint in {run_dir}/checkpoints; start a new run instead")
        start_step = load_checkpoint(ckpt, method, optimizer)["step"]
    dump(cfg, run_dir / "config.yaml")

    knn_sets = None
    if tc.knn_every and data.labels is not None:
        knn_sets = (data, load_images(cfg.data.source, "test", size=cfg.data.size, cache_dir=cfg.data.cache_dir,
                                      skip_bad_images=cfg.data.skip_bad_images))

    images = data.images.to(device)  # [N, 3, H, W] uint8, the whole dataset on the device
    log = MetricLog(run_dir)
    bar = tqdm(total=total_steps, initial=start_step, disable=not progress, unit="step", dynamic_ncols=True)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=tc.precision == "bf16")
    step, t_window, n_window, t_start = start_step, time.perf_counter(), 0, time.perf_counter()
    last = {}

    def knn_monitor(epoch: int) -> None:
        spec = specs[0]
        res = evaluate_encoder(method.encoder, *knn_sets, cfg.eval, mean=spec.mean, std=spec.std,
                               device=str(device), precision=tc.precision, linear=False,
                               max_train=tc.knn_max_train)
        log.write(step, {"epoch": epoch, "knn_top1": res["knn_top1"]})
        bar.write(f"epoch {epoch}: kNN top-1 {res['knn_top1']:.4f}")
        method.train()

    method.train()
    try:
        if knn_sets and start_step == 0:
            knn_monitor(0)  # the untrained encoder: the baseline every later figure is read against
        for epoch in range(start_step // steps_per_epoch, tc.epochs):
            for i, idx in enumerate(batch_indices(n, tc.batch_size, epoch, tc.seed)):
                if epoch * steps_per_epoch + i < start_step:
                    continue  # mid-epoch resume: these batches were already seen
                for group in optimizer.param_groups:
                    group["lr"] = lrs[step]
                gen = torch.Generator(device).manual_seed(step_seed(tc.seed, epoch, i))
                idx = idx.to(device)
                views = make_views(images[idx], specs, gen)
                if tc.channels_last:
                    views = [v.contiguous(memory_format=torch.channels_last) for v in views]
                with autocast:
                    out = method.training_step(views, idx)
                optimizer.zero_grad(set_to_none=True)
                out["loss"].backward()
                optimizer.step()
                step += 1
                method.after_step(step / total_steps)
                n_window += len(idx)
                bar.update(1)
                if step % tc.log_every == 0 or step == total_steps:
                    now = time.perf_counter()
                    last = {k: float(v.detach()) for k, v in out.items()}
                    if not math.isfinite(last["loss"]):
                        ckpt = latest_checkpoint(run_dir)
                        raise UserError(f"loss became {last['loss']} at step {step}; last good checkpoint: "
                                        f"{ckpt or 'none'}; lower optim.lr or use --precision fp32")
                    last.update(epoch=epoch, lr=lrs[step - 1], img_per_s=n_window / (now - t_window))
                    log.write(step, last)
                    bar.set_postfix(loss=f"{last['loss']:.4f}", img_s=f"{last['img_per_s']:.0f}")
                    t_window, n_window = now, 0
            epoch_done = epoch + 1
            if knn_sets and (epoch_done % tc.knn_every == 0 or epoch_done == tc.epochs):
                knn_monitor(epoch_done)
            if not _all_finite(method):
                raise UserError(f"weights became non-finite in epoch {epoch_done}; not checkpointed; "
                                f"last good checkpoint: {latest_checkpoint(run_dir) or 'none'}")
            save_checkpoint(run_dir, method, optimizer, {"step": step, "epoch": epoch_done, "total_steps": total_steps})
    finally:
        bar.close()
        log.close()
    wall = time.perf_counter() - t_start
    summary = {"method": cfg.method.name, "steps": step, "epochs": tc.epochs, "wall_s": round(wall, 2),
               "img_per_s": round((step - start_step) * tc.batch_size / max(wall, 1e-9), 1),
               "final_loss": last.get("loss")}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
