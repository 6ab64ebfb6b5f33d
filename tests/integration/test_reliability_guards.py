"""Guards: non-finite loss/gradient (stop, skip), InfoNCE numerics under bf16, config validation,
and the per-sample augmentation randomness (determinism, uniqueness, no host sync)."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file

from kontrast.augment import SampleRNG, derive_key, get_recipe, make_views, ops, sampling
from kontrast.augment.rng import mix32
from kontrast.cli import main
from kontrast.config import checked, parse_section
from kontrast.errors import UserError
from kontrast.losses.infonce import info_nce, moco_loss, nt_xent
from kontrast.train.guards import NonFiniteGuard
from support.args import train_command
from support.reference import cross_entropy64, naive_moco, naive_nt_xent


def train_args(out: Path, *extra: str, method: str = "simclr") -> list[str]:
    return train_command(out, *extra, method=method)


def cli(args: list[str], capsys, monkeypatch, faults: str = "") -> tuple[int, str]:
    threads = torch.get_num_threads()
    monkeypatch.setenv("KONTRAST_FAULTS", faults)
    try:
        code = main(args)
    finally:
        torch.set_num_threads(threads)
        monkeypatch.delenv("KONTRAST_FAULTS")
    return code, capsys.readouterr().err


def error_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def all_finite(ckpt: Path) -> bool:
    tensors = load_file(str(ckpt / "model.safetensors"))
    return all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point())


# ------------------------------------------------------------------------------------ non-finite values


def test_nan_loss_stops_naming_the_step_and_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"  # 2 steps per epoch; checkpoints every 2 steps; metrics every 5 (lazy check)
    code, err = cli(train_args(out, "--set", "train.log_every=5", "--set", "train.checkpoint_every=2"),
                    capsys, monkeypatch, "nan_at_step=3")
    line = error_line(code, err)
    assert "non-finite loss at step 3" in line and "stopped at step 4" in line
    assert "last good checkpoint" in line and "step-00000002" in line
    ckpts = sorted((out / "checkpoints").iterdir())
    assert [p.name for p in ckpts] == ["step-00000002"] and all_finite(ckpts[0])  # nothing after step 2 saved


def test_nonfinite_gradient_is_told_apart_from_the_loss():
    net = nn.Linear(3, 2)
    guard = NonFiniteGuard(net, torch.device("cpu"))
    net(torch.ones(1, 3)).sum().backward()
    assert not bool(guard.check_step(1, torch.tensor(0.5)))
    net.weight.grad[0, 1] = float("inf")
    assert bool(guard.check_step(2, torch.tensor(0.5)))  # loss finite, a gradient not
    with pytest.raises(UserError, match="non-finite gradient at step 2"):
        guard.raise_if_bad(3, Path("nowhere"))


def test_skip_policy_skips_the_step_entirely(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    code, err = cli(train_args(out, "--set", "train.log_every=1", "--set", "train.nonfinite=skip"),
                    capsys, monkeypatch, "nan_at_step=3")
    assert code == 0, err
    assert "non-finite loss or gradient at step 3; step skipped" in err
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line.get("warning") == "nonfinite"] == [3]
    assert all(math.isfinite(line["loss"]) for line in lines if "loss" in line)
    assert json.loads((out / "summary.json").read_text())["skipped_steps"] == 1
    final = sorted((out / "checkpoints").iterdir())[-1]
    assert all_finite(final)
    # the skipped step's forward pass left no trace either: BN saw 3 steps of 2 views (SimCLR forwards each view
    # on its own), not 4
    tracked = load_file(str(final / "model.safetensors"))["encoder.bn1.num_batches_tracked"]
    assert int(tracked) == 3 * 2


def test_skip_policy_stops_after_max_consecutive_skips(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    args = train_args(out, "--set", "train.nonfinite=skip", "--set", "train.max_skips=2")
    line = error_line(*cli(args, capsys, monkeypatch, "nan_at_step=2+3"))
    assert "2 consecutive steps (up to step 3)" in line and "train.max_skips=2" in line


# ------------------------------------------------------------------------------------ numerics under bf16


def hostile_embeddings(seed: int, b: int = 12, d: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(b, d, generator=g)
    z2 = z1 + 0.7 * torch.randn(b, d, generator=g)
    z2[4] = z1[7]  # a duplicate: one view equals another image's view
    z1[9] = z1[10]  # two images with the same embedding
    z1[2] = 0.0  # an all-zero embedding
    return z1, z2


@pytest.mark.parametrize("tau", [0.01, 0.1, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32-in", "bf16-in"])
def test_infonce_family_under_bf16_autocast(tau, dtype):
    z1, z2 = (z.to(dtype).requires_grad_() for z in hostile_embeddings(int(tau * 100)))
    queue = torch.cat([z2[:5].detach(), torch.randn(20, 32).to(dtype)])  # the queue holds copies of keys
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = {"nt_xent": nt_xent(z1, z2, tau), "moco": moco_loss(z1, z2.detach(), queue, tau)}
    refs = {"nt_xent": naive_nt_xent(z1, z2, tau), "moco": naive_moco(z1, z2, queue, tau)}
    for name, loss in losses.items():
        assert torch.isfinite(loss), name
        value = float(loss.detach())
        assert abs(value - refs[name]) <= 1e-2 * abs(refs[name]), (name, value, refs[name])
    sum(losses.values()).backward()
    assert torch.isfinite(z1.grad).all() and torch.isfinite(z2.grad).all()


def test_info_nce_masked_row_with_extreme_scores():
    """Scores of +-1e4 (tau 1e-4 on unit vectors) and a mask: finite, equal to the float64 value."""
    scores = torch.tensor([[1e4, -1e4, 9990.0], [0.0, 1e4, 1e4]])
    mask = torch.tensor([[False, False, False], [True, False, False]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = info_nce(scores, torch.tensor([2, 1]), mask)
    expect = (cross_entropy64(scores[0], 2) + cross_entropy64(scores[1], 1, exclude=0)) / 2
    assert torch.isfinite(loss) and abs(float(loss) - expect) <= 1e-2 * abs(expect)


# ------------------------------------------------------------------------------------ config validation


@pytest.mark.parametrize("args, key, says", [
    (["--set", "train.epoch=3"], "train.epoch", "unknown config key"),
    (["--set", "train.epochs=two"], "train.epochs", "must be int"),
    (["--set", "encoder.stem=5"], "encoder.stem", "must be"),
    (["--set", "optim.betas=[0.9, abc]"], "optim.betas", "must be float"),
    (["--set", "optim.betas=[0.9]"], "optim.betas", "list of 2"),
    (["--set", "optim.lr=-0.1"], "optim.lr", "must be > 0"),
    (["--set", "optim.lr=.nan"], "optim.lr", "finite"),
    (["--set", "optim.momentum=1.5"], "optim.momentum", "must be < 1"),
    (["--set", "method.temperature=0"], "method.temperature", "must be > 0"),
    (["--set", "method.temperature=-0.5"], "method.temperature", "must be > 0"),
    (["--set", "train.nonfinite=ignore"], "train.nonfinite", "one of stop, skip"),
    (["--set", "train.device=gpu"], "train.device", "invalid value"),
    (["--set", "data.size=2"], "data.size", ">= 4"),
    (["--method", "moco_v2", "--set", "method.queue_size=16"], "method.queue_size", "smaller than the keys"),
    (["--method", "byol", "--set", "method.base_momentum=1.2"], "method.base_momentum", "<= 1"),
])
def test_bad_values_fail_before_training(args, key, says, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    line = error_line(*cli([*train_args(out), *args], capsys, monkeypatch))
    assert f"'{key}'" in line and says in line, line
    assert not out.exists()  # refused before anything was written


def test_checked_fields_and_validate_work_for_any_params():
    """The mechanism method authors use: ``checked(...)`` bounds and an optional ``validate(cfg)``."""

    @dataclass(frozen=True)
    class Params:
        tau: float = checked(0.1, gt=0)
        mode: str = checked("a", choices=("a", "b"))
        dims: tuple[int, int] = checked((4, 8), ge=1)

    assert parse_section(Params, {"tau": 1}, "method").tau == 1.0
    for values, message in [({"tau": 0.0}, "'method.tau' must be > 0"), ({"mode": "c"}, "one of a, b"),
                            ({"dims": [4, 0]}, "'method.dims' must be >= 1"), ({"dims": [4.5, 1]}, "must be int")]:
        with pytest.raises(UserError, match=message):
            parse_section(Params, values, "method")


# ------------------------------------------------------------------------------------ augmentation randomness


def test_mix32_is_a_bijection_and_fits_in_32_bits():
    x = torch.arange(1 << 20, dtype=torch.int64) * 4093  # spread over the 32-bit range
    h = mix32(x)
    assert h.unique().numel() == x.numel() and h.min() >= 0 and h.max() < 2**32
    top = torch.tensor([2**32 - 1, 2**32 - 2])  # the largest inputs: products exact, no int64 overflow
    assert mix32(top).unique().numel() == 2 and int(mix32(top).max()) < 2**32


def test_uniforms_are_uniform_and_uncorrelated():
    u = SampleRNG(derive_key("augment", 0, 0), torch.arange(20000)).rand((20000, 8))  # [N, 8]
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    counts = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert (counts - 0.1).abs().max() < 0.005
    off_diag = torch.corrcoef(u.T) - torch.eye(8)  # [8, 8]
    assert off_diag.abs().max() < 0.03  # columns (parameters) independent
    neighbours = torch.corrcoef(torch.stack([u[:-1, 0], u[1:, 0]]))[0, 1]
    assert abs(float(neighbours)) < 0.03  # consecutive dataset indices independent


def test_two_samples_never_share_augmentation_parameters():
    """All 50000 samples of an epoch: every sample's parameter draws (the first 64 uniforms of each view,
    more than any recipe uses) differ from every other sample's, and view 1's from view 0's. Per draw
    the sample -> value map is a bijection, so even single parameters never coincide exactly.

    (Outputs can still coincide: a 16-px crop box is integer-valued, so two samples with different
    draws may land on the same box and flip with jitter off: 124 of 4096 copies of one image did.)"""
    rng = SampleRNG(derive_key("augment", 0, 0), torch.arange(50000))
    v0, v1 = rng.for_view(0).rand((50000, 64)), rng.for_view(1).rand((50000, 64))  # [N, 64] each
    assert torch.unique(v0, dim=0).shape[0] == 50000 and torch.unique(v1, dim=0).shape[0] == 50000
    assert torch.unique(torch.cat([v0, v1]), dim=0).shape[0] == 100000
    raw = (v0[:, 0] * 2**24).long()  # one parameter, at its full 24-bit resolution
    assert raw.unique().numel() > 49900  # (24 bits kept of a 32-bit bijection: rare ties only)


def test_views_depend_on_sample_epoch_and_view_only():
    images = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    ids = torch.randperm(1000, generator=torch.Generator().manual_seed(2))[:64]
    specs = get_recipe("byol")
    key0, key1 = derive_key("augment", 0, 0), derive_key("augment", 0, 1)
    a = make_views(images, specs, SampleRNG(key0, ids))
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    b = make_views(images[perm], specs, SampleRNG(key0, ids[perm]))  # other batch order
    half = make_views(images[:16], specs, SampleRNG(key0, ids[:16]))  # other batch size
    for va, vb, vh in zip(a, b, half):
        assert torch.equal(va[perm], vb) and torch.equal(va[:16], vh)
    c = make_views(images, specs, SampleRNG(key1, ids))  # next epoch: new views
    assert all((va != vc).flatten(1).any(1).all() for va, vc in zip(a, c))
    assert (a[0] != a[1]).flatten(1).any(1).all()  # the two views of an image differ


def op_names(fn) -> Counter:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return Counter(e.name for e in prof.events())


def test_per_sample_rng_has_no_per_sample_work_and_no_host_reads():
    specs = get_recipe("moco_v2")
    counts = {}
    for b in (8, 64):
        images = torch.randint(0, 256, (b, 3, 16, 16), dtype=torch.uint8)
        counts[b] = op_names(lambda: make_views(images, specs, SampleRNG(7, torch.arange(b))))
    assert counts[8] == counts[64]
    assert not {"aten::item", "aten::_local_scalar_dense", "aten::nonzero"} & set(counts[64])


def test_sampling_functions_accept_the_per_sample_source():
    rng = SampleRNG(3, torch.arange(2000))
    boxes = ops.sample_resized_crop(2000, 32, 32, (0.08, 1.0), (3 / 4, 4 / 3), rng)
    area = boxes[:, 2] * boxes[:, 3] / 1024
    assert float(area.min()) >= 0.07 and float(area.max()) <= 1.0 and 0.45 < float(area.mean()) < 0.6
    assert abs(float(sampling.sample_mask(2000, 0.5, rng).float().mean()) - 0.5) < 0.04
    with pytest.raises(ValueError, match="batch size"):
        rng.rand((3, 2))


# ------------------------------------------------------------------------------------ collapse


def test_collapse_monitor_warns_once_after_a_sustained_window():
    from kontrast.train.guards import CollapseMonitor

    m = CollapseMonitor(threshold=0.01, window=30)
    assert [m.update(s, 0.05) for s in (10, 20)] == [None, None]
    assert m.update(30, 0.004) is None and m.update(40, 0.003) is None  # below since step 30: 11 steps
    assert m.update(50, 0.02) is None and m.below_since is None  # recovered: the window restarts
    assert [m.update(s, 0.002) for s in (60, 70, 80)] == [None, None, None]
    message = m.update(90, 0.001)  # below for steps 60..90: 31 >= 30
    assert "collapsing" in message and "since step 60" in message and "train.collapse_std=0.01" in message
    assert m.update(100, 0.001) is None  # once
    resumed = CollapseMonitor(0.01, 30, m.state())  # the state travels in checkpoints
    assert resumed.update(110, 0.001) is None
    assert CollapseMonitor(0.0, 1).update(5, 0.0) is None  # threshold 0: off
    dino = CollapseMonitor(0.01, 1, share=0.5)  # DINO's other collapse: one prototype for most of the batch
    assert dino.update(5, 0.05, 0.4) is None and dino.update(6, 0.05, None) is None  # healthy / not logged
    assert "teacher_top_share 0.80" in dino.update(7, 0.05, 0.8)
    assert CollapseMonitor(0.01, 1).update(5, 0.05, 0.99) is None  # share 1 (the constructor's default): off


def test_collapse_warning_reaches_log_and_stderr(tmp_path, capsys, monkeypatch):
    """End to end with a threshold every run's embeddings fall under: one line on stderr, one in the log."""
    out = tmp_path / "run"
    code, err = cli(train_args(out, "--set", "train.log_every=1", "--set", "train.collapse_std=1.0",
                               "--set", "train.collapse_window=3"), capsys, monkeypatch)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning: embeddings are collapsing")]
    assert len(warnings) == 1 and "since step 1" in warnings[0]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line.get("warning") == "collapse"] == [3]


@pytest.mark.slow
def test_simsiam_without_stop_gradient_is_flagged_within_four_epochs(tmp_path, capsys, monkeypatch):
    """SimSiam's ablation (Chen & He 2021, figure 2) through the CLI: without stop-gradient the std of
    L2-normalised projections falls from 1/sqrt(d) = 0.125 (d = 64) below half of that, and the run
    says so within its 4 epochs (160 steps; measured: below 0.0625 from step ~26, flagged at step 128)."""
    out = tmp_path / "run"
    args = ["train", "--method", "simsiam", "--data", "shapes:1280", "--epochs", "4", "--batch-size", "32",
            "--out", str(out), "--no-progress", "--set", "encoder.width=0.125", "--set", "data.size=16",
            "--set", "method.proj_hidden=64", "--set", "method.proj_dim=64", "--set", "method.pred_hidden=16",
            "--set", "train.num_threads=1", "--set", "train.log_every=2", "--set", "optim.lr=0.3",
            "--set", "optim.lr_batch=32", "--set", "train.collapse_std=0.0625", "--set", "train.collapse_window=8",
            "--set", "method.stop_gradient=false"]
    code, err = cli(args, capsys, monkeypatch)
    assert code == 0, err
    assert "warning: embeddings are collapsing" in err
    stds = [line["embedding_std"] for line in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "embedding_std" in line]
    assert stds[0] > 0.0625 > min(stds)  # healthy at the start, collapsed by the warning
