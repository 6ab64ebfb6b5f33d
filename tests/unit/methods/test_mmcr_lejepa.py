"""MMCR and LeJEPA (kontrast/methods/mmcr.py, lejepa.py): the loss on the method's own embeddings, MMCR's momentum
encoder, the view count (``augment.views``)."""

import pytest
import torch
import torch.nn.functional as F

from kontrast.augment import make_views
from kontrast.decisions import decide, view_specs
from kontrast.errors import UserError
from kontrast.losses.gaussian import unit_directions
from kontrast.methods.build import create_method, resolve
from support.args import TINY_ENCODER
from support.reference import naive_lejepa, naive_mmcr


def _step(name: str, **sections):
    cfg = resolve({"method": {"name": name, **sections.pop("method", {})}, "encoder": TINY_ENCODER, **sections})
    method = create_method(cfg, num_samples=8)
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    views = make_views(images, view_specs(cfg), torch.Generator().manual_seed(0))
    torch.manual_seed(7)  # the step's seed (the training room's), which LeJEPA's directions come from
    return method, views, method.training_step(views, torch.arange(8))


def test_mmcr_is_the_nuclear_norm_of_its_centroids():
    method, views, out = _step("mmcr", method={"proj_dim": 16}, augment={"views": 3})
    assert len(views) == 3
    z = method.projector(method.encoder(torch.cat(views))).double()  # [3*8, 16] the same batch: the same BN
    z = F.normalize(z, dim=1).view(3, 8, 16).transpose(0, 1)  # [8, 3, 16]
    assert out["loss"].item() == pytest.approx(naive_mmcr(z).item(), rel=1e-5)
    out["loss"].backward()
    assert method.encoder.conv1.weight.grad.abs().sum() > 0


def test_mmcrs_momentum_encoder_adds_its_views_to_each_centroid_without_gradient():
    method, views, out = _step("mmcr", method={"proj_dim": 16, "momentum_encoder": True}, augment={"views": 2})
    online = method.projector(method.encoder(torch.cat(views)))  # [16, 16]
    with torch.no_grad():
        target = method.target(torch.cat(views))
    z = F.normalize(torch.cat([online, target]).double(), dim=1).view(4, 8, 16).transpose(0, 1)  # [8, 2 + 2, 16]
    assert out["loss"].item() == pytest.approx(naive_mmcr(z).item(), rel=1e-5)
    out["loss"].backward()
    assert all(p.grad is None for p in method.target.parameters())


def test_lejepa_is_the_papers_loss_with_the_steps_directions():
    method, views, out = _step("lejepa", method={"proj_hidden": 32, "proj_dim": 16, "directions": 8})
    assert len(views) == 6  # 2 global + 4 local crops
    h = torch.cat([method.encoder(torch.cat(views[:2])), method.encoder(torch.cat(views[2:]))])  # per crop size
    z = method.projector(h).double().view(6, 8, 16)  # [V, B, D]
    directions = unit_directions(16, 8, torch.Generator().manual_seed(7)).double()
    assert out["loss"].item() == pytest.approx(naive_lejepa(z, 2, directions, 0.05).item(), rel=1e-5)
    assert out["sigreg"] > 0 and out["invariance"] > 0


def test_the_view_count_is_the_recipes_first_views_then_its_last_repeated():
    from kontrast.augment import recipe_views

    dino = recipe_views("dino_multicrop", 32, count=8)
    assert [v.size for v in dino] == [32, 32] + [16] * 6  # more local crops
    assert [v.size for v in recipe_views("dino_multicrop", 32, count=3)] == [32, 32, 16]
    with pytest.raises(UserError, match="compares at least 2 views of each image and the run draws 1; set "
                                        "augment.views to 2"):
        decide(resolve({"method": {"name": "simclr"}, "augment": {"views": 1}}))
    with pytest.raises(UserError, match="method cpc takes no image augmentation; remove the augment settings"):
        decide(resolve({"method": {"name": "cpc"}, "augment": {"views": 4}}))
    assert len(recipe_views("instdisc", 32, count=1)) == 1  # a one-view method keeps its one view
