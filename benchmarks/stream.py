"""The streaming data path against its targets (docs/lab/performance.md, "Streaming"), on this machine.

From the repository root, on a quiet machine (DIR: any folder outside the repository; PEER: the peer's venv python,
benchmarks/setup_peer.sh):

    kontrast make-shapes --out DIR/n10000 --n 10000 --size 256
    .venv/bin/python benchmarks/stream.py copies --data DIR/n10000 --times 10 --out DIR/n100000
    .venv/bin/python benchmarks/stream.py decode --data DIR/n10000 --peer-python PEER
    .venv/bin/python benchmarks/stream.py memory --data DIR/n10000,DIR/n100000
    .venv/bin/python benchmarks/stream.py train --data DIR/n10000 --peer-python PEER
    .venv/bin/python benchmarks/stream.py loader --data DIR/n10000 --peer-python PEER

- decode: one worker's images/s (1 thread, one process, two views per image) turning 256-px JPEGs into the
  SimCLR ImageNet recipe's crops at 96 and 224 px: kontrast's worker as shipped (PIL with JPEG draft mode where
  every crop allows it, else torchvision.io), then PIL alone (draft mode, and without it), torchvision.io alone
  (decode_jpeg + torchvision's resized_crop), and in the
  peer's venv its whole per-image pipeline (torchvision ImageFolder + PIL + lightly's SimCLRTransform: the target's
  reference) and its decode + two RandomResizedCrops alone (the same work as kontrast's worker).
- memory: the peak proportional set size (PSS: shared pages counted once) of the whole process tree, DataLoader
  workers included, of a streaming run and of a memory-path run on each folder, stopped after --steps steps.
- train: end-to-end images/s of SimCLR (ResNet-18, ImageNet stem, 96 px, batch 128, 2 workers) against the
  peer's ../shared/bench/lightly_simclr.py --size 96 --stem imagenet on the same folder.
- loader: the same data path with no model (2 workers, batch 128, 96 px): kontrast's batches plus the rest of the
  recipe run on the CPU, against the peer's DataLoader over ImageFolder with SimCLRTransform.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from distributed import _pss_mib, _tree  # benchmarks/distributed.py: a process tree and its PSS (shared pages once)

ROOT = Path(__file__).resolve().parents[1]
PEER_SCRIPT = ROOT.parent / "shared" / "bench" / "lightly_simclr.py"
DECODE_PEER = ROOT / "benchmarks" / "peer" / "decode_peer.py"


def copies(args) -> None:
    """A folder of ``times`` x the source's files (distinct names, byte copies): a larger set with the same images."""
    src, out = Path(args.data), Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists; remove it or choose another --out")
    for path in sorted(src.rglob("*.jpg")):
        rel = path.relative_to(src)
        (out / rel.parent).mkdir(parents=True, exist_ok=True)
        for k in range(args.times if rel.parts[0] == "train" else 1):
            shutil.copyfile(path, out / rel.parent / f"{path.stem}-{k}{path.suffix}")
    print(json.dumps({"out": str(out), "train": len(list((out / "train").rglob("*.jpg")))}))


# ----------------------------------------------------------------------------------------------------- decode
def _rate(fn, n: int, seconds: float, batch: int) -> float:
    """Images per second of ``fn(items)`` on batches of ``batch`` samples 0, 1, ... (a DataLoader worker's batched
    fetch) for about ``seconds``, after one warm-up batch."""
    fn([(0, i % n) for i in range(batch)])
    start, done = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        fn([(0, (done + i) % n) for i in range(batch)])
        done += batch
    return done / (time.perf_counter() - start)


def tv_io_crops(data: bytes, boxes: torch.Tensor, specs) -> list[torch.Tensor] | str:
    """kontrast's decode_crops with torchvision.io: decode_jpeg (full scale: it has no draft mode), then each box
    resized by torchvision's antialiased resized_crop of the uint8 tensor."""
    import torchvision.transforms.v2.functional as TF
    from torchvision.io import ImageReadMode, decode_jpeg

    image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)  # [3, H, W]
    return [TF.resized_crop(image, *map(int, b.tolist()), [s.size, s.size], antialias=True)
            for b, s in zip(boxes, specs)]


def decode(args) -> None:
    from kontrast.augment import native_recipe, recipe_views
    from kontrast.data import stream_dataset, stream_decode
    from kontrast.data.stream_source import open_stream

    torch.set_num_threads(1)  # as in a DataLoader worker
    source = open_stream(args.data)
    n, pil_crops = len(source), stream_dataset.decode_crops
    for size in map(int, args.sizes.split(",")):
        specs = recipe_views(native_recipe("simclr_cifar", size), size)
        views = stream_dataset.StreamViews(source, specs, seed=0)
        row = {"data": args.data, "size": size, "recipe": native_recipe("simclr_cifar", size)}
        row["kontrast"] = _rate(views.__getitems__, n, args.seconds, args.batch)  # as shipped: draft-mode PIL or tv.io
        stream_decode.FULL_SCALE_JPEG = "pil"
        row["pil_draft_only"] = _rate(views.__getitems__, n, args.seconds, args.batch)
        stream_decode.MAX_DRAFT, draft = 1, stream_decode.MAX_DRAFT
        row["pil_no_draft"] = _rate(views.__getitems__, n, args.seconds, args.batch)
        stream_decode.MAX_DRAFT, stream_decode.FULL_SCALE_JPEG = draft, "torchvision"
        stream_dataset.decode_crops = tv_io_crops  # the same boxes, headers and batching; another decoder
        row["torchvision_io_only"] = _rate(views.__getitems__, n, args.seconds, args.batch)
        stream_dataset.decode_crops = pil_crops
        if args.peer_python:
            for name, extra in (("peer_imagefolder_simclrtransform", []),
                                ("peer_imagefolder_crops_only", ["--crop-only"])):
                out = subprocess.run([args.peer_python, str(DECODE_PEER), "--data", args.data, "--size", str(size),
                                      "--seconds", str(args.seconds), *extra],
                                     capture_output=True, text=True, check=True)
                row[name] = json.loads(out.stdout.strip().splitlines()[-1])["img_per_s"]
            row["kontrast_vs_peer"] = row["kontrast"] / row["peer_imagefolder_simclrtransform"]
            row["kontrast_vs_peer_crops_only"] = row["kontrast"] / row["peer_imagefolder_crops_only"]
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


# ----------------------------------------------------------------------------------------------------- loader
def loader(args) -> None:
    """The data path alone, as training drives it (2 workers, batch 128, 96 px, no model): kontrast's batches and
    the rest of the recipe on the CPU in the training process, against the peer's DataLoader over ImageFolder with
    lightly's SimCLRTransform (benchmarks/peer/decode_peer.py --loader)."""
    import kontrast
    from kontrast.augment import derive_key, key_tensor, native_recipe, recipe_views, view_maker
    from kontrast.train.data_path import epoch_batches, load_train_data

    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    cfg = kontrast.resolve({"method": {"name": "simclr"}, "data": {"source": args.data, "size": 96, "mode": "stream",
                            "workers": 2, "limit": (args.steps + 2) * args.batch},
                            "train": {"batch_size": args.batch, "epochs": 1}})
    specs = recipe_views(native_recipe("simclr_cifar", 96), 96)
    make, key = view_maker(specs, cropped=True), key_tensor(derive_key("augment", 0, 0))
    batches = epoch_batches(load_train_data(cfg, cpu, ""), cfg, specs, 0, 0, 1, cpu)
    for step, (_, _, idx, batch) in enumerate(batches):
        if step == 2:  # the workers have started and filled their prefetch
            start = time.perf_counter()
        make(batch.views, idx, key)
        if step == args.steps + 1:
            break
    rate = args.steps * args.batch / (time.perf_counter() - start)
    batches.close()
    row = {"side": "kontrast", "img_per_s": round(rate, 1), "steps": args.steps, "batch": args.batch}
    print(json.dumps(row), flush=True)
    if args.peer_python:
        out = subprocess.run([args.peer_python, str(DECODE_PEER), "--data", args.data, "--size", "96", "--loader",
                              "--steps", str(args.steps), "--batch", str(args.batch), "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True)
        peer = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps({"side": "peer", **peer, "ratio_kontrast_over_peer": round(rate / peer["img_per_s"], 2)}))


# ----------------------------------------------------------------------------------------------------- memory
def train_command(data: str, out: Path, *, mode: str, batch: int, workers: int, threads: int) -> list[str]:
    return [sys.executable, "-m", "kontrast.cli", "train", "--method", "simclr", "--data", data, "--epochs", "1",
            "--batch-size", str(batch), "--out", str(out), "--overwrite", "--no-progress",
            "--set", f"data.mode={mode}", "--set", "data.size=96", "--set", "encoder.stem=imagenet",
            "--set", "encoder.width=1", "--set", f"data.workers={workers}", "--set", f"train.num_threads={threads}",
            "--set", "train.log_every=5",
            "--set", "train.device=cpu"]


def measure(cmd: list[str], log: Path, env: dict | None = None) -> dict:
    """Run ``cmd``; its exit code, wall seconds and the peak PSS of its process tree (polled every 0.1 s)."""
    start, peak = time.perf_counter(), 0.0
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        while proc.poll() is None:
            peak = max(peak, sum(map(_pss_mib, _tree(proc.pid))))
            time.sleep(0.1)
    return {"exit": proc.returncode, "wall_s": round(time.perf_counter() - start, 1), "peak_pss_mib": round(peak)}


def memory(args) -> None:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    stop = {"KONTRAST_FAULTS": f"signal_after_step={args.steps},signal=TERM"}  # the run checkpoints and exits 143
    for data in args.data.split(","):
        for mode in ("stream", "memory"):
            cmd = train_command(data, work / f"{Path(data).name}-{mode}", mode=mode, batch=args.batch,
                                workers=2, threads=args.threads)
            row = measure(cmd, work / f"{Path(data).name}-{mode}.log", stop)
            lines = (work / f"{Path(data).name}-{mode}.log").read_text().splitlines()
            row.update(data=data, mode=mode, steps=args.steps, first_line=next((x for x in lines if x.startswith(
                "data:")), ""), command=f"KONTRAST_FAULTS={stop['KONTRAST_FAULTS']} kontrast " + " ".join(cmd[3:]))
            print(json.dumps(row), flush=True)


# ----------------------------------------------------------------------------------------------------- train
def train(args) -> None:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    for rep in range(args.repeats):
        out = work / f"ours-{rep}"
        cmd = train_command(args.data, out, mode="stream", batch=args.batch, workers=2, threads=args.threads)
        cmd += ["--set", f"data.limit={args.steps * args.batch}"]
        row = measure(cmd, work / f"ours-{rep}.log")
        summary = json.loads((out / "summary.json").read_text())
        rates = [json.loads(x).get("img_per_s") for x in (out / "metrics.jsonl").read_text().splitlines()]
        rates = [r for r in rates if r]
        ours = {"side": "kontrast", **row, "img_per_s": summary["img_per_s"],
                "img_per_s_steady": round(sum(rates[1:]) / max(1, len(rates[1:])), 1),
                "command": "kontrast " + " ".join(cmd[3:])}
        print(json.dumps(ours), flush=True)
        if args.peer_python:
            peer_cmd = [args.peer_python, str(PEER_SCRIPT), "--data", args.data, "--size", "96", "--stem", "imagenet",
                        "--steps", str(args.steps), "--batch", str(args.batch), "--workers", "2",
                        "--threads", str(args.threads)]
            row = measure(peer_cmd, work / f"peer-{rep}.log")
            res = json.loads((work / f"peer-{rep}.log").read_text().strip().splitlines()[-1])
            print(json.dumps({"side": "peer", **row, "img_per_s_wall": round(res["img_per_s_wall"], 1),
                              "img_per_s_compute": round(res["img_per_s_compute"], 1),
                              "ratio_kontrast_over_peer": round(ours["img_per_s"] / res["img_per_s_wall"], 3),
                              "ratio_steady_over_peer_compute":
                                  round(ours["img_per_s_steady"] / res["img_per_s_compute"], 3),
                              "command": " ".join(peer_cmd)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("copies")
    c.add_argument("--data", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--times", type=int, default=10)
    d = sub.add_parser("decode")
    d.add_argument("--data", required=True, help="a folder of JPEGs (train/ is read)")
    d.add_argument("--sizes", default="96,224")
    d.add_argument("--seconds", type=float, default=15.0)
    d.add_argument("--batch", type=int, default=32, help="samples per fetch (a worker's share of a batch)")
    d.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON"))
    for name in ("memory", "train", "loader"):
        s = sub.add_parser(name)
        s.add_argument("--data", required=True)
        s.add_argument("--steps", type=int, default=10 if name == "memory" else 20)
        s.add_argument("--batch", type=int, default=128)
        s.add_argument("--threads", type=int, default=2)
        s.add_argument("--workdir", default=str(ROOT / "runs" / "bench-stream"))
        s.add_argument("--peer-python", default=os.environ.get("PEER_PYTHON"))
        s.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    {"copies": copies, "decode": decode, "memory": memory, "train": train, "loader": loader}[args.what](args)


if __name__ == "__main__":
    main()
