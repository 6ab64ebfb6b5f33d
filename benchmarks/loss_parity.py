"""kontrast's losses against lightly 1.6's on the same seeded inputs: MMCR, KoLeo, iBOT's masked-patch loss, LeJEPA
(SIGReg + invariance) and MAE's pixel loss (lightly's patchify, normalize_mean_var and an MSE), value and gradient,
float64; and I-JEPA's block sizes against lightly's IJEPAMaskCollator from the same generator (lightly 1.6 has no
I-JEPA loss: its example regresses layer-normalised target tokens inline).

Saves the inputs, runs benchmarks/peer/lightly_losses.py in the peer's own environment (benchmarks/setup_peer.sh),
computes kontrast's losses on the same inputs and prints each pair with the largest relative difference; exits 1
when one is above 1e-6. From the repository root:

    .venv/bin/python benchmarks/loss_parity.py --peer-python runs/peer/venv/bin/python

Where the two differ by construction the inputs avoid it: lightly's KoLeo adds eps 1e-8 to each coordinate of a
difference (torch's PairwiseDistance), kontrast to the distance; lightly's MMCR takes normalised embeddings, which
these are; lightly's iBOT loss centres the teacher with a running mean that starts at zero, so its targets equal
kontrast's ``softmax(teacher / tau_t)`` on the first call (kontrast's iBOT method gives Sinkhorn-Knopp codes instead).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from kontrast.encoders.masking import block_size
from kontrast.losses.capacity import manifold_capacity
from kontrast.losses.distillation import masked_patch_loss
from kontrast.losses.gaussian import lejepa_loss
from kontrast.losses.koleo import koleo
from kontrast.losses.reconstruction import masked_pixel_loss

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-6


def cases(seed: int) -> dict:
    """Seeded float64 inputs for every loss (the differentiable ones named)."""
    g = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    mask = torch.rand(6, 4, 4, generator=g) < 0.4  # [B, h, w] iBOT's masked patches
    mask[0] = False  # an image without a masked patch
    m = int(mask.sum())
    return {
        f"mmcr seed {seed}": {"loss": "mmcr", "online": F.normalize(randn(16, 4, 8), dim=-1),
                              "momentum": F.normalize(randn(16, 4, 8), dim=-1), "local_weight": 5e-3,
                              "differentiable": ["online", "momentum"]},
        f"mmcr no local term seed {seed}": {"loss": "mmcr", "online": F.normalize(randn(32, 2, 64), dim=-1),
                                            "momentum": F.normalize(randn(32, 2, 64), dim=-1), "local_weight": 0.0,
                                            "differentiable": ["online", "momentum"]},
        f"koleo seed {seed}": {"loss": "koleo", "x": randn(32, 16), "differentiable": ["x"]},
        f"ibot_patch seed {seed}": {"loss": "ibot_patch", "teacher": randn(m, 40), "student": randn(m, 40),
                                    "mask": mask, "teacher_temp": 0.04, "student_temp": 0.1,
                                    "differentiable": ["student"]},
        f"lejepa seed {seed}": {"loss": "lejepa", "global": randn(2, 24, 16), "local": randn(4, 24, 16),
                                "weight": 0.05, "knots": 17, "t_max": 3.0, "directions": 64, "seed": seed,
                                "differentiable": ["global", "local"]},
        f"mae seed {seed}": {"loss": "mae", "prediction": randn(4, 12, 48), "images": randn(4, 3, 16, 16),
                             "masked": torch.rand(4, 16, generator=g).argsort(dim=1)[:, 4:], "patch": 4,
                             "norm_pix": True, "differentiable": ["prediction", "images"]},
        f"mae raw pixels seed {seed}": {"loss": "mae", "prediction": randn(2, 48, 12), "images": randn(2, 3, 16, 16),
                                        "masked": torch.rand(2, 64, generator=g).argsort(dim=1)[:, 16:], "patch": 2,
                                        "norm_pix": False, "differentiable": ["prediction", "images"]},
        # the block sizes of I-JEPA's masks: (h, w) per draw, for the paper's targets and context on three grids
        f"ijepa block sizes seed {seed}": {"loss": "block_sizes", "seed": seed, "grids": [(4, 4), (8, 8), (14, 14)],
                                           "shapes": [((0.15, 0.2), (0.75, 1.5)), ((0.85, 1.0), (1.0, 1.0)),
                                                      ((0.2, 0.8), (0.3, 3.0))], "draws": 50,
                                           "differentiable": []},
    }


def ours(case: dict) -> torch.Tensor:
    """kontrast's loss for a case (its differentiable inputs require grad)."""
    kind = case["loss"]
    if kind == "mmcr":
        return manifold_capacity(torch.cat([case["online"], case["momentum"]], dim=1), case["local_weight"])
    if kind == "koleo":
        return koleo(case["x"])
    if kind == "ibot_patch":
        targets = torch.softmax(case["teacher"] / case["teacher_temp"], dim=1)  # [M, K]
        image = case["mask"].flatten(1).nonzero()[:, 0]  # [M] the image of each masked patch, mask order
        return masked_patch_loss(case["student"], targets, image, case["mask"].shape[0], case["student_temp"])
    if kind == "lejepa":
        g = torch.Generator().manual_seed(case["seed"])
        a = torch.randn(case["global"].shape[-1], case["directions"], generator=g, dtype=torch.float64)
        z = torch.cat([case["global"], case["local"]])  # [V, N, D] global views first
        return lejepa_loss(z, 2, a / a.norm(dim=0), case["weight"], case["t_max"], case["knots"])[0]
    if kind == "mae":
        return masked_pixel_loss(case["prediction"], case["images"], case["masked"], case["patch"], case["norm_pix"])
    if kind == "block_sizes":
        g = torch.Generator().manual_seed(case["seed"])
        return torch.tensor([block_size(grid, scale, aspect, g) for grid in case["grids"]
                             for scale, aspect in case["shapes"] for _ in range(case["draws"])], dtype=torch.float64)
    raise ValueError(kind)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", required=True, help="python of the peer's venv (benchmarks/setup_peer.sh)")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    inputs = {k: v for seed in range(args.seeds) for k, v in cases(seed).items()}
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(inputs, Path(tmp) / "inputs.pt")
        subprocess.run([args.peer_python, str(ROOT / "benchmarks/peer/lightly_losses.py"), str(Path(tmp) / "inputs.pt"),
                        str(Path(tmp) / "outputs.pt")], check=True)
        peer = torch.load(Path(tmp) / "outputs.pt")
    worst = 0.0
    print(f"{'case':32} {'kontrast':>14} {'lightly 1.6':>14} {'value rel':>10} {'grad rel':>10}")
    for name, case in inputs.items():
        case = {k: v.clone().requires_grad_(k in case["differentiable"]) if torch.is_tensor(v) else v
                for k, v in case.items()}
        loss, theirs = ours(case), peer[name]
        if not case["differentiable"]:  # integers (block sizes): every one equal, or the share that differs
            value = float((loss != theirs["loss"]).double().mean())
            worst = max(worst, value)
            print(f"{name:32} {'':14} {'':14} {value:10.1e} {'-':>10}  ({loss.numel()} numbers)")
            continue
        loss.backward()
        value = abs(float(loss.detach()) - theirs["loss"]) / max(abs(theirs["loss"]), 1e-12)
        grad = max(float((case[k].grad - theirs["grads"][k]).norm() / theirs["grads"][k].norm())
                   for k in case["differentiable"])
        worst = max(worst, value, grad)
        print(f"{name:32} {float(loss.detach()):14.8f} {theirs['loss']:14.8f} {value:10.1e} {grad:10.1e}")
    print(f"largest relative difference {worst:.1e} (tolerance {TOLERANCE:g}); command: "
          f".venv/bin/python benchmarks/loss_parity.py --peer-python {args.peer_python} --seeds {args.seeds}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
