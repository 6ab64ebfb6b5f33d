"""MAE (kontrast/methods/mae.py): the step's loss is the paper's masked pixel loss, recomputed with the float64
reference from the method's own encoder and decoder (value and gradient); the masks are the paper's per-sample
shuffle, drawn for the global batch from the step's seed, so every rank takes its rows of the same draw; a ViT only."""

import pytest
import torch

from kontrast.augment import make_views
from kontrast.decisions import decide, view_specs
from kontrast.errors import UserError
from kontrast.methods.base import Ranks
from kontrast.methods.build import create_method, resolve
from support.args import TINY_VIT
from support.reference import naive_mae
from support.steps import RankOfTwo

DECODER = {"decoder_dim": 32, "decoder_depth": 1, "decoder_heads": 2}


def _method(**params):
    cfg = resolve({"method": {"name": "mae", **DECODER, **params}, "encoder": TINY_VIT})
    return cfg, create_method(cfg, num_samples=8)


@pytest.mark.parametrize("norm_pix", [True, False])
def test_the_step_is_the_papers_masked_pixel_loss(norm_pix):
    cfg, method = _method(norm_pix_loss=norm_pix)
    method = method.double()
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    x = make_views(images, view_specs(cfg), torch.Generator().manual_seed(0))[0].double()  # [8, 3, 32, 32]
    torch.manual_seed(5)  # the step's seed, as the training room sets it
    loss = method.training_step([x], torch.arange(8))["loss"]

    order = torch.rand(8, 64, generator=torch.Generator().manual_seed(5)).argsort(dim=1)  # [8, 64] 4-px patches
    keep, masked = order[:, :16], order[:, 16:]  # 75 % masked: 48 of 64
    tokens = method.encoder.forward_tokens(x, keep=keep)[0]  # [8, 1 + 16, D]
    prediction = method.decoder(tokens[:, 1:], keep, masked, (8, 8))  # [8, 48, 4·4·3]
    expected = naive_mae(prediction, x, masked, 4, norm_pix)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    names, params = zip(*[(n, p) for n, p in method.named_parameters() if p.requires_grad])
    ours, theirs = torch.autograd.grad(loss, params), torch.autograd.grad(expected, params)
    for name, a, b in zip(names, ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=name)
    grads = dict(zip(names, ours))
    assert grads["encoder.conv_proj.weight"].abs().sum() > 0 and grads["decoder.mask_token"].abs().sum() > 0


def test_masks_are_drawn_alike_on_every_rank_and_mask_the_ratio():
    method = _method()[1]
    torch.manual_seed(7)
    keep, masked = method._masks(8, 64)  # one process, the global batch of 8
    for rank in (0, 1):
        method.ranks = RankOfTwo(rank)
        torch.manual_seed(7)  # every rank's step seed is the same
        own_keep, own_masked = method._masks(4, 64)  # this rank's 4 images
        assert torch.equal(own_keep, keep[4 * rank:4 * rank + 4]) and torch.equal(own_masked, masked[4 * rank:][:4])
    assert keep.shape == (8, 16) and masked.shape == (8, 48)  # 75 % of each image's patches
    every = torch.cat([keep, masked], dim=1).sort(dim=1).values
    assert torch.equal(every, torch.arange(64).expand(8, -1))  # a shuffle of the patches: each kept or masked once
    assert len({tuple(row.sort().values.tolist()) for row in masked}) == 8  # a mask per image
    torch.manual_seed(8)
    method.ranks = Ranks()
    assert not torch.equal(method._masks(8, 64)[1], masked)  # and a new one each step
    ninety = _method(mask_ratio=0.9)[1]
    assert [t.shape[1] for t in ninety._masks(2, 10)] == [1, 9]  # floor(10 x (1 - 0.9)) = 1, not 0 by rounding


def test_mae_needs_a_vit_and_defaults_to_the_papers_recipe():
    with pytest.raises(UserError, match="mae works on patch tokens and needs a ViT encoder, not resnet18"):
        decide(resolve({"method": {"name": "mae"}, "encoder": {"name": "resnet18"}}))
    cfg = resolve({"method": {"name": "mae"}})
    o, p = cfg.optim, cfg.method.params
    assert cfg.encoder.name == "vit_small"
    assert (o.name, o.lr, o.lr_batch, o.betas, o.weight_decay, o.warmup_epochs) == \
        ("adamw", 1.5e-4, 256, (0.9, 0.95), 0.05, 40.0)
    assert (p.mask_ratio, p.decoder_dim, p.decoder_depth, p.decoder_heads, p.norm_pix_loss) == (0.75, 512, 8, 16, True)
    (view,) = view_specs(cfg)  # one view: crop from 20 % and flip, no colour
    assert (view.crop_scale, view.flip_p, view.jitter_p, view.gray_p, view.blur_p) == ((0.2, 1.0), 0.5, 0.0, 0.0, 0.0)
    large = decide(resolve({"method": {"name": "mae"}, "data": {"size": 96}}))
    assert large.recipe == "mae_imagenet" and large.views[0].mean == (0.485, 0.456, 0.406)
    with pytest.raises(UserError, match=r"method.decoder_dim \(30\) must be a multiple of 4 and of method.decoder_h"):
        resolve({"method": {"name": "mae", "decoder_dim": 30, "decoder_heads": 3}})
