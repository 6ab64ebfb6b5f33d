"""CPC (v1, v2), AMDIM, YADIM and their rooms: naive float64 references for scores and losses,
exact patch grids and translations, autoregressive masking, the MI bound, CPC on sequences."""

import json
import math

import pytest
import torch
from safetensors.torch import save

from kontrast.augment.ops import sample_translation, translate_reflect
from kontrast.augment.patches import grid_size, patch_grid
from kontrast.data import load_images
from kontrast.data.sequences import SEQUENCE_CLASSES, make_sequences
from kontrast.decisions import check_inputs, view_specs
from kontrast.encoders import create_encoder
from kontrast.errors import UserError
from kontrast.evaluate.run import evaluate_run
from kontrast.extract import GridContext, GRUContext, PooledContext
from kontrast.losses import info_nce, mi_bound, nce_shared_negatives, score_penalty
from kontrast.losses.local import global_local_nce, pooled_info_nce, positional_nce
from kontrast.methods import METHODS
from kontrast.methods.build import create_method, resolve
from kontrast.similarity import bilinear, scaled_dot, soft_clip
from kontrast.train.loop import fit
from support.reference import naive_shared_negatives

G = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=G, dtype=torch.float64)


# ----------------------------------------------------------------------------- scores


def test_bilinear_matches_zT_W_c():
    c, z, w = rand(4, 3), rand(5, 6), rand(6, 3)  # context [N, Dc], candidates [M, Dz], W [Dz, Dc]
    expect = torch.tensor([[float(z[j] @ w @ c[i]) for j in range(5)] for i in range(4)], dtype=torch.float64)
    assert torch.allclose(bilinear(c, z, w), expect, rtol=1e-12, atol=1e-12)


def test_scaled_dot_and_soft_clip_match_amdim_formulas():
    a, b = rand(3, 8), rand(4, 8)
    raw = scaled_dot(a, b).double()
    expect = torch.tensor([[float(a[i] @ b[j]) / math.sqrt(8) for j in range(4)] for i in range(3)],
                          dtype=torch.float64)
    assert torch.allclose(raw, expect, atol=1e-5)  # scaled_dot computes in fp32
    s = rand(50) * 30
    clipped = soft_clip(s, 20.0)
    assert torch.allclose(clipped, torch.tensor([20 * math.tanh(float(x) / 20) for x in s], dtype=torch.float64))
    assert clipped.abs().max() < 20 and torch.allclose(soft_clip(s * 1e-4, 20.0), s * 1e-4, rtol=1e-6)


# ----------------------------------------------------------------------------- losses


def test_nce_shared_negatives_matches_per_pair_formula():
    scores = rand(4, 9)
    pos = torch.rand(4, 9, generator=G) < 0.3
    pos[:, 0] = True  # every row has a positive
    neg = ~pos & (torch.rand(4, 9, generator=G) < 0.8)  # some pairs are neither (ignored)
    got = nce_shared_negatives(scores, pos, neg).item()
    assert got == pytest.approx(naive_shared_negatives(scores, pos, neg), rel=1e-6)
    assert nce_shared_negatives(scores, pos).item() == \
        pytest.approx(naive_shared_negatives(scores, pos, ~pos), rel=1e-6)


def test_global_local_nce_is_amdims_loss():
    """AMDIM: global of image i vs all L locations of each image; positives = image i's locations."""
    b, r, h, w, clip = 3, 5, 2, 2, 4.0
    anchors, maps = rand(b, r), rand(b, r, h, w) * 3
    loss, raw = global_local_nce(anchors, maps, clip)
    cands = [maps[j, :, y, x] for j in range(b) for y in range(h) for x in range(w)]  # item-major, row-major
    naive_raw = torch.tensor([[float(anchors[i] @ c) / math.sqrt(r) for c in cands] for i in range(b)],
                             dtype=torch.float64)
    assert torch.allclose(raw.double(), naive_raw, atol=1e-5)
    clipped = clip * torch.tanh(naive_raw / clip)
    pos = torch.tensor([[j // (h * w) == i for j in range(b * h * w)] for i in range(b)])
    assert loss.item() == pytest.approx(naive_shared_negatives(clipped, pos, ~pos), rel=1e-5)
    assert score_penalty(raw).item() == pytest.approx(float((naive_raw**2).mean()), rel=1e-5)
    assert positional_nce(soft_clip(raw, clip), torch.arange(b), h * w).item() == pytest.approx(loss.item())


@pytest.mark.parametrize("pool", [1, 2, 3, 8])
def test_pooled_info_nce_matches_naive_cpc_loss(pool):
    """Anchor p of item b must pick candidate targets[p] of item b among every candidate in its pool."""
    b, p, q, da, dc = 5, 3, 4, 2, 3
    anchors, cands, w = rand(b, p, da), rand(b, q, dc), rand(dc, da)
    targets = torch.tensor([1, 2, 3])
    loss, n = pooled_info_nce(anchors, cands, targets, lambda a, c: bilinear(a, c, w), pool)
    total = 0.0
    for item in range(b):
        group = range(item // pool * pool, min(b, item // pool * pool + pool))
        for pos in range(p):
            pred = w @ anchors[item, pos]  # [dc]
            logits = [float(cands[g, m] @ pred) for g in group for m in range(q)]
            right = list(group).index(item) * q + int(targets[pos])
            total += -(logits[right] - math.log(sum(math.exp(x) for x in logits)))
    assert loss.item() == pytest.approx(total / (b * p), rel=1e-6)
    assert n == min(pool, b) * q


def test_mi_bound_is_log_n_minus_loss():
    scores, positives = rand(6, 10), torch.arange(6)
    loss = info_nce(scores, positives)
    assert mi_bound(loss, 10).item() == pytest.approx(math.log(10) - loss.item(), rel=1e-6)
    perfect = info_nce(torch.eye(6, 10, dtype=torch.float64) * 100, positives)
    assert mi_bound(perfect, 10).item() == pytest.approx(math.log(10), abs=1e-6)  # saturates at log N
    assert not mi_bound(loss.requires_grad_(), 10).requires_grad


# ----------------------------------------------------------------------------- augment: patch grid, translation


@pytest.mark.parametrize("size,patch,stride", [(32, 8, 4), (32, 16, 8), (13, 4, 3), (8, 8, 1)])
def test_patch_grid_is_exact(size, patch, stride):
    x = torch.randint(0, 256, (2, 3, size, size + 3), generator=G).float()
    grid = patch_grid(x, patch, stride)
    gh, gw = (size - patch) // stride + 1, (size + 3 - patch) // stride + 1
    assert grid.shape == (2, gh, gw, 3, patch, patch) and gh == grid_size(size, patch, stride)
    for i in range(gh):
        for j in range(gw):
            assert torch.equal(grid[:, i, j], x[:, :, i * stride : i * stride + patch, j * stride : j * stride + patch])


def test_patch_grid_refuses_bad_sizes():
    with pytest.raises(UserError, match="patch"):
        patch_grid(torch.zeros(1, 3, 8, 8), 9, 4)
    with pytest.raises(UserError, match="patch"):
        patch_grid(torch.zeros(1, 3, 8, 8), 4, 0)


def test_translate_reflect_matches_pixel_formula():
    x = torch.rand(3, 2, 6, 7, generator=G)
    shifts = torch.tensor([[0, 0], [2, -1], [-3, 3]])
    out = translate_reflect(x, shifts, 3)
    assert torch.equal(out[0], x[0])  # zero shift: bit for bit

    def reflect(i, n):  # torch "reflect" padding: mirror without repeating the edge
        return -i if i < 0 else (2 * (n - 1) - i if i >= n else i)

    for b in (1, 2):
        dy, dx = shifts[b].tolist()
        for y in range(6):
            for xx in range(7):
                assert torch.equal(out[b, :, y, xx], x[b, :, reflect(y - dy, 6), reflect(xx - dx, 7)])


def test_sample_translation_range_and_probability():
    g = torch.Generator().manual_seed(1)
    s = sample_translation(4000, 4, 0.8, g)
    assert s.dtype == torch.long and s.abs().max() == 4 and set(s.unique().tolist()) == set(range(-4, 5))
    moved = (s != 0).any(dim=1).float().mean().item()
    assert 0.75 < moved < 0.82  # p = 0.8, minus the 1/81 of draws that land on (0, 0)
    assert not sample_translation(100, 4, 0.0, g).any()


# ----------------------------------------------------------------------------- autoregressive masking


def test_gru_context_never_sees_the_future():
    ctx = GRUContext(4, 6).double()
    z = rand(2, 10, 4)
    c = ctx(z)
    for t in range(9):
        future = z.clone()
        future[:, t + 1 :] = rand(2, 9 - t, 4) * 100  # perturb every later step
        assert torch.equal(ctx(future)[:, : t + 1], c[:, : t + 1])
        assert not torch.equal(ctx(future)[:, t + 1 :], c[:, t + 1 :])


@pytest.mark.parametrize("name", ["conv1d", "cpc_audio"])
def test_cpc_context_at_t_never_sees_samples_after_its_receptive_field(name):
    """c_t depends on raw samples < t·S + R only (S: total stride, R: receptive field), bit for bit."""
    enc = create_encoder(name, width=1 / 32)
    model = PooledContext(enc, GRUContext(enc.dim, 8)).train()  # train mode: no batch statistics anywhere
    length = enc.receptive_field + 9 * enc.stride
    x = torch.randn(3, 1, length, generator=G)
    z, c = model.forward_sequence(x)
    assert z.shape[1] == 10
    for t in (0, 4, 8):
        end = t * enc.stride + enc.receptive_field  # first sample z_t does not see
        future = x.clone()
        future[:, :, end:] = torch.randn(3, 1, length - end, generator=G) * 10
        _, c2 = model.forward_sequence(future)
        assert torch.equal(c2[:, : t + 1], c[:, : t + 1])
        assert not torch.equal(c2[:, t + 1 :], c[:, t + 1 :])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grid_context_row_i_never_sees_lower_rows(dtype):
    ctx = GridContext(5, 7, blocks=3).to(dtype)
    z = torch.randn(2, 5, 7, 7, generator=G, dtype=dtype)
    c = ctx(z)
    for i in range(6):
        below = z.clone()
        below[:, :, i + 1 :] = torch.randn(2, 5, 6 - i, 7, generator=G, dtype=dtype) * 100
        c2 = ctx(below)
        assert torch.equal(c2[:, :, : i + 1], c[:, :, : i + 1])
        assert not torch.equal(c2[:, :, i + 1 :], c[:, :, i + 1 :])


def test_cpc_v2_predictions_come_from_rows_above_their_targets():
    """Through the whole method: perturbing patch rows >= i + min_offset leaves the context rows <= i intact."""
    cfg = resolve({"method": {"name": "cpc_v2", "context_blocks": 2}, "encoder": {"width": 0.125}})
    method = create_method(cfg).eval()  # eval: BatchNorm uses running statistics, no batch mixing
    x = torch.randn(2, 3, 32, 32, generator=G)
    z = method.encoder.forward_grid(x)
    c = method.context(z)
    z2 = z.clone()
    z2[:, :, 4:] += 5.0  # targets of context rows <= 1 at offsets >= 3 ... and everything below
    assert torch.equal(method.context(z2)[:, :, :4], c[:, :, :4])


# ----------------------------------------------------------------------------- encoders


def test_resnet_forward_maps():
    enc = create_encoder("resnet18", width=0.125).eval()
    x = torch.randn(2, 3, 32, 32, generator=G)
    maps = enc.forward_maps(x)
    assert [m.shape[1:] for m in maps] == [(c, s, s) for c, s in zip(enc.map_dims, (32, 16, 8, 4))]
    assert torch.equal(maps[-1], enc.forward_features(x))


def test_amdim_encoder_scales():
    enc = create_encoder("amdim", width=0.125).eval()
    maps = enc.forward_maps(torch.randn(2, 3, 32, 32, generator=G))
    assert [tuple(m.shape[1:]) for m in maps] == [(enc.map_dims[0], 7, 7), (enc.map_dims[1], 5, 5), (enc.dim, 1, 1)]
    with pytest.raises(UserError, match="stem"):
        create_encoder("amdim", stem="imagenet")


@pytest.mark.parametrize("dim_in, dim_out", [(8, 16), (16, 16), (16, 8)])
def test_local_projection_is_the_authors_residual_block_at_init(dim_in, dim_out):
    """AMDIM's ``FakeRKHSConvNet`` (Philip-Bachman/amdim-public, model.py): ``BN(shortcut(x) + W2 ReLU(BN(W1 x)))``
    with the residual branch's last conv zero at init and the shortcut an identity (plus U(-0.01, 0.01)) where
    ``dim_out >= dim_in``: at init the head is BN(shortcut(x)), and x itself on the first channels up to the BN."""
    from kontrast.extract import LocalProjection

    torch.manual_seed(0)
    proj = LocalProjection(dim_in, dim_out)
    x = torch.randn(6, dim_in, 3, 3)
    w = proj.shortcut.weight[:, :, 0, 0].detach()  # [dim_out, dim_in]
    skip = torch.einsum("oi,bihw->bohw", w, x) + proj.shortcut.bias.detach().view(1, -1, 1, 1)
    mean, var = skip.mean(dim=(0, 2, 3), keepdim=True), skip.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    with torch.no_grad():
        y = proj.train()(x)
    assert torch.allclose(y, (skip - mean) / torch.sqrt(var + 1e-5), atol=1e-4)  # branch silent, BN on the output
    if dim_out >= dim_in:
        assert torch.equal(w[:dim_in].diagonal(), torch.ones(dim_in))
        off = w - torch.eye(dim_out, dim_in)
        assert off.abs().max() <= 0.01
        with torch.no_grad():  # fresh running statistics (mean 0, var 1): the output is x on its first channels, +-1%
            bias = proj.shortcut.bias.detach()[:dim_in].view(1, -1, 1, 1)
            y = proj.eval()(x)[:, :dim_in] - bias / math.sqrt(1 + 1e-5)
        assert torch.allclose(y, x / math.sqrt(1 + 1e-5), atol=0.01 * dim_in * x.abs().max().item())
    (proj.train()(x) * torch.randn(6, dim_out, 3, 3)).sum().backward()  # the zero conv still learns
    assert proj.body[-1].weight.grad.abs().max() > 1e-3


# ----------------------------------------------------------------------------- methods


@pytest.mark.parametrize("name", ["simclr", "moco_v2", "cpc_v2", "amdim", "yadim"])
def test_infonce_methods_report_the_bound_and_byol_does_not(name):
    cfg = resolve({"method": {"name": name}, "encoder": {"width": 0.125}})
    method = create_method(cfg)
    from kontrast.augment import make_views

    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=G)
    out = method.training_step(make_views(images, view_specs(cfg), torch.Generator().manual_seed(0)))
    assert torch.isfinite(out["mi_bound"]) and out["mi_bound"].ndim == 0
    byol_cfg = resolve({"method": {"name": "byol"}, "encoder": {"width": 0.125}})
    byol = create_method(byol_cfg)
    views = make_views(images, view_specs(byol_cfg), torch.Generator().manual_seed(0))
    assert "mi_bound" not in byol.training_step(views)


def test_bound_matches_loss_for_single_comparison_methods():
    cfg = resolve({"method": {"name": "yadim", "score_reg": 0.0}, "encoder": {"width": 0.125}})
    method = create_method(cfg)
    from kontrast.augment import make_views

    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=G)
    out = method.training_step(make_views(images, view_specs(cfg), torch.Generator().manual_seed(0)))
    assert out["mi_bound"].item() == pytest.approx(math.log(1 + 5 * 1) - out["loss"].item(), rel=1e-5)  # 1x1 last map


def test_cpc_smoke_step_on_sequences():
    cfg = resolve({"method": {"name": "cpc", "steps": 4}, "encoder": {"width": 1 / 16}})
    assert cfg.data.source == "sequences" and cfg.encoder.name == "conv1d"  # the method's defaults
    method = create_method(cfg)
    assert method.recipe is None and view_specs(cfg) == ()
    x, _ = make_sequences(8, seed=3)
    before = [p.detach().clone() for p in method.parameters()]
    out = method.training_step([x])
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    assert out["loss"].item() == pytest.approx(math.log(8 * 62), rel=1e-2)  # W_k ~ 0: candidates score alike
    assert out["mi_bound"].item() == pytest.approx(math.log(8 * 62) - out["loss"].item(), abs=1e-5)
    out["loss"].backward()
    assert method.predictors.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in method.encoder.parameters())
    with torch.no_grad():
        for p in method.parameters():
            if p.grad is not None:
                p.sub_(0.1 * p.grad)
    assert any(not torch.equal(a, b) for a, b in zip(before, method.parameters()))
    assert method.encoder(x).shape == (8, 256)  # evaluation reads the pooled context
    save(dict(method.state_dict()))


def test_sequences_data_and_input_checks():
    x, y = make_sequences(50, seed=0)
    assert x.shape == (50, 1, 1024) and x.dtype == torch.float32 and y.bincount().tolist() == [5] * 10
    assert torch.equal(make_sequences(50, seed=0)[0], x) and not torch.equal(make_sequences(50, seed=1)[0], x)
    data = load_images("sequences:50", "test")
    assert len(data) == 10 and data.classes == list(SEQUENCE_CLASSES)
    with pytest.raises(UserError, match="sequences:N"):
        load_images("sequences:x", "train")
    cpc = resolve({"method": {"name": "cpc"}, "encoder": {"width": 1 / 16}})
    simclr = resolve({"encoder": {"width": 0.125}})
    with pytest.raises(UserError, match="--data sequences"):
        check_inputs(cpc, load_images("shapes:10", "train"))
    with pytest.raises(UserError, match="holds sequences"):
        check_inputs(simclr, data)
    with pytest.raises(UserError, match="augment"):
        view_specs(resolve({"method": {"name": "cpc"}, "augment": {"recipe": "byol"}}))


def test_cpc_trains_and_evaluates_through_the_loop(tmp_path):
    raw = {"method": {"name": "cpc", "steps": 3}, "encoder": {"width": 1 / 16}, "data": {"source": "sequences:40"},
           "train": {"epochs": 1, "batch_size": 8, "log_every": 1, "knn_every": 1}}
    summary = fit(resolve(raw), tmp_path / "run", progress=False)
    assert summary["steps"] == 5
    lines = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert all("mi_bound" in line for line in lines if "loss" in line)
    assert [line["epoch"] for line in lines if "knn_top1" in line] == [0, 1]
    result = evaluate_run(tmp_path / "run")
    assert 0 <= result["knn_top1"] <= 1 and 0 <= result["linear_top1"] <= 1
    with pytest.raises(UserError, match="sequences"):
        evaluate_run(tmp_path / "run", "shapes:10")


@pytest.mark.slow
def test_cpc_learns_on_sequences(tmp_path):
    """Loss falls and kNN top-1 of the pooled context beats chance (0.1) and the untrained network.

    Smaller than the paper (K = 6, 128-unit GRU, 64 channels) and Adam at 2e-3, for a 186-step budget
    (measurements: docs/lab/method-tests.md, "CPC").
    """
    raw = {"method": {"name": "cpc", "steps": 6, "context_dim": 128}, "encoder": {"width": 0.125},
           "data": {"source": "sequences:2000"}, "optim": {"lr": 2e-3},
           "train": {"epochs": 3, "batch_size": 32, "log_every": 10, "knn_every": 3, "num_threads": 1}}
    fit(resolve(raw), tmp_path / "run", progress=False)
    lines = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in lines if "loss" in line]
    knn = [line["knn_top1"] for line in lines if "knn_top1" in line]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    print("cpc kNN untrained -> trained:", knn)
    assert knn[-1] > 2 * 0.1 and knn[-1] > knn[0] + 0.02, knn


def test_sequence_methods_are_registered_with_their_own_tests():
    sequence_methods = [n for n in METHODS.names() if METHODS.get(n).recipe is None]
    assert sequence_methods == ["cpc"]  # tests/unit/methods/test_methods.py covers the image methods
