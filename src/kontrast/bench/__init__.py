"""``kontrast bench``: the speed figures of docs/performance.md, each with the command that reproduces it.

Sections (``--sections``, comma list):
  augment  images/s per thread of every recipe, batched ``make_views`` vs torchvision's PIL pipeline
  step     per-step time by phase for every image method, and the share outside the encoder
  loss     dense vs blocked (linear-memory) NT-Xent, forward + backward, by batch size
  train    end-to-end ``kontrast train`` images/s and peak RSS on the data, fp32 and bf16 + channels_last,
           each right after the peer baseline (``--peer-python``) in the same setting, and the ratio
  accuracy (only with ``--accuracy``) kNN top-1 after ``--accuracy-epochs`` epochs, ours and the peer's

Timings are only comparable within one sitting: ratios, not absolute figures, are the result.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kontrast.errors import UserError

ALL_SECTIONS = ("augment", "step", "loss", "train")
DEFAULT_DATA = "../shared/data/cifar10-jpeg.tar.gz"
DEFAULT_PEER_SCRIPT = "../shared/bench/lightly_simclr.py"
TARGETS = {"train_vs_peer_fp32": 3.0, "train_vs_peer_best": 1.7, "augment_vs_torchvision": 8.0,
           "outside_encoder": {"simclr": 0.10, "moco_v2": 0.15, "byol": 0.15}}
FULL_WIDTH_VS_PEER_BEST = 1.1  # issue 7: at full width the encoder dominates, so the target vs the peer's best is lower


def _train_target(name: str, width: float) -> float:
    return FULL_WIDTH_VS_PEER_BEST if name == "train_vs_peer_best" and width >= 1 else TARGETS[name]


@dataclass
class BenchOptions:
    sections: tuple[str, ...] = ALL_SECTIONS
    data: str | None = None  # None: DEFAULT_DATA if present, else the built-in shapes
    batch: int = 256
    encoder: str = "resnet18"
    width: float = 0.25
    threads: int = 0  # per process, for step / loss / train (0 = the number of CPUs); augment is always 1
    device: str = "cpu"
    recipes: tuple[str, ...] = ()  # () = every recipe
    methods: tuple[str, ...] = ()  # () = every image method
    aug_seconds: float = 2.0
    compile_views: bool = False  # augment: also the compiled view pipeline (train.compile's)
    step_iters: int = 3
    step_setting: str = "bf16_cl"
    loss_batches: tuple[int, ...] = (128, 256, 512, 1024, 2048)
    steps: int = 30  # training steps per end-to-end run
    settings: tuple[str, ...] = ("fp32", "bf16_cl")
    peer_python: str | None = None
    peer_data: str | None = None
    peer_script: str = DEFAULT_PEER_SCRIPT
    accuracy: bool = False
    accuracy_epochs: int = 5
    workdir: str | None = None
    timeout: float = 3600.0
    log: object = field(default=print, repr=False)


def _threads(opts: BenchOptions) -> int:
    return opts.threads or os.cpu_count() or 1


def _data(opts: BenchOptions) -> str:
    if opts.data:
        return opts.data
    return DEFAULT_DATA if Path(DEFAULT_DATA).is_file() else "shapes"


def _command(opts: BenchOptions, section: str, **extra) -> str:
    """The ``kontrast bench`` line that reproduces one section (with the options that matter to it)."""
    parts = ["kontrast", "bench", "--sections", section, "--data", _data(opts), "--batch", str(opts.batch)]
    if section != "augment":
        parts += ["--threads", str(_threads(opts))]
    if section in ("step", "train", "accuracy"):
        parts += ["--encoder", opts.encoder, "--width", f"{opts.width:g}"]
    for key, value in extra.items():
        parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(parts)


def _median_time(fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# --------------------------------------------------------------------------- sections


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
        r["command"] = _command(opts, "augment", recipes=r["recipe"]) + (" --compile-views" if opts.compile_views else "")
        extra = (f" {r['compiled_img_per_s']:9.0f} {r['compiled_ratio']:6.1f}x {r['compile_s']:9.1f}"
                 if opts.compile_views else "")
        opts.log(f"{r['recipe']:16s} {r['views']:5d} {r['ours_img_per_s']:9.0f} {r['torchvision_img_per_s']:12.0f} "
                 f"{r['ratio']:6.1f}x{extra}")
    opts.log(f"  reproduce: {_command(opts, 'augment')}" + (" --compile-views" if opts.compile_views else ""))
    return {"threads": 1, "batch": opts.batch, "recipes": rows}


def _image_methods(opts: BenchOptions) -> list[str]:
    from kontrast.methods import METHODS

    names = list(opts.methods or METHODS.names())
    return [n for n in names if METHODS.get(n).recipe is not None]


def _bench_config(opts: BenchOptions, method: str, setting: str):
    from kontrast.methods.build import resolve

    raw = {"method": {"name": method}, "encoder": {"name": opts.encoder, "width": opts.width},
           "train": {"batch_size": opts.batch, "precision": "bf16" if setting == "bf16_cl" else "fp32",
                     "channels_last": setting == "bf16_cl", "device": opts.device}}
    return resolve(raw)


def section_step(opts: BenchOptions, data) -> dict:
    from kontrast.bench.step import PHASES, step_breakdown

    device = torch.device(opts.device)
    images = data.images.to(device)
    opts.log(f"== per-step breakdown (ms, median of {opts.step_iters}), {opts.encoder} width {opts.width:g}, "
             f"batch {opts.batch}, {opts.step_setting}, {_threads(opts)} thread(s); outside = 1 - (encoder fwd+bwd "
             "+ target fwd) / step")
    short = {"data_augment": "data+aug", "forward_loss": "fwd+loss", "backward": "bwd", "guard": "guard",
             "optimizer": "optim", "after_step": "after"}
    opts.log(f"{'method':15s} " + " ".join(f"{short[p]:>8s}" for p in PHASES)
             + f" {'step':>8s} {'encoder':>8s} {'target':>8s} {'outside':>8s}")
    rows = []
    for name in _image_methods(opts):
        command = _command(opts, "step", methods=name, step_setting=opts.step_setting)
        try:
            cfg = _bench_config(opts, name, opts.step_setting)
            r = step_breakdown(cfg, images, data, iters=opts.step_iters, device=device)
        except UserError as exc:  # e.g. a batch too small for a method's queue or BN groups
            opts.log(f"{name:15s} skipped: {exc}")
            rows.append({"method": name, "skipped": str(exc), "command": command})
            continue
        r["command"] = command
        rows.append(r)
        share = (f" {1e3 * r['encoder_fwd_bwd_s']:8.1f} {1e3 * r['target_fwd_s']:8.1f} {100 * r['outside_encoder']:7.1f}%"
                 if "outside_encoder" in r else "   (feature maps: encoder share not replayed)")
        opts.log(f"{name:15s} " + " ".join(f"{1e3 * r['phases_s'][p]:8.1f}" for p in PHASES)
                 + f" {1e3 * r['step_s']:8.1f}" + share)
    opts.log(f"  reproduce: {_command(opts, 'step', step_setting=opts.step_setting)}")
    return {"setting": opts.step_setting, "threads": _threads(opts), "batch": opts.batch, "methods": rows}


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
             f"{_threads(opts)} thread(s); nt_xent switches above {CHUNKED_ABOVE} score entries")
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
    command = _command(opts, "loss", loss_batches=",".join(map(str, opts.loss_batches)))
    opts.log(f"  reproduce: {command}")
    return {"threads": _threads(opts), "chunk_rows": CHUNK_ROWS, "chunked_above": CHUNKED_ABOVE, "rows": rows,
            "command": command}


def _peer_ready(opts: BenchOptions) -> str | None:
    """None when the peer can run, else why not (printed; the peer columns are then skipped)."""
    if not opts.peer_python:
        return "no --peer-python given (see ../shared/bench/README.md to set the peer up)"
    if not Path(opts.peer_python).exists():
        return f"--peer-python {opts.peer_python} does not exist"
    if not opts.peer_data or not (Path(opts.peer_data) / "train").is_dir():
        return f"--peer-data must be the extracted CIFAR-10 folder holding train/ and test/, got {opts.peer_data!r}"
    if not Path(opts.peer_script).is_file():
        return f"peer script {opts.peer_script} not found (--peer-script)"
    return None


def section_train(opts: BenchOptions) -> dict:
    from kontrast.bench import runs

    threads, data, work = _threads(opts), _data(opts), runs.scratch_dir(opts.workdir)
    why_not = _peer_ready(opts)
    opts.log(f"== end-to-end SimCLR training, {opts.encoder} width {opts.width:g}, batch {opts.batch}, {opts.steps} "
             f"steps, {threads} thread(s) per process, peer and ours back to back")
    if why_not:
        opts.log(f"  peer skipped: {why_not}")
    result: dict = {"threads": threads, "steps": opts.steps, "batch": opts.batch, "width": opts.width,
                    "encoder": opts.encoder, "peer_skipped": why_not, "settings": {}}
    peer_runs: dict[str, dict] = {}  # peer command -> its result (bf16_cl_compile reuses bf16_cl's)
    for setting in opts.settings:
        entry: dict = {}
        if not why_not:
            cmd = runs.peer_command(opts.peer_python, opts.peer_script, opts.peer_data, steps=opts.steps,
                                    batch=opts.batch, width=opts.width, threads=threads, setting=setting)
            line = runs.display(cmd)
            if line not in peer_runs:
                peer_runs[line] = {**runs.run_peer(cmd, threads, work, opts.timeout, f"peer-{setting}"), "command": line}
            entry["peer"] = peer_runs[line]
        cmd = runs.ours_command(data, method="simclr", steps=opts.steps, batch=opts.batch, width=opts.width,
                                encoder=opts.encoder, threads=threads, setting=setting,
                                out=str(work / f"ours-{setting}"), device=opts.device)
        entry["ours"] = {**runs.run_ours(cmd, threads, work, opts.timeout), "command": runs.display(cmd)}
        if "peer" in entry:
            entry["ratio"] = round(entry["ours"]["img_per_s"] / entry["peer"]["img_per_s"], 2)
        result["settings"][setting] = entry
        o = entry["ours"]
        line = f"{setting:8s} ours {o['img_per_s']:7.1f} img/s (steady {o['img_per_s_steady']:.1f}), " \
               f"peak RSS {o['peak_rss_mib']} MiB"
        if "peer" in entry:
            p = entry["peer"]
            line += f" | peer {p['img_per_s']:7.1f} img/s, peak RSS {p['peak_rss_mib']} MiB | ours/peer {entry['ratio']:.2f}x"
        opts.log(line)
        opts.log(f"  ours: {entry['ours']['command']}")
        if "peer" in entry:
            opts.log(f"  peer: {entry['peer']['command']}")
    got = {s: e for s, e in result["settings"].items() if s != "bf16_cl_compile"}
    compiled = result["settings"].get("bf16_cl_compile")
    if compiled and "peer" in compiled:  # compiling takes minutes once per process: compare steady rates
        ours = compiled["ours"]["img_per_s_steady"]
        result["compiled_steady_vs_peer_fp32"] = round(ours / got["fp32"]["peer"]["img_per_s"], 2) if "fp32" in got else None
        result["compiled_steady_vs_peer_best"] = round(ours / max(e["peer"]["img_per_s"] for e in
                                                                  result["settings"].values()), 2)
        opts.log(f"with train.compile, steady rate (first logging window, which holds the compile, left out) "
                 f"{ours:.1f} img/s: {result['compiled_steady_vs_peer_best']:.2f}x the peer's best"
                 + (f", {result['compiled_steady_vs_peer_fp32']:.2f}x its fp32" if "fp32" in got else ""))
    if not why_not and {"fp32", "bf16_cl"} <= set(got):
        best = max(got[s]["ours"]["img_per_s"] for s in got)
        result["ours_best_vs_peer_fp32"] = round(best / got["fp32"]["peer"]["img_per_s"], 2)
        result["ours_best_vs_peer_best"] = round(best / max(got[s]["peer"]["img_per_s"] for s in got), 2)
        opts.log(f"ours at its best vs the peer's default (fp32): {result['ours_best_vs_peer_fp32']:.2f}x "
                 f"(target {TARGETS['train_vs_peer_fp32']}x); vs the peer's best: {result['ours_best_vs_peer_best']:.2f}x "
                 f"(target {_train_target('train_vs_peer_best', opts.width)}x)")
    opts.log(f"  reproduce: {_command(opts, 'train', steps=opts.steps)}"
             + (f" --peer-python {opts.peer_python} --peer-data {opts.peer_data}" if not why_not else ""))
    return result


def section_accuracy(opts: BenchOptions) -> dict:
    from kontrast.bench import runs

    threads, data, work = _threads(opts), _data(opts), runs.scratch_dir(opts.workdir)
    why_not = _peer_ready(opts)
    opts.log(f"== accuracy: weighted kNN top-1 (k=200, tau=0.1) after {opts.accuracy_epochs} epochs, SimCLR, "
             f"{opts.encoder} width {opts.width:g}, batch {opts.batch}")
    result: dict = {"epochs": opts.accuracy_epochs, "peer_skipped": why_not, "settings": {}}
    for setting in opts.settings:
        entry: dict = {}
        if not why_not:
            cmd = runs.peer_command(opts.peer_python, opts.peer_script, opts.peer_data, steps=0, batch=opts.batch,
                                    width=opts.width, threads=threads, setting=setting, epochs=opts.accuracy_epochs)
            entry["peer"] = {**runs.run_peer(cmd, threads, work, opts.timeout, f"peer-acc-{setting}"),
                             "command": runs.display(cmd)}
        out = str(work / f"ours-acc-{setting}")
        cmd = runs.ours_command(data, method="simclr", steps=0, batch=opts.batch, width=opts.width,
                                encoder=opts.encoder, threads=threads, setting=setting, out=out,
                                epochs=opts.accuracy_epochs, device=opts.device)
        ours = runs.run_ours(cmd, threads, work, opts.timeout)
        ours["knn_top1"] = runs.run_eval(out, threads, work, opts.timeout)["knn_top1"]
        entry["ours"] = {**ours, "command": runs.display(cmd) + f" && kontrast eval --checkpoint {out} --no-linear"}
        result["settings"][setting] = entry
        opts.log(f"{setting:8s} ours kNN {ours['knn_top1']:.4f}"
                 + (f" | peer kNN {entry['peer']['knn_top1']:.4f}" if "peer" in entry else ""))
    return result


# --------------------------------------------------------------------------- entry point


def run_bench(opts: BenchOptions) -> dict:
    """Run the chosen sections, printing each figure as it comes; all figures as one dict."""
    bad = [s for s in opts.sections if s not in ALL_SECTIONS]
    if bad:
        raise UserError(f"unknown bench section(s) {', '.join(bad)}; choose from {', '.join(ALL_SECTIONS)}")
    bad = [s for s in opts.settings if s not in ("fp32", "bf16_cl", "bf16_cl_compile")]
    if bad or opts.step_setting not in ("fp32", "bf16_cl"):
        raise UserError(f"bench settings must be fp32, bf16_cl or (train) bf16_cl_compile, got "
                        f"{', '.join(bad) or opts.step_setting}")
    if opts.batch < 2 or opts.steps < 1 or opts.step_iters < 1 or opts.timeout <= 0:
        raise UserError("--batch must be >= 2, --steps and --step-iters >= 1, --timeout > 0")
    threads = _threads(opts)
    torch.set_num_threads(threads)
    result: dict = {"torch": torch.__version__, "device": opts.device, "cpu_count": os.cpu_count(),
                    "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                    "data": _data(opts), "threads": threads}
    if opts.data is None and result["data"] == "shapes":
        opts.log(f"note: {DEFAULT_DATA} not found; using the built-in shapes data (pass --data)")
    need_images = {"augment", "step"} & set(opts.sections)
    data = None
    if need_images:
        from kontrast.data import load_images

        data = load_images(result["data"], "train", size=32)
        if len(data) < opts.batch:
            raise UserError(f"--batch {opts.batch} is larger than the data ({len(data)} images); lower --batch")
    t0 = time.perf_counter()
    if "augment" in opts.sections:
        perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[: opts.batch]
        result["augment"] = section_augment(opts, data.images[perm])
    if "step" in opts.sections:
        result["step"] = section_step(opts, data)
    if "loss" in opts.sections:
        result["loss"] = section_loss(opts)
    if "train" in opts.sections:
        result["train"] = section_train(opts)
    if opts.accuracy:
        result["accuracy"] = section_accuracy(opts)
    result["targets"] = _targets(result, opts.width)
    for name, verdict in result["targets"].items():
        opts.log(f"target {name}: {verdict}")
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def _targets(result: dict, width: float) -> dict:
    """Issue 7's targets, as met / not met / not measured, from the figures measured in this sitting."""
    out: dict = {}
    if "augment" in result:
        worst = min(result["augment"]["recipes"], key=lambda r: r["ratio"])
        ok = worst["ratio"] >= TARGETS["augment_vs_torchvision"]
        out["augment_vs_torchvision"] = (f"{'met' if ok else 'NOT met'}: lowest {worst['ratio']}x ({worst['recipe']}), "
                                         f"target {TARGETS['augment_vs_torchvision']}x")
        if all("compiled_ratio" in r for r in result["augment"]["recipes"]):
            worst = min(result["augment"]["recipes"], key=lambda r: r["compiled_ratio"])
            ok = worst["compiled_ratio"] >= TARGETS["augment_vs_torchvision"]
            out["augment_vs_torchvision_compiled"] = (
                f"{'met' if ok else 'NOT met'}: lowest {worst['compiled_ratio']}x ({worst['recipe']}), "
                f"target {TARGETS['augment_vs_torchvision']}x")
    if "step" in result:
        by_name = {r["method"]: r for r in result["step"]["methods"] if "outside_encoder" in r}
        for name, limit in TARGETS["outside_encoder"].items():
            if name in by_name:
                share = by_name[name]["outside_encoder"]
                out[f"outside_encoder_{name}"] = (f"{'met' if share <= limit else 'NOT met'}: {100 * share:.1f}% "
                                                  f"(target <= {100 * limit:.0f}%)")
    acc = result.get("accuracy", {}).get("settings", {})
    if "bf16_cl" in acc and ("fp32" in acc or "peer" in acc["bf16_cl"]):
        fast = acc["bf16_cl"]["ours"]["knn_top1"]
        refs = {f"peer {s}": e["peer"]["knn_top1"] for s, e in acc.items() if "peer" in e}
        refs.update({"ours fp32": acc["fp32"]["ours"]["knn_top1"]} if "fp32" in acc else {})
        out["accuracy_at_fast_defaults"] = (f"{'met' if all(fast >= r for r in refs.values()) else 'NOT met'}: "
                                            f"bf16_cl kNN {fast:.4f} vs " + ", ".join(f"{k} {v:.4f}" for k, v in refs.items()))
    train = result.get("train", {})
    if "ours_best_vs_peer_fp32" in train:
        for key, target in (("ours_best_vs_peer_fp32", "train_vs_peer_fp32"),
                            ("ours_best_vs_peer_best", "train_vs_peer_best")):
            want = _train_target(target, width)
            out[key] = f"{'met' if train[key] >= want else 'NOT met'}: {train[key]}x (target {want}x)"
    return out


def main_json(opts: BenchOptions) -> None:
    """``--json``: progress lines to stderr, one JSON object to stdout."""
    opts.log = lambda *a: print(*a, file=sys.stderr, flush=True)
    print(json.dumps(run_bench(opts)))
