"""Progressive resolution (``augment.min_size``, ``augment.size_ramp``): the side schedule, the plan's views at
each side and its one-line refusals, views that equal the fixed-size run's at the last side, and a run that
resumes bit for bit in the middle of the ramp."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from kontrast.augment import key_tensor, side_schedule, view_maker
from kontrast.checkpoint import latest_checkpoint
from kontrast.errors import UserError
from kontrast.methods.build import resolve
from kontrast.train.plan import build_run, plan_run
from support.args import ONE_CPU_THREAD, TINY_ENCODER
from support.cli import cli_run, in_process


def test_side_schedule_holds_low_then_grows_in_whole_steps_to_high():
    sides = side_schedule(100, 16, 32, (0.2, 0.6))
    assert sides[:20] == [16] * 20  # before the ramp
    assert sides[60:] == [32] * 40  # from its end
    assert sides == sorted(sides) and set(sides) == {16, 20, 24, 28, 32}  # 4-px steps, never back
    assert sides[40] == 24  # halfway through the ramp: halfway between the sides
    assert side_schedule(10, 16, 32, (0.5, 0.5)) == [16] * 5 + [32] * 5  # a ramp of no length: one jump
    assert set(side_schedule(50, 16, 32, (0.0, 1.0), multiple=8)) == {16, 24, 32}  # a ViT's 8-px patches


def _cfg(**augment) -> dict:
    return resolve({"data": {"source": "shapes:64", "size": 32}, "encoder": TINY_ENCODER,
                    "train": {"batch_size": 16, "epochs": 2, "device": "cpu"}, "augment": augment})


def test_the_plan_resolves_the_views_at_every_smaller_side_and_says_so():
    plan = plan_run(_cfg(min_size=16))
    assert [side for side, _ in plan.ramp_views] == [16, 20, 24, 28]
    assert all(v.size == side for side, views in plan.ramp_views for v in views)
    assert plan.to_dict()["ramp_sides"] == [16, 20, 24, 28]
    assert ("views: progressive resolution, 16, 20, 24, 28 px before 32 px, growing from 0 % to 75 % of the steps "
            "(augment.min_size, augment.size_ramp)") in plan.lines()
    assert plan_run(_cfg()).ramp_views == ()  # off by default


@pytest.mark.parametrize("settings, message", [
    ({"min_size": 32}, "augment.min_size (32) must be below data.size (32)"),
    ({"min_size": 16, "size_ramp": [0.8, 0.2]}, "augment.size_ramp [0.8, 0.2] must start no later than it ends"),
])
def test_settings_it_cannot_take_are_one_line(settings, message):
    with pytest.raises(UserError, match=re.escape(message)):
        plan_run(_cfg(**settings))


def test_a_method_without_image_views_refuses_it():
    cfg = resolve({"method": {"name": "cpc"}, "data": {"source": "sequences:16"}, "augment": {"min_size": 8}})
    with pytest.raises(UserError, match="takes no image augmentation"):
        plan_run(cfg)


def test_a_vit_needs_a_whole_number_of_patches():
    cfg = resolve({"data": {"source": "shapes:16", "size": 32}, "augment": {"min_size": 18},
                   "encoder": {"name": "vit_tiny", "width": 0.125, "depth": 1, "patch_size": 4}})
    with pytest.raises(UserError, match=r"augment.min_size \(18\) must be a multiple of the ViT's 4-px patch; use 16"):
        plan_run(cfg)


def test_the_step_makes_each_sides_views_and_the_last_sides_are_the_fixed_size_runs():
    plan = plan_run(_cfg(min_size=16))
    ctx, schedule, _ = build_run(plan)
    assert ctx.view_sides == side_schedule(schedule.total_steps, 16, 32, (0.0, 0.75))
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    ids, key = torch.arange(4), key_tensor(7)
    small = ctx.make_views(images, ids, key, 16)
    assert [tuple(v.shape) for v in small] == [(4, 3, 16, 16)] * 2
    fixed = view_maker(plan_run(_cfg()).views)(images, ids, key)
    for a, b in zip(ctx.make_views(images, ids, key, 32), fixed):
        assert torch.equal(a, b)


def _args(out) -> list[str]:
    args = ["train", "--method", "simclr", "--data", "shapes:64", "--epochs", "2", "--batch-size", "16", "--out",
            str(out), "--no-progress"]
    for item in ["encoder.width=0.125", "data.size=32", "augment.min_size=16", "train.log_every=1",
                 "train.checkpoint_every=1", *ONE_CPU_THREAD]:
        args += ["--set", item]
    return args


def _losses(run) -> list[float]:
    return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


def test_a_run_stopped_in_the_ramp_resumes_bit_for_bit(tmp_path):
    """8 steps over sides 16 -> 32; SIGTERM after step 3 (side 20), then --resume: the weights and losses of an
    uninterrupted run."""
    assert in_process(_args(tmp_path / "run"), "signal_after_step=3") == 143
    assert latest_checkpoint(tmp_path / "run").name == "step-00000003"
    assert cli_run([*_args(tmp_path / "run"), "--resume"]).returncode == 0
    assert cli_run(_args(tmp_path / "whole")).returncode == 0
    wa = load_file(latest_checkpoint(tmp_path / "run") / "model.safetensors")
    wb = load_file(latest_checkpoint(tmp_path / "whole") / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert _losses(tmp_path / "run") == _losses(tmp_path / "whole") and len(_losses(tmp_path / "whole")) == 8
