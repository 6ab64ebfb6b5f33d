"""Theory lab: graph spectra by hand, clustering scores, the spectral experiment, the MI bound,
representation diagnostics, and the CLI commands."""

import itertools
import json
import math

import pytest
import torch

from kontrast.cli import main
from kontrast.evaluate.clustering import adjusted_rand_index, kmeans
from kontrast.evaluate.diagnostics import (
    alignment,
    covariance_spectrum,
    effective_rank,
    normalized_std,
    positive_mass,
    similarity_graph_spectrum,
    uniformity,
)
from kontrast.theory.mi import MIConfig, optimal_scores, run_mi, true_mi
from kontrast.theory.spectral import SpectralConfig, run_spectral, spectral_alignment, subspace_alignment
from kontrast.theory.world import (
    graph,
    make_world,
    normalized_adjacency,
    sample_pairs,
    spectral_clustering,
    spectral_embedding,
)

# ---------------------------------------------------------------- graphs by hand


def test_two_triangles_have_a_double_top_eigenvalue_spanned_by_the_triangles():
    tri = torch.ones(3, 3) - torch.eye(3)
    w = torch.block_diag(tri, tri)  # two disconnected triangles, every degree 2
    values, vectors = spectral_embedding(w, 6)
    # (A/2) of a triangle: 1 and -1/2 twice; two copies
    assert torch.allclose(values, torch.tensor([1, 1, -0.5, -0.5, -0.5, -0.5], dtype=torch.float64), atol=1e-12)
    indicators = torch.tensor([[1, 0]] * 3 + [[0, 1]] * 3, dtype=torch.float64)
    assert subspace_alignment(indicators, vectors[:, :2]) == pytest.approx(1.0, abs=1e-12)
    assert adjusted_rand_index(spectral_clustering(w, 2), torch.tensor([0, 0, 0, 1, 1, 1])) == 1.0


def test_path_of_three_scales_the_top_eigenvector_by_sqrt_degree():
    w = torch.tensor([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=torch.float64)  # degrees 1, 2, 1
    expected = torch.tensor([[0, 1 / math.sqrt(2), 0], [1 / math.sqrt(2), 0, 1 / math.sqrt(2)],
                             [0, 1 / math.sqrt(2), 0]], dtype=torch.float64)
    assert torch.allclose(normalized_adjacency(w), expected, atol=1e-15)
    values, vectors = spectral_embedding(w, 3)
    assert torch.allclose(values, torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64), atol=1e-12)
    top = torch.tensor([1, math.sqrt(2), 1], dtype=torch.float64) / 2  # sqrt(degree / total)
    assert torch.allclose(vectors[:, 0].abs(), top, atol=1e-12)
    bottom = torch.tensor([1, -math.sqrt(2), 1], dtype=torch.float64) / 2
    assert torch.allclose(vectors[:, 2] * torch.sign(vectors[0, 2]), bottom, atol=1e-12)


def test_four_cycle_spectrum():
    w = torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]], dtype=torch.float64)
    values, vectors = spectral_embedding(w, 4)
    assert torch.allclose(values, torch.tensor([1.0, 0.0, 0.0, -1.0], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(vectors[:, 3].abs(), torch.full((4,), 0.5, dtype=torch.float64), atol=1e-12)
    assert (vectors[0, 3] * vectors[1, 3]) < 0  # alternating signs: the bipartite eigenvector


def test_graph_rejects_bad_weights():
    with pytest.raises(ValueError, match="symmetric"):
        graph(torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="zero degree"):
        graph(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_world_adjacency_is_a_joint_distribution_and_pairs_follow_it():
    world = make_world(n=24, k=3, seed=1)
    pi = world.adjacency
    assert torch.allclose(pi, pi.T) and (pi >= 0).all() and pi.sum().item() == pytest.approx(1.0, abs=1e-12)
    i, j = sample_pairs(world, 200_000, torch.Generator().manual_seed(0))
    freq = torch.bincount(i * world.n + j, minlength=world.n**2).double().view(world.n, world.n) / len(i)
    assert (freq - pi).abs().max() < 4 * math.sqrt(pi.max() / len(i))  # within ~4 binomial sds


# ---------------------------------------------------------------- clustering scores


def pair_counting_ari(a, b):
    """ARI from the pair-counting 2x2 table (Hubert & Arabie 1985), one pair at a time."""
    same_same = same_diff = diff_same = diff_diff = 0
    for p, q in itertools.combinations(range(len(a)), 2):
        sa, sb = a[p] == a[q], b[p] == b[q]
        same_same += sa and sb
        same_diff += sa and not sb
        diff_same += sb and not sa
        diff_diff += not sa and not sb
    num = 2 * (same_same * diff_diff - same_diff * diff_same)
    den = (same_same + same_diff) * (same_diff + diff_diff) + (same_same + diff_same) * (diff_same + diff_diff)
    return num / den


@pytest.mark.parametrize("seed", range(4))
def test_ari_matches_pair_counting(seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randint(0, 3, (40,), generator=g), torch.randint(0, 4, (40,), generator=g)
    b[:20] = a[:20]  # some agreement
    assert adjusted_rand_index(a, b) == pytest.approx(pair_counting_ari(a.tolist(), b.tolist()), abs=1e-12)


def test_ari_ignores_label_names_and_kmeans_finds_separated_blobs():
    labels = torch.arange(4).repeat_interleave(25)  # [100]
    assert adjusted_rand_index(labels, (labels + 2) % 4) == 1.0
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0], [10, 0], [0, 10], [10, 10]])
    x = centres[labels] + 0.5 * torch.randn(100, 2, generator=g)
    assert adjusted_rand_index(kmeans(x, 4), labels) == 1.0


def test_subspace_alignment_is_invariant_to_linear_maps_and_counts_shared_directions():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(30, 3, generator=g, dtype=torch.float64)
    mix = torch.randn(3, 3, generator=g, dtype=torch.float64) + 3 * torch.eye(3, dtype=torch.float64)
    assert subspace_alignment(a @ mix, a) == pytest.approx(1.0, abs=1e-10)
    e = torch.eye(30, dtype=torch.float64)
    assert subspace_alignment(e[:, :1], e[:, 1:3]) == pytest.approx(0.0, abs=1e-12)
    assert subspace_alignment(e[:, :1], e[:, :2]) == pytest.approx(0.5, abs=1e-12)


# ---------------------------------------------------------------- the spectral experiment


def test_spectral_loss_learns_the_top_eigenvectors_up_to_a_linear_map():
    cfg = SpectralConfig(n=120, losses=("spectral",), encoders=("table",), steps=400, eval_every=100)
    result = run_spectral(cfg)
    (curve,) = result.curves
    assert curve.alignment[0] < 0.3 and curve.alignment[-1] >= 0.99
    assert curve.ari[-1] >= 0.95
    # HaoChen et al., Thm 3.2: F = sqrt(D) f satisfies F F^T = U_k Lambda_k U_k^T (rank-k part of the graph)
    world = result.world
    values, vectors = spectral_embedding(world.adjacency, cfg.k)
    f = world.degrees.sqrt()[:, None] * curve.embedding  # [n, k]
    target = vectors @ torch.diag(values) @ vectors.T  # [n, n]
    assert ((f @ f.T - target).norm() / target.norm()).item() < 0.05
    assert subspace_alignment(f, vectors) >= 0.99  # linear (no bias), all k eigenvectors


def test_spectral_alignment_of_the_exact_solution_is_one_and_of_noise_is_small():
    world = make_world(n=80, k=4, seed=3)
    values, vectors = spectral_embedding(world.adjacency, 4)
    exact = world.degrees.rsqrt()[:, None] * vectors @ torch.randn(4, 4, dtype=torch.float64)  # D^-1/2 U R
    assert spectral_alignment(exact, world, vectors) == pytest.approx(1.0, abs=1e-9)
    noise = torch.randn(80, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert spectral_alignment(noise, world, vectors) < 0.3


# ---------------------------------------------------------------- the MI bound


def test_true_mi_matches_gaussian_entropies():
    rho, d = 0.6, 3
    joint = torch.tensor([[1.0, rho], [rho, 1.0]], dtype=torch.float64)
    per_pair = -0.5 * torch.logdet(joint).item()  # h(x) + h(y) - h(x, y) for unit variances
    assert true_mi(d, rho) == pytest.approx(d * per_pair, rel=1e-12)


def test_optimal_scores_are_the_log_density_ratio_up_to_a_row_constant():
    rho = 0.7
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 5, 3, generator=g, dtype=torch.float64)
    y = torch.randn(1, 5, 3, generator=g, dtype=torch.float64)
    s = 1 - rho * rho
    log_cond = -((y[0][None] - rho * x[0][:, None]) ** 2).sum(-1) / (2 * s) - 1.5 * math.log(2 * math.pi * s)
    log_marg = -(y[0] ** 2).sum(-1)[None] / 2 - 1.5 * math.log(2 * math.pi)
    diff = optimal_scores(x, y, rho)[0] - (log_cond - log_marg)  # [5, 5]
    assert torch.allclose(diff, diff[:, :1].expand_as(diff), atol=1e-10)


def test_infonce_estimate_stays_below_true_mi_for_every_n():
    cfg = MIConfig(dim=10, rho=0.8, ns=(2, 8, 64, 256), steps=120, pairs=512, eval_pairs=8192)
    summary = run_mi(cfg)
    truth = summary["true_mi"]
    estimates = [r["estimate"] for r in summary["rows"]]
    for r in summary["rows"]:
        assert r["estimate"] < truth and r["optimal_critic"] < truth, r
        assert r["estimate"] <= r["log_n"]
        slack = 4 * math.hypot(r["estimate_stderr"], r["optimal_critic_stderr"])
        assert r["estimate"] <= r["optimal_critic"] + slack, r  # the density ratio is the best critic
    assert estimates == sorted(estimates)  # more candidates, a higher bound
    assert estimates[0] > 0.85 * math.log(2)  # the critic learned: small N saturates at log N


# ---------------------------------------------------------------- diagnostics on hand-made embeddings


def test_constant_embeddings_are_collapsed():
    z = torch.ones(50, 8) * torch.tensor([3.0, -1, 0, 0, 2, 0, 0, 1])
    assert normalized_std(z) == pytest.approx(0.0, abs=1e-7)
    assert uniformity(z) == pytest.approx(0.0, abs=1e-12)  # the maximum: log mean exp(0)
    assert alignment(z, z) == 0.0
    assert effective_rank(z) == 0.0


def sphere_uniformity(d: int, t: float = 2.0) -> float:
    """log E exp(-t |u - v|^2) for u, v uniform on S^(d-1), by 1-D integration over c = u.v."""
    c = torch.linspace(-1, 1, 200_001, dtype=torch.float64)
    density = (1 - c * c).clamp_min(0) ** ((d - 3) / 2)
    return math.log(torch.trapezoid(torch.exp(-t * (2 - 2 * c)) * density, c) / torch.trapezoid(density, c))


def test_isotropic_gaussian_embeddings():
    d = 16
    z = torch.randn(4000, d, generator=torch.Generator().manual_seed(0))
    assert normalized_std(z) == pytest.approx(1 / math.sqrt(d), rel=0.02)
    assert effective_rank(z) == pytest.approx(d, rel=0.02)
    assert uniformity(z[:1500]) == pytest.approx(sphere_uniformity(d), abs=0.05)


def test_alignment_and_uniformity_match_naive_loops():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(7, 4, generator=g, dtype=torch.float64), torch.randn(7, 4, generator=g, dtype=torch.float64)
    u1, u2 = [r / r.norm() for r in z1], [r / r.norm() for r in z2]
    assert alignment(z1, z2) == pytest.approx(sum(float((a - b).norm() ** 2) for a, b in zip(u1, u2)) / 7, abs=1e-12)
    total = sum(math.exp(-2 * float((u1[i] - u1[j]).norm() ** 2)) for i in range(7) for j in range(7) if i != j)
    assert uniformity(z1) == pytest.approx(math.log(total / 42), abs=1e-12)


def test_effective_rank_and_covariance_spectrum_of_a_flat_plane():
    z = torch.tensor([[1.0, 1, 0, 0], [1, -1, 0, 0], [-1, 1, 0, 0], [-1, -1, 0, 0]])
    assert torch.allclose(covariance_spectrum(z), torch.tensor([4 / 3, 4 / 3, 0, 0], dtype=torch.float64), atol=1e-12)
    assert effective_rank(z) == pytest.approx(2.0, abs=1e-12)


def test_similarity_graph_of_two_antipodal_clusters():
    z = torch.cat([torch.tensor([[1.0, 0, 0]]).repeat(5, 1), torch.tensor([[-1.0, 0, 0]]).repeat(5, 1)])
    spectrum = similarity_graph_spectrum(z, temperature=0.05)
    # each cluster: (J - I) / 4 -> eigenvalues 1 and -1/4 (x4); cross weights exp(-40) vanish
    expected = torch.tensor([1.0, 1.0] + [-0.25] * 8, dtype=torch.float64)
    assert torch.allclose(spectrum, expected, atol=1e-9)
    views = torch.eye(6)  # orthogonal, each view identical to its partner
    assert positive_mass(views, views, temperature=0.05) == pytest.approx(1.0, abs=1e-6)


# ---------------------------------------------------------------- CLI


def test_cli_theory_spectral_and_mi(tmp_path, capsys):
    assert main(["theory", "spectral", "--out", str(tmp_path), "--n", "40", "--steps", "20", "--eval-every", "10",
                 "--losses", "spectral,laplacian", "--encoders", "table,mlp"]) == 0
    summary = json.loads((tmp_path / "spectral.json").read_text())
    assert [(r["encoder"], r["loss"]) for r in summary["final"]] == [
        ("table", "spectral"), ("table", "laplacian"), ("mlp", "spectral"), ("mlp", "laplacian")]
    assert all(0 <= r["alignment"] <= 1 + 1e-9 and len(r) for r in summary["final"])
    assert (tmp_path / "spectral.png").stat().st_size > 10_000
    assert main(["theory", "mi", "--out", str(tmp_path), "--ns", "2,8", "--steps", "5", "--eval-pairs", "256"]) == 0
    mi = json.loads((tmp_path / "mi.json").read_text())
    assert [r["n"] for r in mi["rows"]] == [2, 8]
    assert (tmp_path / "mi.png").stat().st_size > 10_000
    assert "wrote" in capsys.readouterr().out


def test_cli_theory_bad_input_is_one_line(capsys, tmp_path):
    assert main(["theory", "spectral", "--losses", "infonce,nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown loss nope" in err[0]
    assert main(["theory", "mi", "--ns", "1,4", "--out", str(tmp_path)]) == 2
    assert "N must be >= 2" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_cli_diagnose_a_trained_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--method", "simclr", "--data", "shapes:256", "--epochs", "1", "--batch-size", "64",
                 "--out", str(run), "--set", "encoder.width=0.125", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["diagnose", "--checkpoint", str(run), "--limit", "40", "--graph-size", "16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_images"] == 40 and result["graph_views"] == 32 and result["dim"] == 64
    assert -4.5 < result["uniformity"] <= 0 and 0 <= result["alignment"] <= 4
    assert len(result["graph_eigenvalues"]) == 32 and result["graph_eigenvalues"][0] == pytest.approx(1.0)
    assert (run / "diagnostics" / "diagnostics.png").is_file()
    assert json.loads((run / "diagnostics" / "diagnostics.json").read_text())["alignment"] == result["alignment"]
    assert main(["diagnose", "--checkpoint", str(tmp_path / "missing")]) == 2
    assert "checkpoint path not found" in capsys.readouterr().err
