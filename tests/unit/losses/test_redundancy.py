"""Barlow Twins and VICReg: each loss against a naive float64 loop from its paper, and each paper's ablation."""

import json
import math

import pytest
import torch

from kontrast.losses import barlow_twins_loss, vicreg_loss
from support.reference import naive_barlow_twins, naive_vicreg


def _pair(seed, n=7, d=5, scale=0.6):
    g = torch.Generator().manual_seed(seed)
    z1 = (scale * torch.randn(n, d, generator=g, dtype=torch.float64)).requires_grad_()
    z2 = (z1.detach() + 0.5 * scale * torch.randn(n, d, generator=g, dtype=torch.float64)).requires_grad_()
    return z1, z2


def _value_and_grad(fn, z1, z2):
    value = fn(z1, z2)
    g1, g2 = torch.autograd.grad(value, (z1, z2))
    return float(value.detach()), g1, g2


@pytest.mark.parametrize("lambd", [0.0, 0.0051, 0.5])
@pytest.mark.parametrize("seed", [0, 1])
def test_barlow_twins_matches_the_paper_formula(lambd, seed):
    z1, z2 = _pair(seed)
    got, g1, g2 = _value_and_grad(lambda a, b: barlow_twins_loss(a, b, lambd)[0], z1, z2)
    want, w1, w2 = _value_and_grad(lambda a, b: naive_barlow_twins(a, b, lambd)[0], z1, z2)
    assert got == pytest.approx(want, abs=1e-6, rel=1e-6)
    terms, naive_terms = barlow_twins_loss(z1, z2, lambd)[1:], naive_barlow_twins(z1, z2, lambd)[1:]
    assert [float(t.detach()) for t in terms] == pytest.approx([float(t.detach()) for t in naive_terms], abs=1e-6)
    assert torch.allclose(g1, w1, atol=1e-6) and torch.allclose(g2, w2, atol=1e-6)


@pytest.mark.parametrize("coeffs", [(25.0, 25.0, 1.0), (1.0, 0.0, 1.0), (0.0, 1.0, 0.0)])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("views", ["sum", "mean"])  # Algorithm 1 / solo-learn; the authors' main_vicreg.py
def test_vicreg_matches_algorithm_1(coeffs, seed, views):
    z1, z2 = _pair(seed)  # std ~0.6 < 1: the variance hinge is active
    got = vicreg_loss(z1, z2, *coeffs, variance_views=views)
    want = naive_vicreg(z1, z2, *coeffs, variance_views=views)
    for g, w in zip(got, want):
        assert float(g.detach()) == pytest.approx(float(w.detach()), abs=1e-6, rel=1e-6)
    g1, g2 = torch.autograd.grad(got[0], (z1, z2))
    w1, w2 = torch.autograd.grad(want[0], (z1, z2))
    assert torch.allclose(g1, w1, atol=1e-6) and torch.allclose(g2, w2, atol=1e-6)


def test_redundancy_losses_at_their_optimum_and_under_autocast():
    """Identical decorrelated views: BT's C is the identity (loss ~0); VICReg's invariance and covariance vanish and
    a std above 1 leaves no variance penalty. bf16 autocast keeps both computations in float32."""
    z = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q, _ = torch.linalg.qr(z - z.mean(0))  # [64, 8] orthonormal columns, each of mean 0
    z = (q * math.sqrt(63) * 1.5).float()  # uncorrelated dimensions, each of std 1.5
    assert float(barlow_twins_loss(z, z, 0.0051)[0]) < 1e-4
    total, inv, var, cov = vicreg_loss(z, z, 25.0, 25.0, 1.0)
    assert float(inv) == 0 and float(var) == 0 and float(cov) < 1e-8
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bt = barlow_twins_loss(z.bfloat16(), z.bfloat16() + 0.01, 0.0051)[0]
        vic = vicreg_loss(z.bfloat16(), z.bfloat16(), 25.0, 25.0, 1.0)[0]
    assert bt.dtype == torch.float32 and vic.dtype == torch.float32


# ---------------------------------------------------------------- the papers' ablations


def _vicreg_run(tmp_path, std_coeff: float) -> list[dict]:
    from kontrast.methods.build import resolve
    from kontrast.train.loop import fit

    raw = {"method": {"name": "vicreg", "proj_hidden": 64, "proj_dim": 64, "std_coeff": std_coeff},
           "encoder": {"name": "resnet18", "width": 0.125}, "data": {"source": "shapes:256", "size": 16},
           "optim": {"warmup_epochs": 0.0},
           "train": {"epochs": 5, "batch_size": 32, "log_every": 1, "num_threads": 1, "device": "cpu",
                     "collapse_std": 0.05, "collapse_window": 10}}
    out = tmp_path / f"std{std_coeff:g}"
    fit(resolve(raw), out, progress=False)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_vicreg_without_the_variance_term_collapses_and_the_run_says_so(tmp_path, capsys):
    """Bardes et al. 2022, table 4 / section 4.5: without the variance term (mu = 0) the embeddings collapse. 40 steps
    of the 1/8-width ResNet on shapes at 16 px, d = 64 (healthy embedding_std ~1/sqrt(64) = 0.125), monitor at
    0.05 over 10 steps: the ablation is flagged, the full loss never (measurements: docs/lab/method-tests.md,
    "VICReg")."""
    full = _vicreg_run(tmp_path, 25.0)
    assert not [line for line in full if line.get("warning")]
    ablated = _vicreg_run(tmp_path, 0.0)
    assert [line for line in ablated if line.get("warning") == "collapse"]
    assert "warning: embeddings are collapsing" in capsys.readouterr().err
    std_full = [line["embedding_std"] for line in full if "embedding_std" in line]
    std_ablated = [line["embedding_std"] for line in ablated if "embedding_std" in line]
    assert min(std_full) > 0.08 and std_ablated[0] > 0.08 and max(std_ablated[-5:]) < 0.04, (std_full, std_ablated)
    # the variance term is what the full run pays to stay spread: its hinge is logged, 0 in the ablation's loss
    assert all("variance" in line and "covariance" in line for line in full if "loss" in line)


def _barlow_twins_redundancy(lambd: float, steps: int = 600) -> tuple[list[float], list[float]]:
    """Barlow Twins (the method, a small MLP as its encoder) on 16-d Gaussian inputs whose two views differ by noise
    of std 0.1 .. 1.0 per coordinate: the most invariant feature is coordinate 0. Returns the logged redundancy
    (mean C_ij^2 off the diagonal) and embedding_std per step. Adam, lr 1e-3, batch 128, D = 16."""
    from kontrast.methods.barlow_twins import BarlowTwins, BarlowTwinsParams

    class Encoder(torch.nn.Sequential):
        dim = 32

    torch.manual_seed(0)
    encoder = Encoder(torch.nn.Linear(16, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    method = BarlowTwins(encoder, BarlowTwinsParams(proj_hidden=64, proj_dim=16, lambd=lambd, scale_loss=1.0))
    opt = torch.optim.Adam(method.parameters(), lr=1e-3)
    noise = torch.linspace(0.1, 1.0, 16)
    g = torch.Generator().manual_seed(0)
    redundancy, std = [], []
    for _ in range(steps):
        x = torch.randn(128, 16, generator=g)
        out = method.training_step([x + noise * torch.randn(128, 16, generator=g),
                                    x + noise * torch.randn(128, 16, generator=g)])
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        redundancy.append(float(out["redundancy"]))
        std.append(float(out["embedding_std"]))
    return redundancy, std


def test_barlow_twins_without_the_off_diagonal_term_makes_every_dimension_the_same_feature():
    """Zbontar et al. 2021, table 4: the invariance term alone (lambda = 0) does not collapse (57.3% top-1 against
    71.4%, chance 0.1%) but loses what the redundancy-reduction term buys: decorrelated dimensions. Standardised
    per dimension, no output can go constant, so the collapse monitor stays silent (embedding_std ~1/sqrt(16) both
    ways); instead every dimension drifts to the same most-invariant feature, which the logged redundancy shows
    (measurements: docs/lab/method-tests.md, "Barlow Twins")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is 20x faster than two on a busy machine
    try:
        with_term, std_with = _barlow_twins_redundancy(0.0051)
        without, std_without = _barlow_twins_redundancy(0.0)
    finally:
        torch.set_num_threads(threads)
    late_with, late_without = sum(with_term[-20:]) / 20, sum(without[-20:]) / 20
    print("Barlow Twins redundancy, last 20 steps: lambda 0.0051", late_with, "lambda 0", late_without)
    assert late_without > 0.5 > 0.15 > late_with, (late_with, late_without)
    assert min(std_with[-20:] + std_without[-20:]) > 0.2  # 1/sqrt(16) = 0.25: nothing for the monitor to flag


@pytest.mark.parametrize("name", ["barlow_twins", "vicreg"])
def test_views_go_through_batchnorm_separately_and_blocks_start_as_identity(name):
    """As the authors' ``forward(y1, y2)``: every BatchNorm (encoder and projector) sees the B samples of one view,
    never a 2B batch of both; and their ResNet(zero_init_residual=True) is the default."""
    from kontrast.augment import make_views
    from kontrast.decisions import view_specs
    from kontrast.methods.build import create_method, resolve

    cfg = resolve({"method": {"name": name, "proj_hidden": 32, "proj_dim": 32}, "encoder": {"width": 0.125}})
    assert cfg.encoder.zero_init_residual
    method = create_method(cfg).train()
    views = make_views(torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8), view_specs(cfg),
                       torch.Generator().manual_seed(0))
    seen: dict[str, list[int]] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, args, n=n: seen.setdefault(n, []).append(args[0].shape[0]))
             for n, m in method.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    method.training_step(views)
    for h in hooks:
        h.remove()
    assert len(seen) == len(hooks) and any(n.startswith("projector.") for n in seen)
    assert all(sizes == [8, 8] for sizes in seen.values()), {n: s for n, s in seen.items() if s != [8, 8]}


def test_vicreg_variance_views_mean_halves_only_the_variance_term():
    z1, z2 = _pair(0)
    total_sum, inv, var_sum, cov = (t.detach() for t in vicreg_loss(z1, z2, 25.0, 25.0, 1.0))
    total_mean, inv2, var_mean, cov2 = (t.detach() for t in vicreg_loss(z1, z2, 25.0, 25.0, 1.0, variance_views="mean"))
    assert float(var_sum) > 0 and float(var_mean) == pytest.approx(float(var_sum) / 2)
    assert (float(inv2), float(cov2)) == (float(inv), float(cov))
    assert float(total_sum - total_mean) == pytest.approx(25.0 * float(var_sum) / 2)
