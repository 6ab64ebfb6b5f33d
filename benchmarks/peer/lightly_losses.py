"""Peer side of benchmarks/loss_parity.py: lightly 1.6's losses on the inputs kontrast's side saved.

Runs in the peer's own virtual environment (benchmarks/setup_peer.sh: torch, lightly==1.6.0), never in kontrast's:

    PEER/bin/python benchmarks/peer/lightly_losses.py INPUTS.pt OUTPUTS.pt

For each case in INPUTS.pt (float64 tensors) it computes lightly's loss and its gradient with respect to every
input marked as differentiable, and saves ``{case: {"loss": float, "grads": {name: tensor}}}`` to OUTPUTS.pt.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from lightly.data.ijepa_collate import IJEPAMaskCollator
from lightly.loss import IBOTPatchLoss, KoLeoLoss, MMCRLoss
from lightly.loss.lejepa_loss import LeJEPALoss
from lightly.models import utils


def mmcr(case: dict) -> torch.Tensor:
    return MMCRLoss(lmda=case["local_weight"])(case["online"], case["momentum"])


def koleo(case: dict) -> torch.Tensor:
    return KoLeoLoss()(case["x"])


def ibot_patch(case: dict) -> torch.Tensor:
    loss = IBOTPatchLoss(output_dim=case["teacher"].shape[1], teacher_temp=case["teacher_temp"],
                         student_temp=case["student_temp"]).double()
    return loss(case["teacher"], case["student"], case["mask"])  # its centre starts at zero


def lejepa(case: dict) -> torch.Tensor:
    loss = LeJEPALoss(lambda_param=case["weight"], sigreg_knots=case["knots"], sigreg_t_max=case["t_max"],
                      sigreg_num_vectors=case["directions"])
    torch.manual_seed(case["seed"])  # lightly draws its directions from the global generator, in the inputs' dtype
    return loss(local_proj=case["local"], global_proj=case["global"])


def mae(case: dict) -> torch.Tensor:
    """lightly's MAE example: the masked patches of patchify's images, with normalize_mean_var for the normalised
    pixel target, against the decoder's prediction by an MSE."""
    target = utils.get_at_index(utils.patchify(case["images"], case["patch"]), case["masked"])
    if case["norm_pix"]:
        target = utils.normalize_mean_var(target)
    return F.mse_loss(case["prediction"], target)


def block_sizes(case: dict) -> torch.Tensor:
    """IJEPAMaskCollator's block sizes from one generator, each (scale, aspect) drawn ``draws`` times per grid."""
    g, sizes = torch.Generator().manual_seed(case["seed"]), []
    for h, w in case["grids"]:
        collator = IJEPAMaskCollator(input_size=(h, w), patch_size=1)
        for scale, aspect in case["shapes"]:
            sizes += [collator._sample_block_size(g, scale, aspect) for _ in range(case["draws"])]
    return torch.tensor(sizes, dtype=torch.float64)


LOSSES = {"mmcr": mmcr, "koleo": koleo, "ibot_patch": ibot_patch, "lejepa": lejepa, "mae": mae,
          "block_sizes": block_sizes}


def main(inputs: str, outputs: str) -> None:
    cases, results = torch.load(inputs), {}
    for name, case in cases.items():
        case = {k: v.clone().requires_grad_(k in case["differentiable"]) if torch.is_tensor(v) else v
                for k, v in case.items()}
        loss = LOSSES[case["loss"]](case)
        if not case["differentiable"]:  # numbers to compare one by one (block sizes)
            results[name] = {"loss": loss, "grads": {}}
            continue
        loss.backward()
        results[name] = {"loss": float(loss.detach()), "grads": {k: case[k].grad for k in case["differentiable"]}}
    torch.save(results, outputs)


if __name__ == "__main__":
    main(*sys.argv[1:3])
