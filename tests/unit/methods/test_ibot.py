"""iBOT with KoLeo (kontrast/methods/ibot.py): the step's loss is DINO's class-token loss, the masked-patch loss and
KoLeo, recomputed here from the method's own tokens with the reference formulas; masks from the step's seed; a ViT
only."""

import pytest
import torch

from kontrast.augment import make_views
from kontrast.decisions import decide, view_specs
from kontrast.encoders.masking import batch_masks
from kontrast.errors import UserError
from kontrast.losses.swav import sinkhorn, swapped_prediction
from kontrast.methods.build import create_method, resolve
from support.args import TINY_VIT
from support.reference import naive_ibot_patch, naive_koleo


def test_the_step_is_dino_plus_the_masked_patch_loss_plus_koleo():
    cfg = resolve({"method": {"name": "ibot", "proj_hidden": 32, "bottleneck_dim": 16, "num_prototypes": 24,
                              "mask_probability": 1.0, "freeze_last_layer_epochs": 0},
                   "encoder": TINY_VIT, "augment": {"views": 3}})
    method = create_method(cfg, num_samples=8)
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    views = make_views(images, view_specs(cfg), torch.Generator().manual_seed(0))
    torch.manual_seed(5)  # the step's seed, as the training room sets it
    out = method.training_step(views, torch.arange(8))

    masks = batch_masks(16, (8, 8), torch.Generator().manual_seed(5), 1.0, (0.1, 0.5))  # [2B, N] both global crops
    assert out["masked_share"].item() == pytest.approx(masks.float().mean().item())
    p, tau_t = method.params, 0.04  # the first step of tau_t's warm-up
    with torch.no_grad():
        student = method.encoder.forward_tokens(torch.cat(views[:2]), masks, method.mask_token)[0]  # [16, 1+N, D]
        local = method.encoder(views[2])  # [8, D]
        s = method.head(torch.cat([student[:, 0], local])).view(3, 8, -1)  # [V, B, K]
        s_patch = method.head(student[:, 1:][masks])  # [M, K]
        teacher = method.target.net[0].forward_tokens(torch.cat(views[:2]))[0]
        q_cls = sinkhorn(method.target.net[1](teacher[:, 0]), tau_t, 3).view(2, 8, -1)
        q_patch = sinkhorn(method.target.net[1](teacher[:, 1:][masks]), tau_t, 3)
    dino = swapped_prediction(s, q_cls, p.student_temp)
    ibot = naive_ibot_patch(s_patch.double(), q_patch.double(), masks, p.student_temp)
    spread = sum(naive_koleo(c.double()) for c in student[:, 0].split(8))
    assert out["dino"].item() == pytest.approx(dino.item(), rel=1e-5)
    assert out["ibot"].item() == pytest.approx(ibot.item(), rel=1e-5)
    assert out["koleo"].item() == pytest.approx(spread.item(), rel=1e-5)
    assert out["loss"].item() == pytest.approx((dino + ibot + 0.1 * spread).item(), rel=1e-5)
    out["loss"].backward()
    assert method.mask_token.grad.abs().sum() > 0  # the student learns what a masked patch shows
    assert all(q.grad is None for q in method.target.parameters())


def test_ibot_needs_a_vit():
    with pytest.raises(UserError, match="ibot works on patch tokens and needs a ViT encoder, not resnet18"):
        decide(resolve({"method": {"name": "ibot"}, "encoder": {"name": "resnet18"}}))
    assert resolve({"method": {"name": "ibot"}}).encoder.name == "vit_small"  # its default encoder
