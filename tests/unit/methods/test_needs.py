"""What a method needs, declared as data (kontrast.decisions.Needs) and checked in one place."""

import pytest
import torch

from kontrast.data.samples import Samples
from kontrast.decisions import Needs, check_inputs, decide, needs_of
from kontrast.errors import UserError
from kontrast.methods import METHODS, Method
from kontrast.methods.build import resolve


def test_every_method_declares_its_needs_and_they_read_its_params():
    for name in METHODS.names():
        cls = METHODS.get(name)
        assert isinstance(cls.needs, Needs), name
        needs = needs_of(resolve({"method": {"name": name}}))
        assert not any(isinstance(v, str) for v in vars(needs).values()), (name, needs)  # every name read
    assert needs_of(resolve({"method": {"name": "cpc_v2", "patch_size": 6, "patch_stride": 2,
                                        "max_offset": 4}})).min_view == 6 + 2 * 4
    assert needs_of(resolve({"method": {"name": "swav", "global_views": 3}})).views == 3


@pytest.mark.parametrize("old", ["distributed", "vit_only", "sync_bn"])
def test_a_method_written_the_old_way_is_told_what_to_declare(old):
    with pytest.raises(TypeError, match=f"declares {old}: a method declares what it needs as `needs = Needs"):
        type("Old", (Method,), {old: True})


def test_labels_and_text_are_checked_against_the_data():
    unlabelled = Samples(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), None, [], "four blank images")
    with pytest.raises(UserError, match="supcon learns from class labels and four blank images has none"):
        check_inputs(resolve({"method": {"name": "supcon"}}), unlabelled)
    with pytest.raises(UserError, match="clip trains on image-caption pairs and four blank images has neither"):
        check_inputs(resolve({"method": {"name": "clip"}}), unlabelled)
    check_inputs(resolve({"method": {"name": "simclr"}}), unlabelled)  # needs neither


def test_the_decisions_say_why_and_are_typed():
    d = decide(resolve({"encoder": {"name": "vit_tiny"}, "data": {"size": 96}, "method": {"name": "dino"}}))
    assert (d.size, d.stem, d.is_vit, d.patch_multiple, d.recipe) == (96, None, True, 8, "dino_imagenet")
    assert {v.size for v in d.views} == {96, 40} and d.encoder_args["image_size"] == 96
    auto = decide(resolve({"data": {"source": "shapes"}}))
    assert auto.size == 32 and any(line.startswith("size: 32 px") for line in auto.reasons)
