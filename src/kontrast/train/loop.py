"""One training loop for every method: data on the device, batched views, hooks.

Per step: indices -> uint8 images (already on the device) -> ``make_views`` ->
``method.training_step`` under optional bf16 autocast -> backward -> optimizer
step with the precomputed lr -> ``method.after_step``. The loop knows no
method; a method knows no device.

Reliability (docs/reliability.md): a run is a pure function of its config and seed, so an
interrupted run resumes bit for bit (batch order from (seed, epoch), views from (seed, epoch,
sample, view), global generators re-seeded from (seed, step), everything else in the
checkpoint); checkpoints at epoch ends, every ``train.checkpoint_every`` steps and on
SIGTERM / SIGINT (then exit 143 / 130); a non-finite loss or gradient is caught before the
optimizer step (``train.nonfinite``: stop or skip); a collapsing embedding is warned about.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from tqdm import tqdm

from kontrast.augment import derive_key, key_tensor, view_maker
from kontrast.checkpoint import latest_checkpoint, load_checkpoint, remove_partial, save_checkpoint
from kontrast.config import Config, dump
from kontrast.data import batch_indices, load_images
from kontrast.errors import Interrupted, UserError
from kontrast.evaluate.protocol import evaluate_encoder
from kontrast.faults import Faults
from kontrast.methods.build import check_inputs, create_method, view_specs
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


def step_seed(seed: int, step: int) -> int:
    """Seed of the global generators for step ``step``: anything a method draws from them
    (MoCo's shuffled BN groups, dropout) is a function of (seed, step), so a resumed run draws the same."""
    return derive_key("step", seed, step) & 0x7FFF_FFFF_FFFF_FFFF


class MetricLog:
    """One JSON line per logged step, mirrored to TensorBoard.

    ``resume_step``: when continuing a run, lines after that step (written by the interrupted
    process after its last checkpoint) are dropped, so the file holds each step once.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        path = run_dir / "metrics.jsonl"
        if resume_step is not None and path.exists():
            _truncate_metrics(path, resume_step)
        self.file = open(path, "a")
        purge = None if resume_step is None else resume_step + 1  # hide TensorBoard events after the checkpoint
        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=purge)

    def write(self, step: int, values: dict) -> None:
        self.file.write(json.dumps({"step": step, **values}) + "\n")
        self.file.flush()
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch":
                self.tb.add_scalar(key, value, step)

    def close(self) -> None:
        self.file.close()
        self.tb.close()


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the lines of steps <= ``step`` (and drop a line a crash cut short); atomic rewrite."""
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("step", 0) <= step:
            kept.append(line + "\n")
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def _nonfinite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """0-d bool on the device: does any tensor hold a NaN or inf? One fused reduction, no host sync.

    Per-tensor L2 norms (NaN and inf propagate; fused on GPUs, 18 ms for ResNet-18's 11.5M gradients
    on one CPU core, where max-abs took 96 ms and isfinite 156 ms). A norm that overflows float32
    (elements beyond ~1e19) also counts as non-finite: such a step is lost anyway.
    """
    if not tensors:
        return torch.zeros((), dtype=torch.bool)
    norms = torch._foreach_norm(tensors, 2.0)  # [T] 0-d tensors
    return ~torch.isfinite(torch.stack(norms)).all()


def _floating_state(method: torch.nn.Module) -> list[torch.Tensor]:
    return [t for t in method.state_dict().values() if t.is_floating_point()]


class NonFiniteGuard:
    """Detects a non-finite loss or gradient before the optimizer step, on the device.

    ``check_step`` returns a 0-d bool tensor and records the first bad step in a device
    tensor, so the default ``stop`` policy needs no host synchronisation per step: the
    record is read at log steps, before every checkpoint (so no checkpoint ever holds
    what followed a bad step) and at the end. ``skip`` reads the flag every step.
    """

    def __init__(self, method: torch.nn.Module, device: torch.device):
        self.params = [p for p in method.parameters() if p.requires_grad]
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)  # step (1-based) of the first bad one
        self.bad_loss = torch.zeros((), dtype=torch.bool, device=device)  # was it the loss (else a gradient)?

    def check_step(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        loss_bad = ~torch.isfinite(loss.detach())
        bad = loss_bad | _nonfinite([p.grad for p in self.params if p.grad is not None])
        first = (self.first_bad < 0) & bad
        self.first_bad = torch.where(first, step, self.first_bad)
        self.bad_loss = torch.where(first, loss_bad, self.bad_loss)
        return bad

    def raise_if_bad(self, step: int, run_dir: Path) -> None:
        first = int(self.first_bad)  # host sync: only at log steps, checkpoints and the end
        if first >= 0:
            what = "loss" if bool(self.bad_loss) else "gradient"
            raise UserError(
                f"non-finite {what} at step {first} (stopped at step {step}; nothing after step {first - 1} "
                f"was saved); last good checkpoint: {latest_checkpoint(run_dir) or 'none'}; lower optim.lr, "
                "use --precision fp32, or --set train.nonfinite=skip"
            )


class CollapseMonitor:
    """Warns once when ``embedding_std`` stays below ``threshold`` for ``window`` steps.

    The std of L2-normalised embeddings is ~1/sqrt(d) for spread-out embeddings and 0 when
    every image maps to the same point (SimSiam, Chen & He 2021, https://arxiv.org/abs/2011.10566,
    section 4.1). Read at log steps only.
    """

    def __init__(self, threshold: float, window: int, state: dict | None = None):
        self.threshold, self.window = threshold, window
        state = state or {}
        self.below_since: int | None = state.get("below_since")
        self.warned: bool = state.get("warned", False)

    def state(self) -> dict:
        return {"below_since": self.below_since, "warned": self.warned}

    def update(self, step: int, std: float | None) -> str | None:
        if self.threshold <= 0 or std is None:
            return None
        if not std < self.threshold:  # NaN counts as not collapsed: the non-finite guard reports it
            self.below_since, self.warned = None, False
            return None
        if self.below_since is None:
            self.below_since = step
        if self.warned or step - self.below_since + 1 < self.window:
            return None
        self.warned = True
        return (f"embeddings are collapsing: embedding_std {std:.2e} has stayed below train.collapse_std="
                f"{self.threshold:g} since step {self.below_since} (healthy ~1/sqrt(dim)); check the method "
                "(stop-gradient, predictor, negatives) or lower optim.lr")


class SignalStop:
    """SIGTERM / SIGINT set a flag; the loop finishes its step, checkpoints and stops.

    A second signal restores the default handler and aborts at once.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> "SignalStop":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            signal.signal(signum, self._previous.get(signum) or signal.SIG_DFL)
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def fit(cfg: Config, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    """Pretrain ``cfg.method`` on ``cfg.data`` (see :func:`_fit`); ``train.num_threads`` holds for this call only,
    so a caller's thread count (and with it float summation order) is left as it was."""
    threads = torch.get_num_threads()
    try:
        return _fit(cfg, run_dir, resume=resume, overwrite=overwrite, progress=progress)
    finally:
        torch.set_num_threads(threads)


def _fit(cfg: Config, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    """Pretrain ``cfg.method`` on ``cfg.data``; write checkpoints and metrics under ``run_dir``.

    Reproducible and resumable exactly: the batch order is a function of (seed, epoch), the
    views of (seed, epoch, sample index, view), the global generators are re-seeded from
    (seed, step) before every step, and a checkpoint holds everything else.
    """
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
    if tc.compile:  # in place (nn.Module.compile): same parameters and state_dict keys, checkpoints unchanged
        method.encoder.compile()  # (the view pipeline is compiled too: view_maker below)
    note = method.bind_data(data)  # per-sample data beside the images (CLIP's captions); None for most methods
    if note:
        print(note, file=sys.stderr)
    check_inputs(method, data)
    specs = view_specs(cfg, method)  # () for a sequence method: it gets the raw float batch
    make = view_maker(specs, compile=tc.compile)  # compiled: one graph, the epoch's key passed as a tensor
    optimizer = create_optimizer(method, cfg.optim, tc.batch_size)
    warmup = round(cfg.optim.warmup_epochs * steps_per_epoch)
    peak = peak_lr(cfg.optim, tc.batch_size)
    lrs = lr_schedule(peak, total_steps, warmup, cfg.optim.min_lr).tolist()

    start_step, counters = 0, {"skipped": 0, "consecutive_skips": 0, "collapse": None}
    if resume:
        remove_partial(run_dir)  # temporary folders of a checkpoint a crash interrupted
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise UserError(f"--resume: no complete checkpoint in {run_dir}/checkpoints; start a new run instead")
        state = load_checkpoint(ckpt, method, optimizer, method_name=cfg.method.name)
        saved_spe = state.get("steps_per_epoch", steps_per_epoch)
        if saved_spe != steps_per_epoch:
            raise UserError(f"checkpoint {ckpt} was written with {saved_spe} steps per epoch, this run has "
                            f"{steps_per_epoch} (different data or batch size); resume with the run's own settings")
        start_step = state["step"]
        counters.update({k: state[k] for k in counters if k in state})
        _set_rng_state(state["rng"], device)
    prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)  # inputs are valid: now touch the disk
    dump(cfg, run_dir / "config.yaml")

    knn_sets = None
    if tc.knn_every and data.labels is not None:
        test = load_images(cfg.data.source, "test", size=cfg.data.size, cache_dir=cfg.data.cache_dir,
                           skip_bad_images=cfg.data.skip_bad_images)
        knn_sets = (data, test.subset(tc.knn_max_test, seed=tc.seed))

    images = data.images.to(device)  # [N, 3, H, W] uint8, the whole dataset on the device
    log = MetricLog(run_dir, resume_step=start_step if resume else None)
    bar = tqdm(total=total_steps, initial=start_step, disable=not progress, unit="step", dynamic_ncols=True)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=tc.precision == "bf16")
    guard = NonFiniteGuard(method, device)
    collapse = CollapseMonitor(tc.collapse_std, tc.collapse_window, counters["collapse"])
    fault = Faults()
    step, t_window, n_window, t_start = start_step, time.perf_counter(), 0, time.perf_counter()
    last: dict = {}

    def knn_monitor(epoch: int) -> None:
        mean, std = (specs[0].mean, specs[0].std) if specs else (None, None)  # sequences: not normalised
        res = evaluate_encoder(method.encoder, *knn_sets, cfg.eval, mean=mean, std=std,
                               device=str(device), precision=tc.precision, linear=False,
                               max_train=tc.knn_max_train)
        log.write(step, {"epoch": epoch, "knn_top1": res["knn_top1"]})
        bar.write(f"epoch {epoch}: kNN top-1 {res['knn_top1']:.4f}")
        method.train()

    def save() -> Path:
        guard.raise_if_bad(step, run_dir)
        if bool(_nonfinite(_floating_state(method))):
            raise UserError(f"weights became non-finite by step {step}; not checkpointed; "
                            f"last good checkpoint: {latest_checkpoint(run_dir) or 'none'}")
        state = {"step": step, "epoch": step // steps_per_epoch, "total_steps": total_steps,
                 "steps_per_epoch": steps_per_epoch, "num_samples": n,  # sizes per-sample state on reload
                 "method": cfg.method.name, "skipped": counters["skipped"],
                 "consecutive_skips": counters["consecutive_skips"], "collapse": collapse.state()}
        return save_checkpoint(run_dir, method, optimizer, state, rng=_rng_state(device))

    def warn(kind: str, message: str) -> None:
        log.write(step, {"warning": kind, "message": message})
        bar.write(f"warning: {message}", file=sys.stderr)

    method.train()
    try:
        with SignalStop() as stop:
            if knn_sets and start_step == 0:
                knn_monitor(0)  # the untrained encoder: the baseline every later figure is read against
            for epoch in range(start_step // steps_per_epoch, tc.epochs):
                aug_key = key_tensor(derive_key("augment", tc.seed, epoch), device)
                for i, idx in enumerate(batch_indices(n, tc.batch_size, epoch, tc.seed)):
                    if epoch * steps_per_epoch + i < start_step:
                        continue  # mid-epoch resume: these batches were already seen
                    for group in optimizer.param_groups:
                        group["lr"] = peak if group.get("fixed_lr") else lrs[step]
                    torch.manual_seed(step_seed(tc.seed, step))
                    fault.trace(step + 1, epoch, idx)
                    idx = idx.to(device)
                    views = make(images[idx], idx, aug_key) if specs else [images[idx]]
                    if tc.channels_last and specs:
                        views = [v.contiguous(memory_format=torch.channels_last) for v in views]
                    buffers = [b.clone() for b in method.buffers()] if tc.nonfinite == "skip" else None
                    with autocast:
                        out = method.training_step(views, idx)
                    if fault.enabled:
                        out["loss"] = fault.poison(step + 1, out["loss"])
                    optimizer.zero_grad(set_to_none=True)
                    out["loss"].backward()
                    bad = guard.check_step(step + 1, out["loss"])
                    step += 1
                    skipped = tc.nonfinite == "skip" and bool(bad)  # the skip policy reads the flag every step
                    if skipped:
                        torch._foreach_copy_(list(method.buffers()), buffers)  # as if the step never ran
                        guard.first_bad.fill_(-1)
                        counters["skipped"] += 1
                        counters["consecutive_skips"] += 1
                        warn("nonfinite", f"non-finite loss or gradient at step {step}; step skipped "
                             f"({counters['consecutive_skips']} in a row, {counters['skipped']} in all)")
                        if counters["consecutive_skips"] >= tc.max_skips:
                            raise UserError(
                                f"{counters['consecutive_skips']} consecutive steps (up to step {step}) had a "
                                f"non-finite loss or gradient (train.max_skips={tc.max_skips}); last good "
                                f"checkpoint: {latest_checkpoint(run_dir) or 'none'}; lower optim.lr or use fp32")
                    else:
                        optimizer.step()
                        counters["consecutive_skips"] = 0
                        method.after_step(step / total_steps)
                    n_window += len(idx)
                    bar.update(1)
                    if (step % tc.log_every == 0 or step == total_steps) and not skipped:
                        guard.raise_if_bad(step, run_dir)
                        now = time.perf_counter()
                        last = {k: float(v.detach()) for k, v in out.items()}
                        last.update(epoch=epoch, lr=lrs[step - 1], img_per_s=n_window / (now - t_window))
                        log.write(step, last)
                        bar.set_postfix(loss=f"{last['loss']:.4f}", img_s=f"{last['img_per_s']:.0f}")
                        t_window, n_window = now, 0
                        message = collapse.update(step, last.get("embedding_std"))
                        if message:
                            warn("collapse", message)
                    fault.after_step(step)  # test hook: a kill or signal arriving during this step
                    epoch_end = i == steps_per_epoch - 1
                    if epoch_end and knn_sets and ((epoch + 1) % tc.knn_every == 0 or epoch + 1 == tc.epochs):
                        knn_monitor(epoch + 1)
                    if epoch_end or (tc.checkpoint_every and step % tc.checkpoint_every == 0) or stop.received:
                        ckpt = save()
                    if stop.received:
                        name = signal.Signals(stop.received).name
                        raise Interrupted(f"{name} after step {step} of {total_steps}; checkpoint {ckpt}; "
                                          f"continue with: kontrast train --out {run_dir} --resume",
                                          128 + stop.received)
            guard.raise_if_bad(step, run_dir)
    finally:
        bar.close()
        log.close()
    wall = time.perf_counter() - t_start
    summary = {"method": cfg.method.name, "steps": step, "epochs": tc.epochs, "wall_s": round(wall, 2),
               "img_per_s": round((step - start_step) * tc.batch_size / max(wall, 1e-9), 1),
               "final_loss": last.get("loss"), "skipped_steps": counters["skipped"]}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
