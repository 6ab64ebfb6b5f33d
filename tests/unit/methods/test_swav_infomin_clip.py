"""SwAV, InfoMin and CLIP: Sinkhorn marginals, losses vs float64 references, state, captions, zero-shot."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

from kontrast.augment import get_recipe, make_views
from kontrast.cli import main
from kontrast.data import Samples, load_images
from kontrast.data.captions import TEMPLATES, captions_from_labels
from kontrast.decisions import decide, view_specs
from kontrast.encoders.multicrop import encode_views
from kontrast.encoders.text import EOT, PAD, TextTransformer, detokenize, tokenize
from kontrast.errors import UserError
from kontrast.evaluate.zeroshot import zeroshot_top1
from kontrast.losses.infonce import symmetric_info_nce
from kontrast.losses.swav import sinkhorn, swapped_prediction
from kontrast.methods.base import Progress
from kontrast.methods.build import create_method, resolve
from support.args import TINY_ENCODER
from support.reference import naive_sinkhorn, naive_swapped_prediction

TINY = {"encoder": TINY_ENCODER}


# --------------------------------------------------------------------------- SwAV: Sinkhorn and loss


def test_sinkhorn_matches_the_papers_algorithm_in_float64():
    scores = F.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)), dim=1).double()  # cosines
    for iterations in (1, 3, 10):
        torch.testing.assert_close(sinkhorn(scores, 0.05, iterations), naive_sinkhorn(scores, 0.05, iterations),
                                   atol=1e-10, rtol=1e-9)


def test_sinkhorn_marginals():
    """Rows (samples) sum to exactly 1 after any number of iterations; columns (prototypes) reach B/K."""
    g = torch.Generator().manual_seed(1)
    b, k = 32, 8
    scores = F.normalize(torch.randn(b, k, generator=g), dim=1)  # [B, K]
    for iterations in (1, 3):
        q = sinkhorn(scores, 0.05, iterations)
        assert q.shape == (b, k) and (q >= 0).all()
        torch.testing.assert_close(q.sum(dim=1), torch.ones(b), atol=1e-6, rtol=0)
    q = sinkhorn(scores.double(), 0.05, 500)
    torch.testing.assert_close(q.sum(dim=1), torch.ones(b, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(q.sum(dim=0), torch.full((k,), b / k, dtype=torch.float64), atol=1e-9, rtol=0)
    # equal scores: the equipartition is reached at once and is uniform
    torch.testing.assert_close(sinkhorn(torch.zeros(b, k), 0.05, 1), torch.full((b, k), 1 / k), atol=1e-7, rtol=0)


def test_sinkhorn_is_shift_invariant_and_stable():
    scores = torch.randn(16, 10, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(sinkhorn(scores + 7.0), sinkhorn(scores), atol=1e-6, rtol=1e-5)
    assert torch.isfinite(sinkhorn(scores + 50.0)).all()  # exp(1000) would overflow without the shift
    assert not sinkhorn(scores.requires_grad_()).requires_grad


def test_sinkhorn_small_epsilon_stays_finite_in_float32():
    """At ε = 0.01 a score gap of 1.6 is exp(-160), below float32's smallest number: exp(s / ε) of the plain
    algorithm underflows to 0 and a row or column divides by 0. The log-domain codes stay the paper's."""
    g = torch.Generator().manual_seed(4)
    scores = F.normalize(torch.randn(6, 5, generator=g), dim=1)  # [B, K] cosines
    scores[0] = -scores[1]  # sample 0 is far from every prototype sample 1 is close to
    assert (torch.exp((scores - scores.max()) / 0.01) == 0).any()  # what the plain algorithm would start from
    for iterations in (1, 3):
        q = sinkhorn(scores, 0.01, iterations)
        assert q.dtype == torch.float32 and torch.isfinite(q).all()
        torch.testing.assert_close(q.double(), naive_sinkhorn(scores.double(), 0.01, iterations), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(q.sum(dim=1), torch.ones(6), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="at least one iteration"):
        sinkhorn(scores, 0.05, 0)


def test_swapped_prediction_matches_float64_reference():
    g = torch.Generator().manual_seed(3)
    scores = F.normalize(torch.randn(5, 4, 6, generator=g, dtype=torch.float64), dim=2)  # [V, B, K]
    codes = torch.softmax(torch.randn(2, 4, 6, generator=g, dtype=torch.float64), dim=2)  # [A, B, K]
    got = swapped_prediction(scores, codes, 0.1)
    assert abs(got.item() - naive_swapped_prediction(scores, codes, 0.1)) < 1e-5  # float32 inside, as in training


def _swav(**params):
    cfg = resolve({"method": {"name": "swav", "num_prototypes": 12, "proj_hidden": 32, "proj_dim": 8, **params},
                   **TINY})
    return cfg, create_method(cfg, num_samples=16)  # batch 8: 2 steps per epoch


def test_multicrop_views_have_their_own_sizes():
    cfg, method = _swav()
    assert [s.size for s in view_specs(cfg)] == [32, 32, 16, 16, 16, 16]
    native = resolve({"method": {"name": "swav"}, "data": {"size": 64}, **TINY})  # the ImageNet recipe: 2 + 6 at 96/224
    assert [s.size for s in view_specs(native)] == [64, 64, 27, 27, 27, 27, 27, 27]
    views = make_views(torch.randint(0, 256, (4, 3, 40, 40), dtype=torch.uint8), view_specs(cfg),
                       torch.Generator().manual_seed(0))
    assert [tuple(v.shape) for v in views] == [(4, 3, 32, 32)] * 2 + [(4, 3, 16, 16)] * 4


def test_encode_views_groups_by_size_and_keeps_order():
    enc = create_method(_swav()[0]).encoder.eval()  # eval: BatchNorm does not mix the groups
    views = [torch.randn(3, 3, s, s) for s in (32, 32, 16, 16, 16)]
    with torch.no_grad():
        torch.testing.assert_close(encode_views(enc, views), torch.cat([enc(v) for v in views]), atol=1e-5, rtol=0)


def _progress(step):
    """Where a run over _swav's 16 samples at batch 8 is after ``step`` finished steps: 2 steps per epoch."""
    return Progress(step=step, epoch=step // 2, total_steps=10, steps_per_epoch=2)


def _step(method, views, step):
    out = method.training_step(views, torch.arange(8), _progress(step))
    method.zero_grad(set_to_none=True)
    out["loss"].backward()
    grad = method.prototypes.weight.grad
    with torch.no_grad():
        for p in method.parameters():
            if p.grad is not None:
                p.sub_(0.01 * p.grad)
    method.after_step(out, _progress(step + 1))
    return out, grad


def test_prototypes_frozen_for_the_first_epoch_then_trained_and_kept_unit():
    _, method = _swav(freeze_prototypes_epochs=1.0, queue_size=0)
    views = [torch.randn(8, 3, 32, 32)] * 2 + [torch.randn(8, 3, 16, 16)] * 2
    for step in range(4):  # 2 steps per epoch: frozen at steps 0 and 1
        out, grad = _step(method, views, step)
        assert (grad is None) == (step < 2), step
        assert out["prototypes_frozen"].item() == float(step < 2)
        torch.testing.assert_close(method.prototypes.weight.norm(dim=1), torch.ones(12), atol=1e-6, rtol=0)
    assert "steps" not in method.state_dict()  # no counter of its own: the epoch comes from progress
    assert method.training_step(views, torch.arange(8))["prototypes_frozen"].item() == 1.0  # no progress: epoch 0


def test_swav_loads_a_checkpoint_with_the_retired_step_counter(tmp_path):
    """Checkpoints of older versions hold SwAV's ``steps`` buffer; loading drops it."""
    from kontrast.checkpoint import load_weights, save_checkpoint

    _, old = _swav(queue_size=0)
    old.register_buffer("steps", torch.tensor(4))  # what the old SwAV kept
    opt = torch.optim.SGD(old.parameters(), lr=0.1)
    ckpt = save_checkpoint(tmp_path, old, opt, {"step": 4})
    _, new = _swav(queue_size=0)
    load_weights(ckpt, new)
    assert all(torch.equal(a, b) for a, b in zip(new.parameters(), old.parameters()))


def test_queue_fills_from_its_start_epoch_and_then_joins_sinkhorn():
    _, method = _swav(queue_size=16, queue_start_epochs=1.0, freeze_prototypes_epochs=0.0)
    views = [torch.randn(8, 3, 32, 32) for _ in range(2)] + [torch.randn(8, 3, 16, 16)]
    pushed = []
    for step in range(5):
        out = method.training_step(views, torch.arange(8), _progress(step))
        keys = out.get("keys")  # [2, 8, D]: the global crops' embeddings, for the queues
        assert (keys is None) == (step < 2), step  # epoch 0 (steps 0, 1): no queue yet
        if keys is not None:
            pushed.append(keys.clone())
        method.after_step(out, _progress(step + 1))
    assert [int(q.filled) for q in method.queues] == [16, 16]  # 8 x 3 rows pushed into each, 16 kept
    for a, queue in enumerate(method.queues):  # FIFO of 16 rows: step 4's keys overwrote step 2's
        torch.testing.assert_close(queue.items, torch.cat([pushed[2][a], pushed[1][a]]), atol=0, rtol=0)
    # with a full queue the codes come from a Sinkhorn problem over batch + queue
    method.eval()
    with torch.no_grad():
        z = F.normalize(method.projector(method.encoder(views[0])), dim=1)
        s = method.prototypes(z)
        expected = sinkhorn(torch.cat([s, method.prototypes(method.queues[0].items)]), 0.05, 3)[:8]
        alone = sinkhorn(s, 0.05, 3)
    assert not torch.allclose(expected, alone, atol=1e-4)


def test_swav_codes_come_from_float32_scores_outside_autocast(monkeypatch):
    """Under bf16 autocast the prototype scores, the Sinkhorn input and the loss stay float32."""
    import kontrast.methods.swav as swav_module

    seen = []

    def spy(scores, epsilon, iterations):
        seen.append((scores.clone(), torch.is_autocast_enabled("cpu")))
        return sinkhorn(scores, epsilon, iterations)

    monkeypatch.setattr(swav_module, "sinkhorn", spy)
    _, method = _swav(queue_size=0)
    views = [torch.randn(8, 3, 32, 32) for _ in range(2)] + [torch.randn(8, 3, 16, 16)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = method.training_step(views, torch.arange(8))
        z = F.normalize(method.projector(encode_views(method.encoder, views)), dim=1)[:8]  # [B, D] the same forward
        bf16_scores = method.prototypes(z)  # [B, K] what autocast alone would give
    assert [(t.dtype, on) for t, on in seen] == [(torch.float32, False)] * 2 and out["loss"].dtype == torch.float32
    assert z.dtype == bf16_scores.dtype == torch.bfloat16
    w = method.prototypes.weight.detach()  # [K, D]
    torch.testing.assert_close(seen[0][0], F.normalize(z.detach().float(), dim=1) @ w.T, atol=1e-6, rtol=0)
    assert (seen[0][0] - bf16_scores.float()).abs().max() > 1e-4  # so the check above tells the two apart


def test_swav_checks_its_params_and_views():
    with pytest.raises(UserError, match="sinkhorn_iterations"):
        _swav(sinkhorn_iterations=0)
    with pytest.raises(UserError, match="sinkhorn_epsilon"):
        _swav(sinkhorn_epsilon=0.0)
    with pytest.raises(UserError, match="compares at least 3 views"):  # its global views: before any training
        decide(resolve({"method": {"name": "swav", "global_views": 3}, "augment": {"recipe": "swav_global"}, **TINY}))
    with pytest.raises(UserError, match="at least 2 views"):
        decide(resolve({"method": {"name": "swav"}, "augment": {"recipe": "clip"}, **TINY}))


def test_swav_global_recipe_is_the_two_global_crops():
    multi, two = get_recipe("swav_multicrop"), get_recipe("swav_global")
    assert two == multi[:2] and len(multi) == 6
    cfg = resolve({"method": {"name": "swav", "num_prototypes": 12, "proj_hidden": 32, "proj_dim": 8},
                   "augment": {"recipe": "swav_global"}, **TINY})
    method = create_method(cfg, num_samples=16)
    views = make_views(torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8), view_specs(cfg),
                       torch.Generator().manual_seed(0))
    assert [v.shape[-1] for v in views] == [32, 32]
    out = method.training_step(views, torch.arange(8))  # each global crop predicts the other's code
    assert torch.isfinite(out["loss"])


# --------------------------------------------------------------------------- InfoMin


def test_infomin_is_moco_v2_with_the_infomin_views():
    """PyContrast's InfoMin preset: the MoCo v2 composition, tau 0.15, crop from 20% (MoCo queue), RandAugment."""
    from dataclasses import fields

    from kontrast.methods.moco_v2 import MoCoV2

    cfg = resolve({"method": {"name": "infomin"}, **TINY})
    method = create_method(cfg)
    assert isinstance(method, MoCoV2) and issubclass(method.Params, MoCoV2.Params)
    changed = {f.name for f in fields(method.Params) if f.default != getattr(MoCoV2.Params(), f.name)}
    assert changed == {"temperature"} and method.params.temperature == 0.15
    specs = view_specs(cfg)
    assert len(specs) == 2 and all(s.randaugment_n == 2 and s.crop_scale == (0.2, 1.0) for s in specs)
    with pytest.raises(UserError, match="temperature"):
        resolve({"method": {"name": "infomin", "temperature": 0.0}, **TINY})


# --------------------------------------------------------------------------- CLIP


def test_tokenizer_round_trip_and_cut():
    tokens = tokenize(["a photo of a cat.", "ünïcode", "x" * 100], context_length=24)
    assert tokens.shape == (3, 24) and (tokens[:, 0] == 256).all()
    assert detokenize(tokens)[:2] == ["a photo of a cat.", "ünïcode"]
    assert tokens[0, 18] == EOT and (tokens[0, 19:] == PAD).all()  # SOT + 17 bytes, EOT, padding
    assert tokens[2, -1] == EOT and detokenize(tokens)[2] == "x" * 22  # cut to fit


def test_text_encoder_is_causal_and_reads_the_end_token():
    torch.manual_seed(0)
    enc = TextTransformer(context_length=16, width=32, layers=2, heads=4).eval()
    t = tokenize(["a cat", "a dog"], 16)  # [2, 7]: SOT, 5 bytes, EOT
    padded = torch.cat([t, torch.full((2, 9), 65)], dim=1)  # junk after the end token, up to the context
    with torch.no_grad():
        out = enc(t)
        torch.testing.assert_close(enc(padded), out, atol=1e-5, rtol=0)  # causal: never seen (float32 kernels)
    assert out.shape == (2, 32) and not torch.allclose(out[0], out[1])


def test_symmetric_info_nce_matches_float64_reference():
    scores = torch.randn(5, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 3
    b = scores.shape[0]
    rows = sum(-scores[i, i].item() + math.log(sum(math.exp(scores[i, j].item()) for j in range(b))) for i in range(b))
    cols = sum(-scores[i, i].item() + math.log(sum(math.exp(scores[j, i].item()) for j in range(b))) for i in range(b))
    assert abs(symmetric_info_nce(scores).item() - (rows + cols) / (2 * b)) < 1e-5


def _clip(**params):
    cfg = resolve({"method": {"name": "clip", "text_width": 32, "text_layers": 1, "text_heads": 2,
                              "embed_dim": 16, **params}, **TINY})
    return cfg, create_method(cfg, num_samples=8)


def test_clip_temperature_init_and_clamp():
    _, method = _clip()
    assert math.isclose(method.logit_scale.exp().item(), 1 / 0.07, rel_tol=1e-6)
    with torch.no_grad():
        method.logit_scale.fill_(10.0)
    method.after_step({}, Progress(step=1, epoch=0, total_steps=2, steps_per_epoch=1))
    assert math.isclose(method.logit_scale.exp().item(), 100.0, rel_tol=1e-5)


def test_clip_binds_captions_or_makes_them_from_labels():
    _, method = _clip()
    images = torch.zeros(4, 3, 32, 32, dtype=torch.uint8)
    note = method.bind_data(Samples(images, torch.tensor([0, 1, 1, 0]), ["cat", "pickup_truck"], "toy"))
    assert "class names" in note and "label" in note
    texts = detokenize(method.tokens)
    assert all(("cat" in t) != ("pickup truck" in t) for t in texts) and "pickup truck" in texts[1]
    assert all(any(t == tpl.format(c) for tpl in TEMPLATES for c in ("cat", "pickup truck")) for t in texts)
    method.bind_data(Samples(images, None, [], "pairs", captions=["one", "two", "three", "four"]))
    assert detokenize(method.tokens) == ["one", "two", "three", "four"]
    with pytest.raises(UserError, match="captions"):
        method.bind_data(Samples(images, None, [], "flat"))
    with pytest.raises(UserError, match="bind_data"):
        _clip()[1].training_step([torch.randn(4, 3, 32, 32)], torch.arange(4))


def test_captions_from_labels_vary_and_are_reproducible():
    labels = torch.zeros(200, dtype=torch.long)
    a, b = captions_from_labels(labels, ["dog"], 0), captions_from_labels(labels, ["dog"], 0)
    assert a == b and len(set(a)) == len(TEMPLATES)


class _ToyImageText(nn.Module):
    """Class c's images are filled with c/10; its prompts name class c. Embeddings: one-hot of the class."""

    classes = ["cat", "dog", "ship"]

    def tokenize(self, texts):
        return torch.tensor([next(i for i, c in enumerate(self.classes) if c in t) for t in texts])

    def encode_text(self, tokens):
        return F.one_hot(tokens, 3).float()

    def encode_image(self, x):
        return F.one_hot((x[:, 0].mean(dim=(1, 2)) * 10).round().long(), 3).float()


def test_zeroshot_classifies_by_the_nearest_prompt_embedding():
    labels = torch.tensor([0, 1, 2, 2, 1])
    images = (labels.view(-1, 1, 1, 1) * 25.5).round().to(torch.uint8).expand(-1, 3, 8, 8).contiguous()
    test = Samples(images, labels, _ToyImageText.classes, "toy")
    assert zeroshot_top1(_ToyImageText(), test, mean=(0, 0, 0), std=(1, 1, 1)) == 1.0
    wrong = Samples(images, torch.tensor([1, 2, 0, 0, 2]), _ToyImageText.classes, "toy")
    assert zeroshot_top1(_ToyImageText(), wrong, mean=(0, 0, 0), std=(1, 1, 1)) == 0.0


@pytest.fixture
def image_folder(tmp_path):
    root = tmp_path / "pets"
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 12), ("test", 4)):
        for c, colour in (("cat", (200, 40, 40)), ("hot_dog", (40, 40, 200))):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                pixels = torch.randint(0, 40, (16, 16, 3), generator=g) + torch.tensor(colour)  # [H, W, 3]
                Image.fromarray(pixels.to(torch.uint8).numpy()).save(root / split / c / f"{i}.png")
    return root


def test_captions_command_and_paired_source(image_folder, tmp_path, capsys):
    out = tmp_path / "pairs" / "pets.jsonl"
    assert main(["captions", "--data", str(image_folder), "--out", str(out)]) == 0
    assert "the text is the label" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 32 and {r["split"] for r in rows} == {"train", "test"}
    assert all(r["label"].replace("_", " ") in r["caption"] for r in rows)
    train = load_images(out, "train", size=16)
    assert len(train) == 24 and train.classes == ["cat", "hot_dog"] and len(train.captions) == 24
    sub = train.subset(5, seed=1)
    assert all(sub.classes[y].replace("_", " ") in c for y, c in zip(sub.labels.tolist(), sub.captions))
    assert len(load_images(out, "test", size=16)) == 8
    # a CSV file with only the required columns: trainable, not evaluable
    csv = tmp_path / "pairs" / "plain.csv"
    csv.write_text("image,caption\n" + "".join(f"{r['image']},{r['caption']}\n" for r in rows[:3]))
    assert load_images(csv, "train", size=16).captions == [r["caption"] for r in rows[:3]]
    with pytest.raises(UserError, match="no labelled test rows"):
        load_images(csv, "test", size=16)
    assert main(["captions", "--data", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"image": "x.png"}\n')
    with pytest.raises(UserError, match="caption"):
        load_images(bad, "train")


def test_clip_trains_and_evaluates_zero_shot_through_the_cli(image_folder, tmp_path, capsys):
    pairs = tmp_path / "pets.jsonl"
    assert main(["captions", "--data", str(image_folder), "--out", str(pairs)]) == 0
    run = tmp_path / "run"
    args = ["train", "--method", "clip", "--data", str(pairs), "--epochs", "1", "--batch-size", "8", "--out", str(run),
            "--no-progress", "--set", "encoder.width=0.125", "--set", "data.size=16", "--set", "method.text_width=32",
            "--set", "method.text_layers=1", "--set", "method.text_heads=2"]
    assert main(args) == 0
    assert "captions from" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(run), "--json", "--no-linear"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.0 <= result["zeroshot_top1"] <= 1.0 and 0.0 <= result["knn_top1"] <= 1.0
