"""The methods built from the kernels, NCE and heads: InstDisc's bank and step, SimCLR v2's head, the MoCo family's
BN groups and heads, MoCo v3's bound, Kernel-InfoNCE's kernels, SimSiam's stop-gradient and predictor lr."""

import math

import pytest
import torch
import torch.nn.functional as F

from kontrast.errors import UserError
from support.reference import naive_nce


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _after(step):
    """The progress ``after_step`` gets after ``step`` finished steps (instdisc reads none of it)."""
    from kontrast.methods.base import Progress

    return Progress(step=step, epoch=0, total_steps=10, steps_per_epoch=10)


def _instdisc(num_samples=16, **params):
    from kontrast.methods.build import create_method, resolve

    cfg = resolve({"method": {"name": "instdisc", "noise_samples": 8, **params},
                   "encoder": {"name": "resnet18", "width": 0.125}})
    return create_method(cfg, num_samples=num_samples)


def test_instdisc_updates_the_bank_after_the_step_and_keeps_z_once():
    torch.manual_seed(0)
    method = _instdisc(z_estimate="once")
    views = [torch.randn(4, 3, 32, 32)]
    idx = torch.tensor([3, 7, 0, 12])
    before = method.bank.items.clone()
    out = method.training_step(views, idx)
    assert torch.isfinite(out["loss"]) and torch.isfinite(method.log_z)
    out["loss"].backward()
    assert method.bank.items.grad is None and not method.bank.items.requires_grad  # no gradient to the bank
    assert torch.equal(method.bank.items, before)  # nothing changes before after_step
    log_z = method.log_z.clone()
    f = out["features"]  # [B, D] what after_step moves the bank rows out["indices"] towards
    assert torch.equal(out["indices"], idx)
    method.after_step(out, _after(1))
    want = F.normalize(0.5 * before[idx] + 0.5 * f, dim=1)
    assert torch.allclose(method.bank.items[idx], want, atol=1e-6)
    rest = torch.ones(16, dtype=torch.bool)
    rest[idx] = False
    assert torch.equal(method.bank.items[rest], before[rest])
    method.training_step([torch.randn(4, 3, 32, 32)], torch.tensor([1, 2, 4, 5]))
    assert torch.equal(method.log_z, log_z)  # "once": Z stays fixed after its first estimate


def test_instdisc_step_loss_matches_formula_with_z_from_this_steps_noise():
    """Default z_estimate="step": the loss is eqs. 5-7 with Z = n * mean exp over this step's B x m noise scores."""
    torch.manual_seed(0)
    method, n, tau = _instdisc(), 16, 0.1
    for step, idx in enumerate([torch.tensor([3, 7, 0, 12]), torch.tensor([1, 2, 4, 5])]):
        torch.manual_seed(10 + step)
        out = method.training_step([torch.randn(4, 3, 32, 32)], idx)
        torch.manual_seed(10 + step)
        torch.randn(4, 3, 32, 32)
        noise = method.bank.items[method.bank.sample(8)].double()  # the step's draw, replayed
        f, v = out["features"].double(), method.bank.items[idx].double()
        pos, neg = (f * v).sum(1) / tau, f @ noise.T / tau
        z = n * neg.exp().mean().item()  # eq. 5 on this step's scores
        assert method.log_z.item() == pytest.approx(math.log(z), abs=1e-5)
        assert out["loss"].item() == pytest.approx(naive_nce(pos, neg, z, n), rel=1e-5)
        assert out["pos_sim"].item() == pytest.approx((f * v).sum(1).mean().item(), abs=1e-6)
        method.after_step(out, _after(step + 1))


def test_instdisc_proximal_term_and_missing_indices():
    torch.manual_seed(0)
    plain, prox = _instdisc(), _instdisc(proximal=30.0)
    prox.load_state_dict(plain.state_dict())
    views, idx = [torch.randn(4, 3, 32, 32)], torch.tensor([0, 1, 2, 3])
    plain.eval(), prox.eval()  # same BN statistics in both forwards
    torch.manual_seed(1)
    a = plain.training_step(views, idx)["loss"]
    torch.manual_seed(1)
    out = prox.training_step(views, idx)
    b = out["loss"]
    f, v = out["features"], prox.bank.items[idx]
    assert b.item() == pytest.approx(a.item() + 30.0 * ((f - v) ** 2).sum(1).mean().item(), rel=1e-5)
    with pytest.raises(UserError, match="index"):
        _instdisc().training_step(views, None)
    with pytest.raises(UserError, match="index"):
        _instdisc(num_samples=0).training_step(views, idx)


def test_instdisc_checkpoint_evaluates(tmp_path):
    """`kontrast eval` rebuilds the method from config: the bank must be sized from the checkpoint."""
    from kontrast.evaluate.options import EvalOptions
    from kontrast.evaluate.run import evaluate_run, load_run
    from kontrast.methods.build import resolve
    from kontrast.train.loop import fit

    raw = {"method": {"name": "instdisc", "noise_samples": 16}, "encoder": {"name": "resnet18", "width": 0.125},
           "data": {"source": "shapes:64"}, "train": {"epochs": 1, "batch_size": 32, "device": "cpu"},
           "eval": {"knn_k": 5, "linear_epochs": 1}}
    fit(resolve(raw), tmp_path / "run", progress=False)
    _, method, _ = load_run(tmp_path / "run")
    assert method.bank.items.shape == (64, 128)
    result = evaluate_run(tmp_path / "run", options=EvalOptions(linear=False))
    assert 0.0 <= result["knn_top1"] <= 1.0


# ---------------------------------------------------------------- heads, MoCo v1, SimCLR v2, Kernel-InfoNCE


def _method(name, **params):
    from kontrast.methods.build import create_method, resolve

    cfg = resolve({"method": {"name": name, **params}, "encoder": {"name": "resnet18", "width": 0.125}})
    return create_method(cfg, num_samples=8)


def test_split_mlp():
    from kontrast.extract import mlp, split_mlp

    head = mlp([8, 6, 5, 3])
    first, rest = split_mlp(head, 1)
    x = torch.randn(4, 8)
    assert first(x).shape == (4, 6) and torch.equal(rest(first(x)), head(x))
    assert len(split_mlp(head, 0)[0]) == 0
    with pytest.raises(ValueError):
        split_mlp(head, 3)


def test_simclr_v2_evaluates_from_the_first_head_layer():
    m = _method("simclr_v2")
    x = torch.randn(4, 3, 32, 32)
    assert m.encoder.dim == 64 and m.encoder(x).shape == (4, 64)  # width-0.125 ResNet-18: 64 features
    assert len([layer for layer in m.projector if isinstance(layer, torch.nn.Linear)]) == 2  # 3 layers in all
    plain = _method("simclr_v2", keep_head_layers=0)
    assert not hasattr(plain.encoder, "head")
    assert len([layer for layer in plain.projector if isinstance(layer, torch.nn.Linear)]) == 3
    with pytest.raises(UserError, match="keep_head_layers"):
        _method("simclr_v2", keep_head_layers=3)


def test_moco_v1_is_moco_v2_with_a_linear_head():
    m = _method("moco_v1")
    assert isinstance(m.projector[0], torch.nn.Linear) and len(m.projector) == 1
    assert (m.params.temperature, m.params.momentum, m.params.symmetric) == (0.07, 0.999, False)


# ---------------------------------------------------------------- shuffling BN (MoCo v1/v2, InfoMin)


class _Probe(torch.nn.Module):
    """A tiny encoder whose inputs carry their identity in pixel [0, 0, 0]: ``view * 1000 + sample``."""

    dim = 16

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 16))

    def forward(self, x):
        return self.net(x)


def _marked_views(b: int) -> list[torch.Tensor]:
    views = [torch.randn(b, 3, 4, 4) for _ in range(2)]
    for v, x in enumerate(views):
        x[:, 0, 0, 0] = v * 1000 + torch.arange(b, dtype=torch.float)
    return views


def _probe_groups(name: str, b: int, groups: int) -> dict[str, list[list[int]]]:
    """Run one MoCo step on a probe encoder; the sample markers each BN group (forward call) held."""
    from kontrast.methods import METHODS

    cls = METHODS.get(name)
    method = cls(_Probe(), cls.Params(queue_size=64, bn_groups=groups))
    seen: dict[str, list[list[int]]] = {"online": [], "target": []}
    for role, enc in (("online", method.encoder), ("target", method.target.net[0])):
        enc.register_forward_pre_hook(lambda m, args, r=role: seen[r].append(args[0][:, 0, 0, 0].long().tolist()))
    out = method.training_step(_marked_views(b))
    out["loss"].backward()
    return seen


@pytest.mark.parametrize("name", ["moco_v2", "moco_v1", "infomin"])
@pytest.mark.parametrize("b", [16, 18, 25])
def test_moco_bn_groups_hold_one_view_each_with_two_or_more_samples(name, b):
    """Shuffling BN as on 8 GPUs: each view is cut into ``bn_groups`` groups of near-equal size (>= 2),
    a group never mixes the two views, and every sample of a forwarded view is in exactly one group."""
    seen = _probe_groups(name, b, 8)
    for role, calls in seen.items():
        assert len(calls) in (8, 16), role
        for group in calls:
            assert len({m // 1000 for m in group}) == 1, f"{role} group mixes the views: {group}"
            assert len(group) >= 2
        per_view: dict[int, list[list[int]]] = {}
        for group in calls:
            per_view.setdefault(group[0] // 1000, []).append(group)
        for view_groups in per_view.values():
            assert len(view_groups) == 8
            sizes = [len(g) for g in view_groups]
            assert max(sizes) - min(sizes) <= 1  # as equal as possible
            assert sorted(m % 1000 for g in view_groups for m in g) == list(range(b))  # each sample once


def test_moco_v1_asymmetric_forwards_only_what_its_loss_uses():
    """Algorithm 1: queries of view 1, keys of view 2; no forward of q2 or k1 whose outputs go unused."""
    seen = _probe_groups("moco_v1", 16, 8)
    assert {m // 1000 for g in seen["online"] for m in g} == {0}  # queries: view 1 only
    assert {m // 1000 for g in seen["target"] for m in g} == {1}  # keys: view 2 only
    assert sum(map(len, seen["online"])) == sum(map(len, seen["target"])) == 16
    both = _probe_groups("moco_v2", 16, 8)  # symmetric: both views through both encoders
    assert sum(map(len, both["online"])) == sum(map(len, both["target"])) == 32


def test_moco_head_bn_over_the_whole_view_when_asked():
    """``head_bn_groups`` false (lightly's SplitBatchNorm in the backbone only): the encoders still see 8 groups a
    view, the heads one call a view; the default runs the heads in the encoders' groups (each GPU's whole net)."""
    from kontrast.methods import METHODS

    cls = METHODS.get("moco_v2")
    for head_groups, calls in ((True, 16), (False, 2)):
        method = cls(_Probe(), cls.Params(queue_size=64, bn_groups=8, head_bn_groups=head_groups))
        seen = {"encoder": 0, "online head": 0, "target head": 0}
        for role, part in (("encoder", method.encoder), ("online head", method.projector),
                           ("target head", method.target.net[1])):
            part.register_forward_pre_hook(lambda m, args, r=role: seen.__setitem__(r, seen[r] + 1))
        method.training_step(_marked_views(16))["loss"].backward()
        assert seen == {"encoder": 16, "online head": calls, "target head": calls}


@pytest.mark.parametrize("name", ["moco_v2", "moco_v1", "infomin"])
@pytest.mark.parametrize("b", [18, 25])
def test_moco_trains_a_step_at_batches_not_divisible_by_the_groups(name, b):
    from kontrast.methods.base import Progress
    from kontrast.methods.build import create_method, resolve

    cfg = resolve({"method": {"name": name, "queue_size": 64}, "train": {"batch_size": b},
                   "encoder": {"name": "resnet18", "width": 0.125}})  # validate accepts it
    m = create_method(cfg, num_samples=64)
    assert m.params.bn_groups == 8
    out = m.training_step([torch.randn(b, 3, 32, 32), torch.randn(b, 3, 32, 32)])
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    m.after_step(out, Progress(step=1, epoch=0, total_steps=2, steps_per_epoch=1))


def test_moco_bn_groups_error_before_training():
    from kontrast.decisions import decide
    from kontrast.errors import UserError
    from kontrast.methods.build import resolve

    for name in ("moco_v2", "moco_v1", "infomin"):
        decide(resolve({"method": {"name": name, "queue_size": 64}, "train": {"batch_size": 16}}))  # 2 per group
        with pytest.raises(UserError, match="method.bn_groups") as err:
            decide(resolve({"method": {"name": name, "queue_size": 64}, "train": {"batch_size": 15}}))
        assert "\n" not in str(err.value) and "2 samples" in str(err.value)


# ---------------------------------------------------------------- MoCo v3's bound


def test_moco_v3_mi_bound_is_log_n_minus_the_cross_entropy():
    """The loss is 2 tau x (CE(q1, k2) + CE(q2, k1)); the bound is log N - CE (mean of the two directions)."""
    torch.manual_seed(0)
    m = _method("moco_v3", proj_hidden=64, pred_hidden=64, proj_dim=32)
    tau, b = m.params.temperature, 8
    views = [torch.randn(b, 3, 32, 32), torch.randn(b, 3, 32, 32)]
    out = m.training_step(views)
    with torch.no_grad():  # train-mode BN: the same batches give the same outputs
        q = [m.predictor(m.projector(m.encoder(v))) for v in views]
        k = [m.target.net(v) for v in views]
        labels = torch.arange(b)
        ce = [F.cross_entropy(F.normalize(qi, dim=1) @ F.normalize(kj, dim=1).T / tau, labels)
              for qi, kj in ((q[0], k[1]), (q[1], k[0]))]
    mean_ce = (ce[0] + ce[1]).item() / 2
    assert out["loss"].item() == pytest.approx(2 * tau * (ce[0] + ce[1]).item(), rel=1e-4)
    assert out["mi_bound"].item() == pytest.approx(math.log(b) - mean_ce, abs=1e-4)
    assert out["mi_bound"].item() <= math.log(b) + 1e-6


@pytest.mark.parametrize("kernel", ["gaussian", "laplacian", "gamma", "simple_sum", "concat_sum"])
def test_kernel_infonce_kernels_run_and_bound(kernel):
    m = _method("kernel_infonce", kernel=kernel, gamma=0.5)
    out = m.training_step([torch.randn(6, 3, 32, 32), torch.randn(6, 3, 32, 32)])
    assert torch.isfinite(out["loss"]) and out["mi_bound"] <= math.log(11) + 1e-6


def test_kernel_infonce_gaussian_is_simclr():
    """The method-level identity: Gaussian kernel, tau = 2 x SimCLR's tau, same weights -> the same loss."""
    torch.manual_seed(0)
    k = _method("kernel_infonce", kernel="gaussian", temperature=1.0)
    s = _method("simclr", temperature=0.5, view_bn="joint")  # kernel_infonce sends both views as one batch
    s.load_state_dict(k.state_dict())
    views = [torch.randn(6, 3, 32, 32), torch.randn(6, 3, 32, 32)]
    assert k.training_step(views)["loss"].item() == pytest.approx(s.training_step(views)["loss"].item(), rel=1e-5)


@pytest.mark.parametrize("name", ["simclr", "simclr_v2", "dcl"])
def test_simclr_view_bn_sends_views_one_at_a_time_or_as_one_batch(name):
    """per_view: BN statistics of each view's batch (lightly, solo-learn); joint: of both views (the authors' code)."""
    torch.manual_seed(0)
    views = [torch.randn(6, 3, 32, 32), torch.randn(6, 3, 32, 32) + 1.0]  # view 2 shifted: its statistics differ
    per_view, joint = _method(name, view_bn="per_view"), _method(name, view_bn="joint")
    joint.load_state_dict(per_view.state_dict())
    net = lambda x: per_view.projector(per_view.encoder(x))  # noqa: E731
    z_each = torch.cat([net(v) for v in views])  # [12, 128]: BN over each view's 6 images
    z_both = net(torch.cat(views))  # [12, 128]: BN over all 12
    assert torch.allclose(per_view.embed(views), z_each, atol=1e-6)
    assert torch.allclose(joint.embed(views), z_both, atol=1e-6)
    assert (z_each - z_both).abs().max() > 1e-2  # BN's batch matters
    assert torch.isfinite(per_view.training_step(views)["loss"])
    with pytest.raises(UserError, match="view_bn"):
        _method(name, view_bn="shared")


@pytest.mark.parametrize("name", ["simclr", "dcl"])
@pytest.mark.parametrize("encoder", [{"name": "resnet18", "width": 0.125},
                                     {"name": "vit_tiny", "width": 0.125, "depth": 1, "patch_size": 4}])
def test_per_view_and_joint_bn_agree_where_no_batch_statistic_is_taken(name, encoder):
    """The two forms differ only in BatchNorm's batch (the encoder's and the head's): with running statistics (eval
    mode) they give the same loss and the same gradient, on a ResNet and on a ViT."""
    from kontrast.methods.build import create_method, resolve

    def build(view_bn):
        cfg = resolve({"method": {"name": name, "view_bn": view_bn}, "encoder": encoder})
        return create_method(cfg, num_samples=8).eval()

    torch.manual_seed(0)
    views = [torch.randn(6, 3, 16, 16), torch.randn(6, 3, 16, 16) + 1.0]
    per_view, joint = build("per_view"), build("joint")
    joint.load_state_dict(per_view.state_dict())
    a, b = per_view.training_step(views)["loss"], joint.training_step(views)["loss"]
    ga = torch.autograd.grad(a, list(per_view.parameters()), allow_unused=True)
    gb = torch.autograd.grad(b, list(joint.parameters()), allow_unused=True)
    assert abs(float(a) - float(b)) < 1e-6
    for x, y in zip(ga, gb):
        assert (x is None and y is None) or torch.allclose(x, y, rtol=1e-4, atol=1e-6)  # batch shape: rounding only


def test_kernel_infonce_config_errors():
    with pytest.raises(UserError, match="kernel"):
        _method("kernel_infonce", kernel="rbf")
    with pytest.raises(UserError, match="gamma"):
        _method("kernel_infonce", gamma=3.0)
    with pytest.raises(UserError, match="even"):
        _method("kernel_infonce", kernel="concat_sum", proj_dim=127)


# ---------------------------------------------------------------- SimSiam's ablation (Chen & He 2021, figure 2)


def _simsiam_std_trace(stop_gradient: bool, steps: int = 200, dim: int = 64) -> list[float]:
    """embedding_std (mean per-dim std of L2-normalised projections) over a short SGD run on shapes."""
    from kontrast.augment import make_views
    from kontrast.data import load_images
    from kontrast.decisions import view_specs
    from kontrast.methods.build import create_method, resolve

    torch.manual_seed(0)
    data = load_images("shapes:512", "train", size=16)
    cfg = resolve({"method": {"name": "simsiam", "stop_gradient": stop_gradient, "proj_hidden": dim,
                              "proj_dim": dim, "pred_hidden": dim // 4},
                   "encoder": {"name": "resnet18", "width": 0.125}, "data": {"size": 16}})
    method = create_method(cfg)
    specs = view_specs(cfg)
    opt = torch.optim.SGD(method.parameters(), lr=0.3, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(0)
    trace = []
    for _ in range(steps):
        idx = torch.randint(0, len(data.x), (32,), generator=g)
        out = method.training_step(make_views(data.x[idx], specs, g))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        trace.append(float(out["embedding_std"]))
    return trace


@pytest.mark.slow
def test_simsiam_collapses_without_stop_gradient():
    """Without stop-gradient the outputs collapse (std of normalised z -> 0); with it the std stays near
    1/sqrt(d). 200 steps of batch 32 at 16 px on shapes, d = 64 (1/sqrt(d) = 0.125), the views through the network
    separately as SimSiam's Algorithm 1 (measurements: docs/lab/method-tests.md, "SimSiam")."""
    d = 64
    with_sg = _simsiam_std_trace(True, dim=d)
    without = _simsiam_std_trace(False, dim=d)
    late_with, late_without = sum(with_sg[-10:]) / 10, sum(without[-10:]) / 10
    print("SimSiam embedding_std, last 10 steps: stop-grad", late_with, "no stop-grad", late_without)
    assert with_sg[0] == pytest.approx(d ** -0.5, rel=0.05)  # both start spread out
    # the trajectory depends on float summation order (thread count), so the bounds leave room on both sides
    assert late_without < 0.5 * d ** -0.5 < late_with, (with_sg, without)  # half of 1/sqrt(d) separates the runs
    assert late_without < 0.6 * late_with, without


def test_simsiam_predictor_keeps_the_peak_lr(tmp_path):
    """``fix_pred_lr``: the loop decays every group's lr but the predictor's (SimSiam, section 4.1)."""
    from kontrast.checkpoint import latest_checkpoint, load_checkpoint
    from kontrast.methods.build import create_method, resolve
    from kontrast.train.loop import fit
    from kontrast.train.optim import create_optimizer, peak_lr

    raw = {"method": {"name": "simsiam", "proj_hidden": 32, "proj_dim": 32, "pred_hidden": 8},
           "encoder": {"name": "resnet18", "width": 0.125}, "data": {"source": "shapes:64"},
           "train": {"epochs": 2, "batch_size": 16, "device": "cpu"}}
    cfg = resolve(raw)
    fit(cfg, tmp_path / "run", progress=False)
    method = create_method(cfg, num_samples=64)
    opt = create_optimizer(method, cfg.optim, 16)
    load_checkpoint(latest_checkpoint(tmp_path / "run"), method, opt)
    peak = peak_lr(cfg.optim, 16)
    predictor = {id(p) for p in method.predictor.parameters()}
    for group in opt.param_groups:
        in_predictor = {id(p) in predictor for p in group["params"]}
        assert len(in_predictor) == 1  # a group is all predictor or none of it
        if in_predictor.pop():
            assert group["lr"] == pytest.approx(peak)
        else:
            assert group["lr"] < 0.1 * peak  # the cosine schedule's last step
