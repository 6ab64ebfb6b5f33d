"""Checksums of the final weights of short training runs: the bit-identity check of a refactor.

Trains each method (every registered one by default) for 20 steps on the built-in ``shapes`` data through the CLI
(one thread, fixed seed), then hashes every tensor of the last checkpoint's ``model.safetensors`` by name.
Run it at two commits and compare:

    python benchmarks/weights_checksum.py --out before.json            # at the old commit
    python benchmarks/weights_checksum.py --out after.json --compare before.json

A tensor present in both runs must hash the same; tensors present in one run only (a buffer
that was renamed or removed) are listed. Exit 1 when any shared tensor differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from safetensors.numpy import load_file


def all_methods() -> str:
    """Every registered method, comma-separated (the default: a refactor must hold for all of them)."""
    from kontrast.methods import METHODS

    return ",".join(METHODS.names())


def run(method: str, workdir: Path, steps: int, batch: int, precision: str) -> dict[str, str]:
    out = workdir / method
    data = f"{'sequences' if method == 'cpc' else 'shapes'}:{steps * batch}"
    cmd = [sys.executable, "-m", "kontrast.cli", "train", "--method", method, "--data", data,
           "--epochs", "1", "--batch-size", str(batch), "--out", str(out), "--no-progress",
           "--set", "encoder.width=0.25", "--set", "train.num_threads=1", "--set", "train.seed=0",
           "--set", "train.device=cpu", "--precision", precision, "--set", "train.channels_last=false"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    ckpt = sorted((out / "checkpoints").glob("step-*"))[-1]
    tensors = load_file(str(ckpt / "model.safetensors"))
    return {name: hashlib.sha256(t.tobytes()).hexdigest()[:16] for name, t in sorted(tensors.items())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", help="comma list (default: every registered method)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--out", required=True, help="JSON file for the checksums")
    p.add_argument("--compare", help="an earlier --out file to compare with")
    args = p.parse_args()
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in (args.methods or all_methods()).split(","):
            result[method] = run(method, Path(tmp), args.steps, args.batch, args.precision)
            whole = hashlib.sha256(json.dumps(result[method], sort_keys=True).encode()).hexdigest()[:16]
            print(f"{method:10s} {len(result[method])} tensors, checksum {whole}")
    Path(args.out).write_text(json.dumps(result, indent=1))
    if not args.compare:
        return 0
    before, bad = json.loads(Path(args.compare).read_text()), 0
    for method, sums in result.items():
        old = before.get(method, {})
        differ = [k for k in sums if k in old and sums[k] != old[k]]
        only = sorted(set(sums) ^ set(old))
        bad += bool(differ)
        print(f"{method:10s} {'IDENTICAL' if not differ else 'DIFFERS'}: {len(set(sums) & set(old))} shared tensors"
              + (f", differing: {', '.join(differ[:5])}" if differ else "")
              + (f"; in one run only: {', '.join(only)}" if only else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
