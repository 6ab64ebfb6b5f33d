"""SigLIP and SupCon (kontrast/methods/siglip.py, supcon.py): the loss on the method's own embeddings, the two-view
form, zero-shot only with a text tower; labels required."""

import pytest
import torch

from kontrast.augment import make_views
from kontrast.data import Samples
from kontrast.decisions import view_specs
from kontrast.errors import UserError
from kontrast.evaluate.zeroshot import supports_zeroshot
from kontrast.methods.build import create_method, resolve
from support.args import TINY_ENCODER
from support.reference import naive_siglip


def _step(raw: dict):
    cfg = resolve({"method": {"name": "siglip", **raw.get("method", {})}, "encoder": TINY_ENCODER,
                   **{k: v for k, v in raw.items() if k != "method"}})
    method = create_method(cfg, num_samples=8)
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    method.bind_data(Samples(images, torch.arange(8) % 2, ["cat", "dog"], "siglip"))
    views = make_views(images, view_specs(cfg), torch.Generator().manual_seed(0))
    return method, views, method.training_step(views, torch.arange(8))


def test_the_step_is_the_papers_loss_on_its_embeddings():
    """The method's loss equals eq. 1 written out (float64) on the same embeddings, temperature and bias, and starts
    at t = 10, b = -10 (Algorithm 1)."""
    method, views, out = _step({})
    x = method.encode_image(views[0]).double()  # [8, E] the same batch again: the same BN statistics
    y = method.encode_text(method.tokens[torch.arange(8)]).double()  # [8, E]
    expected = naive_siglip(x, y, method.log_scale.double(), method.bias.double())
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert out["temperature"].item() == pytest.approx(0.1) and out["bias"].item() == -10.0
    out["loss"].backward()
    assert method.log_scale.grad is not None and method.bias.grad < 0  # at b = -10 the positives pull the bias up
    assert supports_zeroshot(method)


def test_two_image_views_train_without_a_text_tower_and_need_a_two_view_recipe():
    method, views, out = _step({"method": {"pairs": "views"}, "augment": {"recipe": "simclr_cifar"}})
    assert len(views) == 2 and not hasattr(method, "text") and not supports_zeroshot(method)
    out["loss"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in method.encoder.parameters())
    with pytest.raises(UserError, match="method.pairs=views trains on two image views: set augment.recipe"):
        resolve({"method": {"name": "siglip", "pairs": "views"}})


def test_supcon_refuses_unlabelled_data_in_one_line():
    from kontrast.data.samples import Samples as S

    cfg = resolve({"method": {"name": "supcon"}, "encoder": TINY_ENCODER})
    method = create_method(cfg, num_samples=8)
    with pytest.raises(UserError, match="supcon learns from class labels and photos has none"):
        method.bind_data(S(torch.zeros(8, 3, 8, 8, dtype=torch.uint8), None, [], "photos"))
