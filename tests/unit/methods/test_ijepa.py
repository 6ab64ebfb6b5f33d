"""I-JEPA (kontrast/methods/ijepa.py): the step's loss is the paper's, recomputed with the float64 reference from the
method's own networks with one predictor pass per image and block (value and gradient); the multi-block masks are
drawn for the global batch from the step's seed, so every rank takes its rows of the same draw, and have the paper's
shapes; the target encoder follows the context encoder on the authors' linear momentum schedule; a ViT only."""

import pytest
import torch

from kontrast.augment import make_views
from kontrast.decisions import decide, view_specs
from kontrast.encoders.masking import block_size, context_and_targets
from kontrast.errors import UserError
from kontrast.methods.base import Progress, Ranks
from kontrast.methods.build import create_method, resolve
from support.args import TINY_VIT
from support.reference import naive_ijepa
from support.steps import RankOfTwo

PREDICTOR = {"predictor_dim": 32, "predictor_depth": 1, "predictor_heads": 2, "min_context": 4}


def _method(**params):
    cfg = resolve({"method": {"name": "ijepa", **PREDICTOR, **params}, "encoder": TINY_VIT})
    return cfg, create_method(cfg, num_samples=8)


@pytest.mark.parametrize("loss", ["l2", "smooth_l1"])
def test_the_step_is_the_papers_latent_prediction_loss(loss):
    cfg, method = _method(loss=loss)
    method = method.double()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    x = make_views(images, view_specs(cfg), torch.Generator().manual_seed(0))[0].double()  # [4, 3, 32, 32]
    with torch.no_grad():  # the target encoder apart from the context encoder, as after some steps
        for p in method.target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    torch.manual_seed(5)  # the step's seed, as the training room sets it
    out = method.training_step([x], torch.arange(4))

    context, targets = context_and_targets(4, (8, 8), torch.Generator().manual_seed(5), min_context=4)
    tokens = method.target.net.forward_tokens(x)[0][:, 1:]  # [4, 64, D] every patch, no masking
    predictions = []
    for b in range(4):  # one context encoder pass per image, one predictor pass per target block
        z = method.encoder.forward_tokens(x[b:b + 1], keep=context[b:b + 1])[0][:, 1:]  # [1, n, D]
        predictions.append([method.predictor(z, context[b:b + 1], targets[b:b + 1, i], (8, 8))[0]
                            for i in range(targets.shape[1])])  # M x [k, D]
    expected = naive_ijepa(predictions, tokens, targets, loss)
    # float64 rounding alone: both sides sum the same T = b·M·k·D errors (each gradient entry too) in other orders and
    # batchings; recursive summation of T terms is within T·eps of the largest (tests/support/collectives.py, near)
    bound = targets.numel() * tokens.shape[-1] * torch.finfo(torch.float64).eps  # 4·4·k·D terms: about 1e-12
    assert out["loss"].item() == pytest.approx(expected.item(), rel=bound)
    names, params = zip(*[(n, p) for n, p in method.named_parameters() if p.requires_grad])
    ours, theirs = torch.autograd.grad(out["loss"], params), torch.autograd.grad(expected, params)
    for name, a, b in zip(names, ours, theirs):
        assert (a - b).abs().max() <= bound * b.abs().max(), name
    grads = dict(zip(names, ours))
    assert grads["encoder.conv_proj.weight"].abs().sum() > 0 and grads["predictor.mask_token"].abs().sum() > 0
    assert not any(name.startswith("target.") for name in names)  # the target encoder takes no gradient


def test_masks_are_drawn_alike_on_every_rank():
    method = _method()[1]
    torch.manual_seed(7)
    context, targets = method._masks(8, (8, 8))  # one process, the global batch of 8
    for rank in (0, 1):
        method.ranks = RankOfTwo(rank)
        torch.manual_seed(7)  # every rank's step seed is the same
        own_context, own_targets = method._masks(4, (8, 8))  # this rank's 4 images
        assert torch.equal(own_context, context[4 * rank:][:4]) and torch.equal(own_targets, targets[4 * rank:][:4])
    torch.manual_seed(8)
    method.ranks = Ranks()
    assert not torch.equal(method._masks(8, (8, 8))[1], targets)  # and new ones each step


def test_the_masks_are_the_papers_blocks():
    """On ImageNet's 14x14 grid: four target blocks of one size per batch, 15-20 % of the patches each at aspect
    0.75-1.5, each a rectangle; a context of equal size for every image, outside every target, more than 10 patches."""
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        context, targets = context_and_targets(16, (14, 14), g)
        b, m, k = targets.shape
        assert m == 4 and int(0.15 * 196) - 14 <= k <= int(0.2 * 196) + 14 and context.shape[1] > 10
        for image in range(b):
            for block in targets[image]:
                rows, cols = block // 14, block % 14
                height, width = int(rows.max() - rows.min()) + 1, int(cols.max() - cols.min()) + 1
                assert height * width == k and 0.6 <= height / width <= 1.8  # a filled rectangle, rounded aspect
            assert not set(context[image].tolist()) & set(targets[image].flatten().tolist())  # disjoint
            assert context[image].unique().numel() == context.shape[1]  # distinct patches
    assert block_size((14, 14), (1.0, 1.0), (1.0, 1.0), g) == (13, 13)  # the authors' blocks stay below the grid
    tiny_context, tiny_targets = context_and_targets(4, (2, 2), g)  # a grid too small to keep targets out: no hang
    assert tiny_context.shape[1] >= 1 and tiny_targets.shape == (4, 4, 1)


def test_the_target_encoder_follows_linearly_from_ema_start_to_ema_end():
    method = _method(ema_start=0.9, ema_end=1.0)[1]
    before = method.target.net.conv_proj.weight.clone()
    with torch.no_grad():
        method.encoder.conv_proj.weight.add_(1.0)
    method.after_step({}, Progress(step=5, epoch=0, total_steps=10, steps_per_epoch=10))  # m = 0.95
    torch.testing.assert_close(method.target.net.conv_proj.weight, before + 0.05)
    method.after_step({}, Progress(step=10, epoch=0, total_steps=10, steps_per_epoch=10))  # m = 1: unchanged
    torch.testing.assert_close(method.target.net.conv_proj.weight, before + 0.05)


def test_ijepa_needs_a_vit_and_defaults_to_the_papers_recipe():
    with pytest.raises(UserError, match="ijepa works on patch tokens and needs a ViT encoder, not resnet18"):
        decide(resolve({"method": {"name": "ijepa"}, "encoder": {"name": "resnet18"}}))
    cfg = resolve({"method": {"name": "ijepa"}})
    o, p = cfg.optim, cfg.method.params
    assert (cfg.encoder.name, cfg.encoder.pool) == ("vit_small", "mean")
    assert (o.name, o.lr, o.lr_batch, o.warmup_epochs, o.weight_decay, o.weight_decay_end) == \
        ("adamw", 1e-3, 2048, 40.0, 0.04, 0.4)
    assert (p.predictor_dim, p.predictor_depth, p.targets, p.ema_start, p.ema_end, p.loss) == \
        (384, 12, 4, 0.996, 1.0, "l2")
    (view,) = view_specs(cfg)  # one view: a crop from 30 %, no flip, no colour
    assert (view.crop_scale, view.flip_p, view.jitter_p, view.gray_p, view.blur_p) == ((0.3, 1.0), 0.0, 0.0, 0.0, 0.0)
    large = decide(resolve({"method": {"name": "ijepa"}, "data": {"size": 96}}))
    assert large.recipe == "ijepa_imagenet" and large.views[0].mean == (0.485, 0.456, 0.406)
    with pytest.raises(UserError, match=r"method.predictor_dim \(30\) must be a multiple of 4 and of method.predict"):
        resolve({"method": {"name": "ijepa", "predictor_dim": 30, "predictor_heads": 3}})
    with pytest.raises(UserError, match=r"method.target_scale_min \(0.3\) is above method.target_scale_max"):
        resolve({"method": {"name": "ijepa", "target_scale_min": 0.3}})
