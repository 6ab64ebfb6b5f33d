"""The supervised reference (kontrast/methods/supervised.py): its loss is the cross-entropy of every view's logits
against its image's label, the classifier sized from the data or fixed, labels required."""

import pytest
import torch

from kontrast.augment import make_views
from kontrast.data import Samples
from kontrast.decisions import view_specs
from kontrast.errors import UserError
from kontrast.methods.build import create_method, resolve
from support.args import TINY_ENCODER
from support.reference import naive_cross_entropy

LABELS = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])


def _method(classes: int = 0, labels=LABELS, names=("cat", "dog", "fox")):
    cfg = resolve({"method": {"name": "supervised", "classes": classes}, "encoder": TINY_ENCODER})
    method = create_method(cfg, num_samples=8)
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    note = method.bind_data(Samples(images, labels, list(names), "smoke"))
    return method, make_views(images, view_specs(cfg), torch.Generator().manual_seed(0)), note


def test_the_loss_is_the_cross_entropy_of_every_view_against_its_label_in_value_and_gradient():
    method, views, note = _method()
    assert "3-class" in note and method.classifier.out_features == 3
    method, views = method.double(), [v.double() for v in views]  # float64: the tolerances are float64 rounding
    out = method.training_step(views, torch.arange(8))
    out["loss"].backward()
    ours = method.classifier.weight.grad.clone()
    method.zero_grad()
    h = method.encoder(torch.cat(views))  # [2 x 8, D] view 1, then view 2 (BN over both, as the step's one call)
    expected = naive_cross_entropy(method.classifier(h), LABELS.repeat(2))
    eps = torch.finfo(torch.float64).eps  # both sides in float64: 1000 ulps of room, for any CPU's summation order
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1000 * eps)
    expected.backward()
    torch.testing.assert_close(ours, method.classifier.weight.grad, rtol=1000 * eps, atol=1000 * eps)
    assert 0.0 <= out["train_top1"].item() <= 1.0


def test_a_fixed_class_count_is_kept_and_a_label_beyond_it_refused():
    method, _, _ = _method(classes=5)
    assert method.classifier.out_features == 5
    with pytest.raises(UserError, match="method.classes is 2"):
        _method(classes=2)


def test_unlabelled_data_is_refused_in_one_line():
    cfg = resolve({"method": {"name": "supervised"}, "encoder": TINY_ENCODER})
    method = create_method(cfg, num_samples=8)
    with pytest.raises(UserError, match="has none"):
        method.bind_data(Samples(torch.zeros(8, 3, 32, 32, dtype=torch.uint8), None, [], "folder"))
    with pytest.raises(UserError, match="bind_data"):
        method.training_step([torch.zeros(8, 3, 32, 32)], torch.arange(8))


def test_a_checkpoint_loads_without_the_data():
    trained, _, _ = _method()
    cfg = resolve({"method": {"name": "supervised"}, "encoder": TINY_ENCODER})
    fresh = create_method(cfg, num_samples=8)  # as `kontrast embed` builds it: no bind_data
    fresh.size_from(trained.state_dict())  # as kontrast.checkpoint.load_weights calls it
    fresh.load_state_dict(trained.state_dict())
    torch.testing.assert_close(fresh.classifier.weight, trained.classifier.weight)
