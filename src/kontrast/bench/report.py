"""The sections of ``kontrast bench``, each printing its figures as they come, with the line that reproduces them.

  augment  images/s per thread of every recipe, batched ``make_views`` vs torchvision's PIL pipeline
  step     per-step time by phase for every image method, and the share outside the encoder
  loss     dense vs blocked (linear-memory) NT-Xent, forward + backward, by batch size
  train    end-to-end ``kontrast train`` images/s (and steady rate, peak RSS) of SimCLR in each setting

Timings are only comparable within one sitting: ratios, not absolute figures, are the result.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from kontrast.bench import runs
from kontrast.bench.options import NUMERICS, BenchOptions, check, command, threads
from kontrast.errors import UserError
from kontrast.precision import native_bf16


def _median_time(fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def section_augment(opts: BenchOptions, images) -> dict:
    from kontrast.augment import RECIPES
    from kontrast.bench.augment import augment_throughput

    recipes = list(opts.recipes or sorted(RECIPES))
    opts.log(f"== augmentation: source images/s through every view of the recipe, 1 thread, batch {opts.batch} "
             "(torchvision: per PIL image)")
    rows = augment_throughput(images, recipes, batch=opts.batch, seconds=opts.aug_seconds, device=opts.device,
                              compiled=opts.compile_views)
    extra = f" {'compiled':>9s} {'ratio':>7s} {'compile s':>9s}" if opts.compile_views else ""
    opts.log(f"{'recipe':16s} {'views':>5s} {'ours':>9s} {'torchvision':>12s} {'ratio':>7s}{extra}")
    for r in rows:
        r["command"] = (command(opts, "augment", recipes=r["recipe"])
                        + (" --compile-views" if opts.compile_views else ""))
        extra = (f" {r['compiled_img_per_s']:9.0f} {r['compiled_ratio']:6.1f}x {r['compile_s']:9.1f}"
                 if opts.compile_views else "")
        opts.log(f"{r['recipe']:16s} {r['views']:5d} {r['ours_img_per_s']:9.0f} {r['torchvision_img_per_s']:12.0f} "
                 f"{r['ratio']:6.1f}x{extra}")
    opts.log(f"  reproduce: {command(opts, 'augment')}" + (" --compile-views" if opts.compile_views else ""))
    return {"threads": 1, "batch": opts.batch, "recipes": rows}


def _image_methods(opts: BenchOptions) -> list[str]:
    from kontrast.methods import METHODS

    names = list(opts.methods or METHODS.names())
    return [n for n in names if METHODS.get(n).recipe is not None]


def _bench_config(opts: BenchOptions, method: str, setting: str):
    from kontrast.decisions import decide, encoder_layers
    from kontrast.methods.build import resolve
    from kontrast.precision import choose_precision

    raw = {"method": {"name": method}, "encoder": {"name": opts.encoder, "width": opts.width},
           "train": {"batch_size": opts.batch, "device": opts.device}}
    layers = encoder_layers(decide(resolve(raw)).encoder_args)
    precision, layout, _ = choose_precision(*NUMERICS[setting], opts.device, layers)
    raw["train"].update(precision=precision, channels_last=layout)
    return resolve(raw)


def section_step(opts: BenchOptions, data) -> dict:
    from kontrast.bench.step import PHASES, step_breakdown

    opts.log(f"== per-step breakdown (ms, median of {opts.step_iters}), {opts.encoder} width {opts.width:g}, "
             f"batch {opts.batch}, {opts.step_setting}, {threads(opts)} thread(s); outside = 1 - (encoder fwd+bwd "
             "+ target fwd) / step")
    short = {"data_augment": "data+aug", "forward_loss": "fwd+loss", "backward": "bwd", "guard": "guard",
             "optimizer": "optim", "after_step": "after"}
    opts.log(f"{'method':15s} " + " ".join(f"{short[p]:>8s}" for p in PHASES)
             + f" {'step':>8s} {'encoder':>8s} {'target':>8s} {'outside':>8s}")
    rows = []
    for name in _image_methods(opts):
        line = command(opts, "step", methods=name, step_setting=opts.step_setting)
        try:
            cfg = _bench_config(opts, name, opts.step_setting)
            r = step_breakdown(cfg, data, iters=opts.step_iters)
        except UserError as exc:  # e.g. a batch too small for a method's queue or BN groups
            opts.log(f"{name:15s} skipped: {exc}")
            rows.append({"method": name, "skipped": str(exc), "command": line})
            continue
        r["command"] = line
        rows.append(r)
        share = (f" {1e3 * r['encoder_fwd_bwd_s']:8.1f} {1e3 * r['target_fwd_s']:8.1f}"
                 f" {100 * r['outside_encoder']:7.1f}%"
                 if "outside_encoder" in r else "   (feature maps: encoder share not replayed)")
        opts.log(f"{name:15s} " + " ".join(f"{1e3 * r['phases_s'][p]:8.1f}" for p in PHASES)
                 + f" {1e3 * r['step_s']:8.1f}" + share)
    names = ",".join(r["method"] for r in rows)
    reproduce = command(opts, "step", methods=names, step_setting=opts.step_setting, step_iters=opts.step_iters)
    opts.log(f"  reproduce: {reproduce}")
    return {"setting": opts.step_setting, "threads": threads(opts), "batch": opts.batch, "methods": rows}


def section_loss(opts: BenchOptions) -> dict:
    from kontrast.losses.chunked import CHUNK_ROWS, CHUNKED_ABOVE, info_nce_chunked
    from kontrast.losses.infonce import two_view_info_nce
    from kontrast.similarity import cosine

    def dense(z1, z2):
        a = torch.cat([z1, z2])
        return two_view_info_nce(cosine(a, a, 0.5), z1.shape[0])

    def blocked(z1, z2):
        b = z1.shape[0]
        a, rows = torch.cat([z1, z2]), torch.arange(2 * b, device=z1.device)
        return info_nce_chunked(a, a, (rows + b) % (2 * b), 0.5, exclude=rows)

    device = torch.device(opts.device)
    opts.log(f"== NT-Xent forward + backward (ms, median), dense [2B, 2B] vs row blocks of {CHUNK_ROWS}, D = 128, "
             f"{threads(opts)} thread(s); nt_xent switches above {CHUNKED_ABOVE} score entries")
    opts.log(f"{'batch':>6s} {'dense':>9s} {'blocked':>9s} {'speed-up':>9s} {'dense MiB':>10s} {'blocked MiB':>12s}")
    rows = []
    for b in opts.loss_batches:
        gen = torch.Generator().manual_seed(b)
        z1 = torch.randn(b, 128, generator=gen).to(device).requires_grad_()
        z2 = torch.randn(b, 128, generator=gen).to(device).requires_grad_()
        iters = max(3, min(20, 4096 // b))
        times = {}
        for name, fn in (("dense", dense), ("blocked", blocked)):
            def run(fn=fn):
                fn(z1, z2).backward()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            times[name] = _median_time(run, iters)
        n = 2 * b
        row = {"batch": b, "dense_ms": round(1e3 * times["dense"], 2), "blocked_ms": round(1e3 * times["blocked"], 2),
               "speedup": round(times["dense"] / times["blocked"], 2),
               "dense_scores_mib": round(n * n * 4 / 2**20, 2),  # one [2B, 2B] fp32 matrix (several are kept)
               "blocked_scores_mib": round(min(n, CHUNK_ROWS) * n * 4 / 2**20, 2)}
        rows.append(row)
        opts.log(f"{b:6d} {row['dense_ms']:9.2f} {row['blocked_ms']:9.2f} {row['speedup']:8.2f}x "
                 f"{row['dense_scores_mib']:10.1f} {row['blocked_scores_mib']:12.1f}")
    line = command(opts, "loss", loss_batches=",".join(map(str, opts.loss_batches)))
    opts.log(f"  reproduce: {line}")
    return {"threads": threads(opts), "chunk_rows": CHUNK_ROWS, "chunked_above": CHUNKED_ABOVE, "rows": rows,
            "command": line}


def train_run(opts: BenchOptions, setting: str, work: Path) -> dict:
    """One end-to-end ``kontrast train`` run of SimCLR in ``setting`` (its own process): figures and command."""
    cmd = runs.ours_command(opts.data, method="simclr", steps=opts.steps, batch=opts.batch, width=opts.width,
                            encoder=opts.encoder, threads=threads(opts), setting=setting,
                            out=str(work / f"ours-{setting}"), device=opts.device)
    return {**runs.run_ours(cmd, threads(opts), work, opts.timeout), "command": runs.display(cmd)}


def section_train(opts: BenchOptions) -> dict:
    n, work = threads(opts), runs.scratch_dir(opts.workdir)
    opts.log(f"== end-to-end SimCLR training, {opts.encoder} width {opts.width:g}, batch {opts.batch}, {opts.steps} "
             f"steps, {n} thread(s), one process per setting")
    result: dict = {"threads": n, "steps": opts.steps, "batch": opts.batch, "width": opts.width,
                    "encoder": opts.encoder, "settings": {}}
    for setting in opts.settings:
        o = train_run(opts, setting, work)
        result["settings"][setting] = {"ours": o}
        opts.log(f"{setting:15s} {o['img_per_s']:7.1f} img/s (steady {o['img_per_s_steady']:.1f}), "
                 f"peak RSS {o['peak_rss_mib']} MiB")
        opts.log(f"  ran: {o['command']}")
    if "fp32" in result["settings"] and len(result["settings"]) > 1:
        base = result["settings"]["fp32"]["ours"]["img_per_s"]
        result["vs_fp32"] = {s: round(e["ours"]["img_per_s"] / base, 2) for s, e in result["settings"].items()
                             if s != "fp32"}
        opts.log("vs fp32: " + ", ".join(f"{s} {r:.2f}x" for s, r in result["vs_fp32"].items()))
    opts.log(f"  reproduce: {command(opts, 'train', steps=opts.steps, settings=','.join(opts.settings))}")
    return result


def run_bench(opts: BenchOptions) -> dict:
    """Run the chosen sections, printing each figure as it comes; all figures as one dict."""
    check(opts)
    torch.set_num_threads(threads(opts))
    native, machine = native_bf16(opts.device)
    opts.log(f"machine: {machine}; native bf16: {'yes' if native else 'no'}; torch {torch.__version__}, "
             f"{os.cpu_count()} CPUs, {threads(opts)} thread(s)")
    result: dict = {"torch": torch.__version__, "device": opts.device, "cpu_count": os.cpu_count(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": machine,
                    "native_bf16": native,
                    "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                    "data": opts.data, "threads": threads(opts)}
    data = None
    if {"augment", "step"} & set(opts.sections):
        from kontrast.data import load_images

        data = load_images(opts.data, "train", size=32)
        if len(data) < opts.batch:
            raise UserError(f"--batch {opts.batch} is larger than the data ({len(data)} images); lower --batch")
    t0 = time.perf_counter()
    if "augment" in opts.sections:
        perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[: opts.batch]
        result["augment"] = section_augment(opts, data.x[perm])
    if "step" in opts.sections:
        result["step"] = section_step(opts, data)
    if "loss" in opts.sections:
        result["loss"] = section_loss(opts)
    if "train" in opts.sections:
        result["train"] = section_train(opts)
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def main_json(opts: BenchOptions) -> None:
    """``--json``: progress lines to stderr, one JSON object to stdout."""
    opts.log = lambda *a: print(*a, file=sys.stderr, flush=True)
    print(json.dumps(run_bench(opts)))
