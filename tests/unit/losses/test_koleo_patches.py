"""KoLeo and iBOT's masked-patch loss against the papers' formulas (float64, value and gradient), and the block
masks iBOT draws."""

import torch

from kontrast.encoders.masking import batch_masks, block_mask
from kontrast.losses.distillation import masked_patch_loss
from kontrast.losses.koleo import koleo
from support.reference import naive_ibot_patch, naive_koleo


def test_koleo_equals_the_formula_in_value_and_gradient():
    raw = torch.randn(10, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ours, ref = raw.clone().requires_grad_(), raw.clone().requires_grad_()
    loss, expected = koleo(ours), naive_koleo(ref)
    assert torch.allclose(loss, expected, rtol=1e-10)
    loss.backward()
    expected.backward()
    assert torch.allclose(ours.grad, ref.grad, rtol=1e-8, atol=1e-12)


def test_koleo_falls_as_points_spread():
    g = torch.Generator().manual_seed(1)
    clustered = torch.randn(1, 8, generator=g) + 0.05 * torch.randn(64, 8, generator=g)  # one tight cluster
    spread = torch.randn(64, 8, generator=g)
    assert koleo(spread) < koleo(clustered) - 1.0


def test_masked_patch_loss_equals_the_formula_in_value_and_gradient():
    g = torch.Generator().manual_seed(2)
    mask = torch.rand(5, 9, generator=g) < 0.4  # [B, N]
    mask[1] = False  # an image with nothing masked counts in B, adds nothing
    m = int(mask.sum())
    student = torch.randn(m, 7, generator=g, dtype=torch.float64)
    targets = torch.softmax(torch.randn(m, 7, generator=g, dtype=torch.float64) / 0.04, dim=1)
    ours, ref = student.clone().requires_grad_(), student.clone().requires_grad_()
    loss = masked_patch_loss(ours, targets, mask.nonzero()[:, 0], 5, 0.1)
    expected = naive_ibot_patch(ref, targets, mask, 0.1)
    assert torch.allclose(loss, expected, rtol=1e-10)
    loss.backward()
    expected.backward()
    assert torch.allclose(ours.grad, ref.grad, rtol=1e-8, atol=1e-12)


def test_block_masks_cover_about_their_share_in_rectangles_and_follow_the_generator():
    g = torch.Generator().manual_seed(3)
    mask = block_mask((14, 14), 60, g)
    assert 40 <= int(mask.sum()) <= 60  # grown to the count, never past it
    masks = batch_masks(16, (14, 14), torch.Generator().manual_seed(4), probability=0.5, ratio=(0.1, 0.5))
    counts = masks.sum(1)
    assert int((counts > 0).sum()) == 8  # half of the images masked
    assert counts.max() <= 0.5 * 196 and counts[counts > 0].min() >= 4  # BEiT's blocks: at least 4 patches
    assert torch.equal(masks, batch_masks(16, (14, 14), torch.Generator().manual_seed(4)))
