"""Peer parity: one method, one seed, trained by kontrast and by lightly 1.6 with the same settings, same kNN.

Builds kontrast's resolved config for the method (``kontrast.methods.build.resolve``: the method's own
recipe, optimizer and schedule, plus the budget below and any ``--set``), then, one after the other:

1. ``kontrast train ... --set data.limit=N`` and ``kontrast eval --checkpoint RUN --no-linear --json``
   (weighted kNN, k=200, tau=0.1, on frozen pooled encoder features of the 10,000 test images, with the
   full 50,000-image training split as the bank);
2. benchmarks/peer/lightly_ssl.py in the peer's own venv, every hyperparameter passed from that same
   config (views, optimizer, lr, weight decay, warm-up, schedule floor, temperatures, queue sizes,
   momentum schedules, head sizes), the same training images (kontrast's ``Samples.subset`` rule, checked
   by digest) and the same kNN protocol;

and appends one line to benchmarks/results/parity.jsonl. From the repository root (kontrast's venv):

    .venv/bin/python benchmarks/parity.py --method simclr --seed 0             # 20,000 images, 5 epochs
    .venv/bin/python benchmarks/parity.py --method byol --seed 1 --dry-run     # print both commands only
    .venv/bin/python benchmarks/parity.py --method swav --reuse-peer --set encoder.torch_init=true  # the peer's
                                          # result from an earlier row with the same peer command, if there is one
    .venv/bin/python benchmarks/parity.py --table                              # the markdown table
    .venv/bin/python benchmarks/parity.py --table --write-doc docs/results.md  # ... into its section

Settings kontrast has and lightly lacks are listed in each line's ``differences`` (and in the table's notes);
a config field this script does not know how to pass stops it (``--allow-unmatched`` runs anyway and
records it), so the two sides cannot drift apart silently when kontrast's recipes change.
Locations (each also from an environment variable): --data PEER_CIFAR10 (default runs/peer/data/cifar10),
--peer-python PEER_PYTHON (default runs/peer/venv/bin/python); benchmarks/setup_peer.sh makes both.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_SCRIPT = "benchmarks/peer/lightly_ssl.py"
RESULTS = "benchmarks/results/parity.jsonl"
METHODS = ("simclr", "moco_v2", "byol", "swav", "simsiam")
sys.path.insert(0, str(ROOT / "benchmarks/peer"))  # peer_common: plain torch, shared with the peer script
from peer_common import LARS_NOTE, paths_digest, view_delta  # noqa: E402

# kontrast method parameter -> peer flag (None: handled specially); a parameter not listed stops the run.
METHOD_FLAGS = {
    "simclr": {"temperature": "temperature", "proj_hidden": "proj-hidden", "proj_dim": "proj-dim", "view_bn": None},
    "moco_v2": {"temperature": "temperature", "queue_size": "queue-size", "momentum": "ema-momentum",
                "proj_hidden": "proj-hidden", "proj_dim": "proj-dim", "symmetric": "symmetric", "proj_bn": "proj-bn",
                "bn_groups": None, "head_bn_groups": None},
    "byol": {"proj_hidden": "proj-hidden", "proj_dim": "proj-dim", "pred_hidden": "pred-hidden",
             "base_momentum": "ema-momentum"},
    "swav": {"temperature": "temperature", "num_prototypes": "num-prototypes", "proj_hidden": "proj-hidden",
             "proj_dim": "proj-dim", "sinkhorn_epsilon": "sinkhorn-epsilon",
             "sinkhorn_iterations": "sinkhorn-iterations", "queue_size": "queue-size",
             "queue_start_epochs": "queue-start-epochs", "freeze_prototypes_epochs": "freeze-prototypes-epochs",
             "global_views": "global-views"},
    "simsiam": {"proj_hidden": "proj-hidden", "proj_dim": "proj-dim", "pred_hidden": "pred-hidden",
                "stop_gradient": "stop-gradient", "fix_pred_lr": "fix-pred-lr"},
}
OPTIM_FLAGS = {"name": "optim", "lr": "lr", "lr_batch": "lr-batch", "momentum": "momentum",
               "weight_decay": "weight-decay", "warmup_epochs": "warmup-epochs", "min_lr": "min-lr",
               "betas": "betas", "lars_eta": "lars-eta", "lars_clip": None}
# train / data / eval fields that do not change what is trained or how it is scored
NO_EFFECT = {"train": {"log_every", "knn_every", "knn_max_train", "knn_max_test", "checkpoint_every", "nonfinite",
                       "max_skips", "collapse_std", "collapse_window", "collapse_share", "num_threads",
                       # several processes only; parity runs one
                       "sync_bn", "shard", "bind_cores", "collective_timeout"},
             # mode / workers / memory_budget: the CIFAR archive is always read into memory (never streamed)
             "data": {"source", "skip_bad_images", "cache_dir", "mode", "workers", "memory_budget"},
             "eval": {"linear_epochs", "linear_weight_decay", "batch_size"}}
# ViT / amdim options: the peer's ResNet has none
OFF_BY_DEFAULT = ("depth", "patch_size", "freeze_patch_embed", "drop_path")
# optimizer options the peer script has not: at these, no effect
OPTIM_OFF = {"weight_decay_end": None, "clip_grad": 0.0}
HANDLED = {"train": {"epochs", "batch_size", "accumulate", "seed", "precision", "channels_last", "device", "compile"},
           "data": {"size", "limit", "validation"}, "eval": {"knn_k", "knn_temperature"},
           "encoder": {"name", "stem", "width", "zero_init_residual", "torch_init", "weights", "pool",
                       *OFF_BY_DEFAULT},
           "augment": {"recipe", "view", "views", "min_size", "size_ramp"}}


def _flag(name: str, value) -> list[str]:
    if isinstance(value, bool):
        return [f"--{name}" if value else f"--no-{name}"]
    if isinstance(value, (list, tuple)):
        return [f"--{name}", ",".join(str(v) for v in value)]
    return [f"--{name}", str(value)]


def resolved(args):
    """kontrast's config for this run: the method's recipe + the budget + ``--set`` (both sides use it)."""
    from kontrast.config import merge, parse_override
    from kontrast.decisions import decided
    from kontrast.methods.build import resolve

    raw = {"method": {"name": args.method}, "data": {"source": args.data, "limit": args.train_limit},
           "encoder": {"width": args.width},
           "train": {"epochs": args.epochs, "batch_size": args.batch, "seed": args.seed, "num_threads": args.threads}}
    for item in args.set:
        raw = merge(raw, parse_override(item))
    return decided(resolve(raw))  # data.size and encoder.stem as the run decides them


def peer_views(cfg) -> list[dict]:
    """kontrast's views for this run (recipe at data.size, augment.view applied), each as its fields that
    differ from ViewSpec's defaults (peer_common.VIEW_DEFAULTS)."""
    from kontrast.augment import recipe_views
    from kontrast.decisions import decide

    specs = recipe_views(decide(cfg).recipe, cfg.data.size, cfg.augment.view)
    return [view_delta(json.loads(json.dumps(dataclasses.asdict(s)))) for s in specs]


def peer_settings(cfg, args) -> tuple[list[str], list[str], list[str]]:
    """(peer flags, differences lightly cannot match, config fields this script does not know)."""
    name, unknown, diffs = cfg.method.name, [], []
    flags = ["--method", name, "--data", args.data, "--seed", str(cfg.train.seed), "--epochs", str(cfg.train.epochs),
             "--batch", str(cfg.train.batch_size), "--train-limit", str(cfg.data.limit),
             "--width", str(cfg.encoder.width), "--threads", str(args.threads),
             "--knn-k", str(cfg.eval.knn_k), "--knn-temperature", str(cfg.eval.knn_temperature)]
    for field in dataclasses.fields(cfg.method.params):
        value = getattr(cfg.method.params, field.name)
        if field.name not in METHOD_FLAGS[name]:
            unknown.append(f"method.{field.name}={value}")
        elif field.name == "head_bn_groups":  # lightly's head always sees the whole view: the note below
            pass
        elif field.name == "view_bn":  # lightly's SimCLR sends each view on its own, as per_view does
            if value != "per_view":
                diffs.append(f"BN batch: kontrast both views as one 2B batch (method.view_bn={value}); lightly each "
                             "view on its own")
        elif field.name == "bn_groups":  # kontrast: BN groups per view (encoders/batchnorm.py); lightly: SplitBatchNorm
            splits = value if value > 1 else 0
            flags += ["--bn-splits", str(splits)]
            if cfg.method.params.head_bn_groups and splits:
                diffs.append(f"shuffling BN: kontrast {value} BN groups per view in the query and key networks, "
                             f"projection head included; lightly SplitBatchNorm with {splits} splits per view in the "
                             "backbone only (the head's BN sees the whole view; kontrast: method.head_bn_groups=false)")
            if splits and cfg.train.batch_size % splits:
                unknown.append(f"method.bn_groups={value}: lightly's SplitBatchNorm needs a batch divisible by it")
        else:
            flags += _flag(METHOD_FLAGS[name][field.name], value)
    for field in dataclasses.fields(cfg.optim):
        value = getattr(cfg.optim, field.name)
        if field.name in OPTIM_OFF:
            if value != OPTIM_OFF[field.name]:
                unknown.append(f"optim.{field.name}={value}")
        elif field.name not in OPTIM_FLAGS:
            unknown.append(f"optim.{field.name}={value}")
        elif field.name == "lars_clip":
            if value and cfg.optim.name == "lars":
                flags += ["--kontrast-lars-clip"] + (["--lars-clip"] if args.peer_lars_clip else [])
                if not args.peer_lars_clip:
                    diffs.append(LARS_NOTE)
        else:
            flags += _flag(OPTIM_FLAGS[field.name], value)
    enc = cfg.encoder
    if enc.stem not in (None, "cifar") or not enc.name.startswith("resnet") or ":" in enc.name:
        unknown.append(f"encoder {enc.name} stem {enc.stem} (the peer has lightly's CIFAR ResNetGenerator)")
    flags += ["--arch", enc.name.replace("resnet", "resnet-"), *_flag("zero-init-residual", enc.zero_init_residual)]
    if not enc.torch_init:
        diffs.append("init: kontrast's ResNet convs Kaiming-normal, fan-out (torchvision's); lightly's ResNetGenerator "
                     "keeps PyTorch's default (encoder.torch_init=true matches it)")
    views = peer_views(cfg)
    for i, v in enumerate(views):
        cannot = [k for k in ("translate_p", "randaugment_n") if v.get(k)]
        cannot += ["solarize_p"] if v.get("solarize_p") and name != "byol" else []
        unknown += [f"augment view {i}: {k}={v[k]} (lightly's {name} transform has no such step)" for k in cannot]
    flags += ["--views", json.dumps(views, separators=(",", ":"))]
    tc = cfg.train
    from kontrast.decisions import decide, encoder_layers
    from kontrast.precision import choose_precision

    precision, channels_last, _ = choose_precision(tc.precision, tc.channels_last, _device(tc.device),
                                                   encoder_layers(decide(cfg).encoder_args))  # auto: as fit
    flags += ["--bf16"] if precision == "bf16" else []
    flags += ["--channels-last"] if channels_last else []
    flags += ["--device", _device(tc.device)]
    if tc.compile:
        diffs.append("kontrast compiles its encoder and views (train.compile); the peer runs eagerly")
    flags += ["--stem-relu"] if args.peer_stem_relu else []
    if enc.weights:  # both sides would have to start from the same weights: the peer script cannot load them
        unknown.append(f"encoder.weights={enc.weights} (the peer starts from a random initialisation)")
    unknown += [f"encoder.{k}={getattr(enc, k)}" for k in OFF_BY_DEFAULT if getattr(enc, k) not in (None, False)]
    if enc.pool != "token":  # a ViT's feature: the peer's ResNet has none
        unknown.append(f"encoder.pool={enc.pool} (the peer's ResNet pools its last map)")
    if cfg.data.validation:  # the peer trains on every training image of the limit
        unknown.append(f"data.validation={cfg.data.validation} (the peer holds no training images out)")
    if cfg.augment.views is not None:  # the peer's methods take their own two views
        unknown.append(f"augment.views={cfg.augment.views} (the peer's method takes its own views)")
    if cfg.augment.min_size:  # the peer's views are at data.size throughout
        unknown.append(f"augment.min_size={cfg.augment.min_size} (the peer trains at data.size throughout)")
    if tc.accumulate != 1:  # BN statistics per micro-batch: the peer normalises over the whole batch
        unknown.append(f"train.accumulate={tc.accumulate} (the peer trains the plain batch)")
    for section, known in HANDLED.items():
        for field in dataclasses.fields(getattr(cfg, section)):
            if field.name not in known | NO_EFFECT.get(section, set()):
                unknown.append(f"{section}.{field.name}={getattr(getattr(cfg, section), field.name)}")
    return flags, diffs, unknown


def _device(name: str) -> str:
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def kontrast_commands(cfg, args, run_dir: str) -> tuple[list[str], list[str]]:
    train = ["kontrast", "train", "--method", cfg.method.name, "--data", args.data, "--epochs", str(args.epochs),
             "--batch-size", str(args.batch), "--out", run_dir, "--overwrite", "--no-progress",
             "--set", f"data.limit={args.train_limit}", "--set", f"train.seed={args.seed}",
             "--set", f"encoder.width={args.width}", "--set", f"train.num_threads={args.threads}"]
    for item in args.set:
        train += ["--set", item]
    return train, ["kontrast", "eval", "--checkpoint", run_dir, "--no-linear", "--json"]


def _run(cmd: list[str], log: Path, threads: int) -> tuple[dict, float]:
    """Run ``cmd`` from the repository root with its output in ``log``; its last JSON line and wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    exe = [sys.executable, "-m", "kontrast.cli", *cmd[1:]] if cmd[0] == "kontrast" else cmd
    t0 = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(exe, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.perf_counter() - t0
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    if code != 0 or not lines:
        tail = log.read_text().strip().splitlines()[-3:]
        raise SystemExit(f"failed (exit {code}): {shlex.join(cmd)[:300]}\n  " + "\n  ".join(tail) + f"\n  log: {log}")
    return json.loads(lines[-1]), wall


def kontrast_digest(cfg) -> str:
    """Digest of the training images kontrast took (its paths, in its order), to compare with the peer's."""
    from kontrast.data import load_images

    data = load_images(cfg.data.source, "train", size=cfg.data.size, cache_dir=cfg.data.cache_dir)
    return paths_digest(data.subset(cfg.data.limit, seed=cfg.train.seed).paths)


def _git() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout
        return rev.strip() + ("+dirty" if dirty.strip() else "")
    except OSError:
        return "unknown"


NOTE_ONLY = {"--kontrast-lars-clip": LARS_NOTE}  # peer flags that change nothing it computes: the note each prints


def same_peer_run(cmd_a: list[str], cmd_b: list[str]) -> bool:
    """True when two peer commands compute the same thing (the python that runs them and note-only flags aside)."""
    return [a for a in cmd_a[1:] if a not in NOTE_ONLY] == [b for b in cmd_b[1:] if b not in NOTE_ONLY]


def earlier_peer(rows: list[dict], peer_cmd: list[str]) -> tuple[dict, list[str]] | None:
    """The newest earlier peer result whose command computes what ``peer_cmd`` would, and the notes its peer
    printed for ``peer_cmd`` (its row's differences less those this script adds from kontrast's config)."""
    for old in reversed(rows):
        if "peer" not in old or not same_peer_run(shlex.split(old["peer"]["command"]), peer_cmd):
            continue
        argv = ["--method", old["method"], "--seed", str(old["seed"]), "--epochs", str(old["epochs"]),
                "--train-limit", str(old["train_limit"]), "--width", str(old["width"]), "--batch", str(old["batch"]),
                "--threads", str(old["threads"])] + [a for item in old.get("set", []) for a in ("--set", item)]
        old_args = build_parser().parse_args(argv)
        old_args.peer_lars_clip = "--lars-clip" in shlex.split(old["peer"]["command"])
        ours = set(peer_settings(resolved(old_args), old_args)[1])
        notes = [d for d in old.get("differences", []) if d not in ours]
        absent = {note for flag, note in NOTE_ONLY.items() if flag not in peer_cmd}  # notes this command won't print
        return old, [d for d in notes if d not in absent]
    return None


def run_pair(args) -> dict:
    cfg = resolved(args)
    flags, diffs, unknown = peer_settings(cfg, args)
    if unknown and not args.allow_unmatched:
        raise SystemExit("kontrast's config has settings this script cannot pass to the peer: " + ", ".join(unknown)
                         + f"; extend {PEER_SCRIPT} and METHOD_FLAGS / OPTIM_FLAGS here (or --allow-unmatched)")
    tag = f"{cfg.method.name}-e{args.epochs}-n{args.train_limit}-s{args.seed}"
    run_dir = f"{args.runs}/{tag}/kontrast"
    train_cmd, eval_cmd = kontrast_commands(cfg, args, run_dir)
    peer_cmd = [args.peer_python, PEER_SCRIPT, *flags, *args.peer_extra]
    print(f"kontrast: {shlex.join(train_cmd)}\n          {shlex.join(eval_cmd)}\npeer:     {shlex.join(peer_cmd)}",
          file=sys.stderr)
    for d in diffs:
        print(f"  difference: {d}", file=sys.stderr)
    if args.dry_run:
        return {}
    logs = ROOT / args.runs / tag
    logs.mkdir(parents=True, exist_ok=True)
    row = {"method": cfg.method.name, "seed": args.seed, "epochs": args.epochs, "train_limit": args.train_limit,
           "width": args.width, "batch": args.batch, "threads": args.threads, "commit": _git(),
           "date": time.strftime("%Y-%m-%d %H:%M"), "set": list(args.set), "unmatched": unknown}
    if args.side in ("both", "kontrast"):
        summary, train_process = _run(train_cmd, logs / "kontrast-train.log", args.threads)
        scores, eval_wall = _run(eval_cmd, logs / "kontrast-eval.log", args.threads)
        row["kontrast"] = {"knn_top1": scores["knn_top1"], "img_per_s": summary["img_per_s"],
                           "train_wall_s": summary["wall_s"], "train_process_s": round(train_process, 1),
                           "eval_wall_s": round(eval_wall, 1),
                           "steps": summary["steps"], "final_loss": summary["final_loss"],
                           "train_subset_sha": kontrast_digest(cfg),
                           "command": shlex.join(train_cmd) + " && " + shlex.join(eval_cmd)}
        print(f"kontrast kNN {scores['knn_top1']:.4f}, {summary['img_per_s']} img/s", file=sys.stderr)
    earlier = earlier_peer(_rows(ROOT / args.results), peer_cmd) if args.reuse_peer and args.side == "both" else None
    if earlier:
        old, notes = earlier
        first_run = old["peer"].get("reused_from", f"{old['commit']}, {old['date']}")  # a reused row names the run
        row["peer"] = {**old["peer"], "command": shlex.join(peer_cmd), "reused_from": first_run}
        diffs += [d for d in notes if d not in diffs]
        print(f"peer kNN {old['peer']['knn_top1']:.4f}, from the run of {first_run}", file=sys.stderr)
    elif args.side in ("both", "peer"):
        res, peer_process = _run(peer_cmd, logs / "peer.log", args.threads)
        row["peer"] = {"knn_top1": res["knn_top1"], "img_per_s": res["img_per_s"], "train_wall_s": res["wall_s"],
                       "process_s": round(peer_process, 1),
                       "eval_wall_s": res["eval_s"], "steps": res["steps"], "final_loss": res["final_loss"],
                       "train_subset_sha": res["train_subset_sha"], "lightly": res["lightly"],
                       "command": shlex.join(peer_cmd)}
        diffs += [d for d in res["differences"] if d not in diffs]
        print(f"peer kNN {res['knn_top1']:.4f}, {res['img_per_s']} img/s", file=sys.stderr)
    row["differences"] = diffs
    if "kontrast" in row and "peer" in row:
        row["same_images"] = row["kontrast"]["train_subset_sha"] == row["peer"]["train_subset_sha"]
        row["gap"] = round(row["kontrast"]["knn_top1"] - row["peer"]["knn_top1"], 4)
    out = ROOT / args.results
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: row.get(k) for k in ("method", "seed", "gap", "same_images")}))
    return row


# ----------------------------------------------------------------------------------------------- table
def table(rows: list[dict]) -> str:
    """Markdown: one row per (method, budget), per-seed kNN of both sides, the mean gap; then the commands."""
    latest: dict = {}
    for r in rows:
        if "kontrast" in r and "peer" in r:
            latest[(r["method"], r["epochs"], r["train_limit"], r["width"], r["batch"], tuple(r.get("set", [])),
                    r["seed"])] = r
    groups: dict = {}
    for key, r in sorted(latest.items(),
                         key=lambda kv: (METHODS.index(kv[0][0]) if kv[0][0] in METHODS else 99, kv[0])):
        groups.setdefault(key[:-1], []).append(r)
    out = ["| method | images × epochs | seeds | kontrast kNN | peer kNN | gap (kontrast − peer) | kontrast img/s | "
           "peer img/s | same images |", "|---|---|---|---|---|---|---|---|---|"]
    notes, commands = {}, []
    for (method, epochs, limit, _, _, extra), rs in groups.items():
        def each(side: str, key: str, fmt: str) -> str:
            return " / ".join(format(r[side][key], fmt) for r in rs)

        gap = sum(r["gap"] for r in rs) / len(rs)
        label = f"`{method}`" + (f" ({', '.join(extra)})" if extra else "")
        seeds = " / ".join(str(r["seed"]) for r in rs)
        same = "yes" if all(r.get("same_images") for r in rs) else "NO"
        out.append(f"| {label} | {limit:,} × {epochs} | {seeds} | {each('kontrast', 'knn_top1', '.4f')} | "
                   f"{each('peer', 'knn_top1', '.4f')} | {gap:+.4f} | {each('kontrast', 'img_per_s', '.0f')} | "
                   f"{each('peer', 'img_per_s', '.0f')} | {same} |")
        for r in rs:
            for d in r.get("differences", []):
                notes.setdefault(d, []).append(method)
        first = rs[0]
        reused = first["peer"].get("reused_from")
        reused = f"; the peer's result from the run of {reused}" if reused else ""
        commands += [f"    # {method}, seed {first['seed']} ({first['commit']}, {first['date']}{reused})",
                     f"    {first['kontrast']['command']}", f"    {first['peer']['command']}"]
    lines = out + ["", "Settings lightly cannot match (method: what differs):", ""]
    lines += [f"- {', '.join(dict.fromkeys(ms))}: {d}" for d, ms in notes.items()] or ["- none"]
    lines += ["", "The commands behind each row's first seed (benchmarks/parity.py runs both; the others differ "
              "only in the seed):", ""] + commands
    return "\n".join(lines)


BEGIN, END = "<!-- parity:begin (benchmarks/parity.py --table --write-doc) -->", "<!-- parity:end -->"


def write_doc(path: Path, text: str) -> None:
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path} has no parity section markers ({BEGIN} ... {END})")
    head, rest = doc.split(BEGIN, 1)
    path.write_text(head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=".venv/bin/python benchmarks/parity.py", description=__doc__.splitlines()[0])
    p.add_argument("--method", choices=METHODS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--train-limit", type=int, default=20000, help="training images (kontrast's data.limit)")
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a kontrast config override, applied to both sides (e.g. optim.warmup_epochs=1)")
    p.add_argument("--data", default=os.environ.get("PEER_CIFAR10", "runs/peer/data/cifar10"),
                   help="extracted CIFAR-10 (train/, test/) both sides read (env PEER_CIFAR10)")
    p.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON", "runs/peer/venv/bin/python"),
                   help="python of the peer's venv (env PEER_PYTHON; benchmarks/setup_peer.sh)")
    p.add_argument("--runs", default="runs/parity", help="run directories and logs")
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--side", choices=["both", "kontrast", "peer"], default="both")
    p.add_argument("--reuse-peer", action="store_true",
                   help="take the peer's result from an earlier row of --results whose peer command computes the "
                        "same thing (recorded as reused_from), instead of training the peer again")
    p.add_argument("--dry-run", action="store_true", help="print both commands and the differences, run nothing")
    p.add_argument("--allow-unmatched", action="store_true", help="run even if a config field cannot be passed")
    p.add_argument("--peer-lars-clip", action="store_true",
                   help="peer: emulate kontrast's clipped LARS (not lightly's)")
    p.add_argument("--peer-stem-relu", action="store_true", help="peer: keep the stem ReLU lightly's idiom drops")
    p.add_argument("--peer-extra", action="append", default=[], metavar="ARG",
                   help="extra argument for the peer script (repeat), e.g. --peer-extra=--knn-max-train=2000")
    p.add_argument("--table", action="store_true", help="print the markdown table of --results")
    p.add_argument("--write-doc", metavar="MD", help="with --table: replace the parity section of this file")
    return p


def _rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.table:
        text = table(_rows(ROOT / args.results))
        try:
            print(text)
        except BrokenPipeError:  # e.g. piped into head
            sys.stderr.close()
        if args.write_doc:
            write_doc(ROOT / args.write_doc, text)
        return 0
    if not args.method:
        raise SystemExit("--method is required (or --table)")
    if not args.dry_run and not Path(ROOT / args.peer_python).exists() and not Path(args.peer_python).exists():
        raise SystemExit(f"peer python {args.peer_python} not found: run benchmarks/setup_peer.sh")
    run_pair(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
