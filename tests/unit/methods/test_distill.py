"""distill (methods/distill.py): its loss against the formula, every teacher source and every refusal of one, and a
frozen teacher beside a trained student. (Micro-batches, fake CUDA, a ViT student and the smoke step: the generic
tests, which build distill with support/teacher.py's tiny teacher; the CLI: tests/integration/test_distill.py.)"""

import sys

import pytest
import torch
from safetensors.torch import save_file

from kontrast.data import Samples
from kontrast.encoders import create_encoder
from kontrast.encoders.teacher import load_teacher
from kontrast.errors import UserError
from kontrast.evaluate.run import load_run
from kontrast.losses.feature_distillation import normalized_feature_mse
from kontrast.methods.build import create_method, resolve
from kontrast.methods.distill import Distill
from kontrast.outputs.export import export_backbone
from kontrast.train.loop import fit
from support.args import TINY_ENCODER
from support.teacher import teacher_network, tiny_teacher

pytestmark = pytest.mark.usefixtures("one_thread")
EPS = torch.finfo(torch.float64).eps
LOSS_ULPS = 64  # the loss is a mean of B D squared differences of O(1/sqrt(D)) terms: 64 eps of its scale covers the
                # summation order of D = 48 terms and the normalisation's square root with room to spare


def _naive_loss(s: torch.Tensor, t: torch.Tensor) -> float:
    """The formula, one sample at a time in float64: 1/(B D) sum_i sum_d (s_id/||s_i|| - t_id/||t_i||)^2."""
    total, (b, d) = 0.0, s.shape
    for i in range(b):
        s_norm = sum(float(v) ** 2 for v in s[i]) ** 0.5
        t_norm = sum(float(v) ** 2 for v in t[i]) ** 0.5
        total += sum((float(s[i, k]) / s_norm - float(t[i, k]) / t_norm) ** 2 for k in range(d))
    return total / (b * d)


def test_the_loss_is_the_formula_in_float64():
    gen = torch.Generator().manual_seed(0)
    s, t = torch.randn(6, 48, generator=gen, dtype=torch.float64), torch.randn(6, 48, generator=gen,
                                                                                dtype=torch.float64) * 7
    reference = _naive_loss(s, t)
    assert abs(float(normalized_feature_mse(s, t)) - reference) <= LOSS_ULPS * EPS * reference
    # scale-free on both sides, 0 where the directions agree, and no gradient into the teacher
    assert float(normalized_feature_mse(3 * t, t)) <= LOSS_ULPS * EPS
    t.requires_grad_(True)
    normalized_feature_mse(s.requires_grad_(True), t).backward()
    assert t.grad is None and s.grad is not None


# ----------------------------------------------------------------------------- teacher sources

@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    """A supervised run of two steps on shapes (a tiny ResNet) and its export."""
    root = tmp_path_factory.mktemp("teacher")
    raw = {"method": {"name": "supervised"}, "encoder": TINY_ENCODER, "data": {"source": "shapes:32", "size": 16},
           "train": {"epochs": 1, "batch_size": 16, "num_threads": 1, "device": "cpu", "knn_every": 0}}
    fit(resolve(raw), root / "run", progress=False)
    export_backbone(root / "run", root / "export")
    return root


def _images(n: int = 4, side: int = 16) -> torch.Tensor:
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(1))


def test_a_run_folder_and_its_export_give_the_runs_encoder(teacher_run):
    _, method, _ = load_run(teacher_run / "run")
    expected = method.encoder.eval()(_images())  # [4, 64] what `kontrast embed` computes
    for reference in (teacher_run / "run", teacher_run / "run/checkpoints/step-00000002", teacher_run / "export",
                      teacher_run / "export/backbone.safetensors"):
        teacher = load_teacher(str(reference))
        assert teacher.dim == method.encoder.dim
        torch.testing.assert_close(teacher(_images()), expected, rtol=0, atol=0)
        assert not teacher.network.training and not any(p.requires_grad for p in teacher.network.parameters())


def test_a_model_name_reads_its_local_weights(tmp_path):
    network = create_encoder("resnet18", stem="imagenet")  # torchvision's and timm's resnet18 tensors
    save_file({**network.state_dict(), "fc.weight": torch.zeros(10, 512)}, tmp_path / "r18.safetensors")
    for reference in ("torchvision:resnet18", "timm:resnet18"):
        teacher = load_teacher(reference, str(tmp_path / "r18.safetensors"))
        assert teacher.dim == 512
        torch.testing.assert_close(teacher(_images(2, 32)), network.eval()(_images(2, 32)))


class _Unnamed(torch.nn.Module):  # a user's network without `.dim`: its width is found by one forward
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 3)

    def forward(self, x):
        return self.conv(x).mean(dim=(2, 3))


def test_a_python_module_teacher(tmp_path, monkeypatch):
    (tmp_path / "my_teachers.py").write_text("import torch\nfrom support.teacher import teacher_network\n"
                                             "net = teacher_network()\ndef make():\n    return teacher_network()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for reference in ("python:my_teachers:net", "python:my_teachers:make"):
        teacher = load_teacher(reference)
        torch.testing.assert_close(teacher(_images()), teacher_network().eval()(_images()))
    sys.modules.pop("my_teachers", None)
    cfg = resolve({"method": {"name": "distill"}, "encoder": TINY_ENCODER})
    method = Distill(create_method(cfg).encoder, cfg.method.params, teacher=_Unnamed())  # the API's own module
    assert method.teacher.dim == 5 and method.head.out_features == 5
    assert method.training_step([_images()])["loss"].ndim == 0


def _pickled(path):
    torch.save({"weights": torch.zeros(2), "code": _Unnamed()}, path)  # a module object: pickled code
    return str(path)


@pytest.mark.parametrize("reference, weights, words", [
    ("", "", "distill needs a teacher: set method.teacher"),
    ("{tmp}/nowhere", "", "teacher not found"),
    ("{tmp}", "", "neither a kontrast run"),
    ("{tmp}/plain.safetensors", "", "does not say which network"),
    ("torchvision:resnet18", "", "needs its weights: set method.teacher_weights"),
    ("torchvision:resnet18", "{tmp}/missing.safetensors", "not found"),
    ("torchvision:resnet18", "PICKLE", "cannot be read by torch.load(weights_only=True)"),
    ("torchvision:resnet18", "{tmp}/plain.safetensors", "lack"),
    ("torchvision:resnet1800", "", "resnet1800"),
    ("timm:convnext_tiny", "", "kontrast builds timm's"),
    ("python:no_such_module_here:net", "", "cannot import no_such_module_here"),
    ("python:support.teacher:nothing", "", "has no 'nothing'"),
    ("python:support.teacher", "", "must read python:<module>:<attr>"),
    ("python:support.teacher:WIDTH", "", "not a torch.nn.Module"),
    ("TINY", "{tmp}/plain.safetensors", "teacher_weights applies to torchvision:/timm:"),  # the tiny export
])
def test_every_bad_teacher_is_one_line(reference, weights, words, tmp_path):
    save_file({"x": torch.zeros(1)}, tmp_path / "plain.safetensors")
    weights = _pickled(tmp_path / "pickled.pth") if weights == "PICKLE" else weights.format(tmp=tmp_path)
    with pytest.raises(UserError) as err:
        load_teacher(tiny_teacher() if reference == "TINY" else reference.format(tmp=tmp_path), weights)
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


# ----------------------------------------------------------------------------- the method


def _bound(**params) -> Distill:
    cfg = resolve({"method": {"name": "distill", "teacher": tiny_teacher(), **params}, "encoder": TINY_ENCODER})
    torch.manual_seed(0)
    method = create_method(cfg, num_samples=8)
    method.bind_data(Samples(torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8), None, [], "tiny"))
    return method


def test_the_teacher_is_frozen_and_not_saved_while_the_student_learns():
    method = _bound()
    teacher = {k: v.clone() for k, v in method.teacher.network.state_dict().items()}  # weights and BN statistics
    student = {k: v.clone() for k, v in method.state_dict().items()}
    assert not any(k.startswith("teacher") for k in student)  # checkpoint and export hold the student only
    optimizer = torch.optim.SGD(method.parameters(), lr=0.1)
    assert {id(p) for p in method.parameters()}.isdisjoint(id(p) for p in method.teacher.network.parameters())
    method.train()
    out = method.training_step([_images(8)])
    out["loss"].backward()
    optimizer.step()
    assert all(p.grad is None for p in method.teacher.network.parameters())
    assert not method.teacher.network.training  # .train() on the method does not reach it
    for key, value in method.teacher.network.state_dict().items():
        assert torch.equal(value, teacher[key]), key
    changed = [k for k, v in method.state_dict().items() if not torch.equal(v, student[k])]
    assert any(k.startswith("encoder.") for k in changed) and "head.weight" in changed


def test_teacher_size_resizes_the_view_for_the_teacher_only():
    method = _bound(teacher_size=24)
    seen = []
    method.teacher.network.register_forward_pre_hook(lambda _m, args: seen.append(tuple(args[0].shape)))
    method.encoder.register_forward_pre_hook(lambda _m, args: seen.append(tuple(args[0].shape)))
    method.training_step([_images(4)])
    assert sorted(seen) == [(4, 3, 16, 16), (4, 3, 24, 24)]


def test_a_checkpoint_sizes_the_head_without_the_teacher():
    trained = _bound(head_hidden=32)
    cfg = resolve({"method": {"name": "distill", "teacher": "/nowhere", "head_hidden": 32}, "encoder": TINY_ENCODER})
    fresh = create_method(cfg)  # as kontrast embed builds it: no bind_data, no teacher read
    fresh.size_from(trained.state_dict())
    fresh.load_state_dict(trained.state_dict())
    assert fresh.teacher is None and fresh.head[-1].out_features == trained.teacher.dim
