"""``kontrast bench``: a fast smoke run of every section with tiny settings, and its JSON output; and
benchmarks/vs_peer.py, which builds the peer comparison and the targets on it (its peer run with a stand-in)."""

import importlib.util
import json
import sys

import pytest
import torch

from kontrast.augment import ViewSpec, get_recipe
from kontrast.bench import BenchOptions, run_bench
from kontrast.bench.augment import torchvision_pipeline
from kontrast.cli import build_parser, main
from kontrast.errors import UserError
from support import ROOT


def _load_vs_peer():
    path = ROOT / "benchmarks" / "vs_peer.py"
    spec = importlib.util.spec_from_file_location("vs_peer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_peer"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


vs_peer = _load_vs_peer()

TINY = ["--data", "shapes:96", "--batch", "16", "--threads", "1", "--width", "0.0625",
        "--recipes", "simclr_cifar", "--methods", "simclr,moco_v2", "--aug-seconds", "0.05", "--step-iters", "1",
        "--loss-batches", "8,16", "--steps", "2", "--settings", "fp32"]


def test_bench_json_smoke(tmp_path, capsys):
    """Every section runs and --json prints one parseable object holding each section's figures."""
    assert main(["bench", *TINY, "--workdir", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    aug = result["augment"]["recipes"][0]
    assert aug["recipe"] == "simclr_cifar" and aug["ours_img_per_s"] > 0 and aug["torchvision_img_per_s"] > 0
    assert aug["command"].startswith("kontrast bench --sections augment")
    steps = {r["method"]: r for r in result["step"]["methods"]}
    assert set(steps) == {"simclr", "moco_v2"}
    for r in steps.values():
        assert r["step_s"] > 0 and 0 <= r["outside_encoder"] < 1 and r["encoder_calls"] >= 1
        assert set(r["phases_s"]) == {"data_augment", "forward_loss", "backward", "guard", "optimizer", "after_step"}
    assert steps["moco_v2"]["target_calls"] >= 1 and steps["simclr"]["target_calls"] == 0  # momentum encoder seen
    assert [r["batch"] for r in result["loss"]["rows"]] == [8, 16]
    train = result["train"]["settings"]["fp32"]["ours"]
    assert train["steps"] == 2 and train["img_per_s"] > 0 and train["peak_rss_mib"] > 0
    assert train["command"].startswith("kontrast train --method simclr")
    assert "targets" not in result and "peer" not in result["train"]["settings"]["fp32"]  # this machine alone
    assert "peer" not in err and not any(line.startswith("target ") for line in err.splitlines())  # no pass/fail
    targets = vs_peer.judge(result, 0.0625)  # the benchmarks script judges the package's figures
    assert "outside_encoder_simclr" in targets and targets["augment_vs_torchvision"].split(":")[0] in ("met", "NOT met")


def test_bench_data_defaults_to_the_built_in_shapes():
    """No default path outside the user's own arguments: without --data, the generated shapes."""
    args = build_parser().parse_args(["bench"])
    assert args.data == "shapes"
    from kontrast.bench.options import from_args

    assert from_args(args).data == "shapes" and from_args(args).sections == ("augment", "step", "loss", "train")


def test_step_breakdown_of_feature_map_methods(capsys):
    """amdim and cpc_v2 call the encoder's feature maps (not its forward), which the replay cannot see:
    their phases are measured and the encoder share is reported as not replayed, not a crash."""
    args = ["bench", *TINY, "--sections", "step", "--json"]
    args[args.index("simclr,moco_v2")] = "amdim,cpc_v2"
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)["step"]["methods"]
    assert [r["method"] for r in rows] == ["amdim", "cpc_v2"]
    for r in rows:
        assert r["step_s"] > 0 and r["encoder_calls"] == 0 and "outside_encoder" not in r


def test_bench_prints_reproducing_commands(tmp_path, capsys):
    assert main(["bench", *TINY, "--sections", "augment,loss", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "reproduce: kontrast bench --sections augment" in out
    assert "reproduce: kontrast bench --sections loss" in out
    assert "simclr_cifar" in out


def test_bench_bad_section_is_a_user_error(capsys):
    assert main(["bench", "--sections", "nope"]) == 2
    assert "unknown bench section" in capsys.readouterr().err
    assert main(["bench", "--sections", "loss", "--timeout", "0"]) == 2
    assert "--timeout > 0" in capsys.readouterr().err


def test_peer_is_run_when_given(tmp_path):
    """A stand-in peer script (prints the peer's JSON line) exercises the side-by-side path and the ratio."""
    peer = tmp_path / "peer.py"
    peer.write_text("import json\nprint(json.dumps({'steps': 2, 'img_per_s_wall': 10.0, 'img_per_s_compute': 20.0}))\n")
    data = tmp_path / "cifar"
    (data / "train").mkdir(parents=True)
    opts = BenchOptions(sections=("train",), data="shapes:96", batch=16, threads=1, width=0.0625, steps=2,
                        settings=("fp32",), workdir=str(tmp_path / "w"), log=lambda *a: None)
    res = vs_peer.compare(opts, vs_peer.Peer(sys.executable, str(data), str(peer)))["train"]["settings"]["fp32"]
    assert res["peer"]["img_per_s"] == 10.0
    assert res["ratio"] == round(res["ours"]["img_per_s"] / 10.0, 2)
    assert str(peer) in res["peer"]["command"]


def test_vs_peer_without_a_peer_says_so_and_does_not_fail(tmp_path, capsys, monkeypatch):
    for name in ("PEER_PYTHON", "PEER_CIFAR10", "PEER_SCRIPT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BENCH_DATA", "shapes:96")  # the script's paths come from arguments or the environment
    args = ["--sections", "train", "--batch", "16", "--threads", "1", "--width", "0.0625", "--steps", "2",
            "--settings", "fp32", "--workdir", str(tmp_path), "--json"]
    assert vs_peer.main(args) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert "peer skipped: no --peer-python" in err and result["train"]["peer_skipped"]
    assert result["data"] == "shapes:96" and result["targets"] == {}  # nothing a target needs was measured
    assert "reproduce: .venv/bin/python benchmarks/vs_peer.py --sections train --data shapes:96" in err


def test_vs_peer_argument_checks(capsys, monkeypatch, tmp_path):
    assert vs_peer.main(["--sections", "nope"]) == 2
    assert "unknown bench section" in capsys.readouterr().err
    assert vs_peer.main(["--sections", "loss", "--accuracy", "--accuracy-epochs", "0"]) == 2
    assert "--accuracy-epochs must be >= 1" in capsys.readouterr().err
    monkeypatch.setenv("PEER_PYTHON", str(tmp_path / "missing"))
    monkeypatch.setenv("PEER_SCRIPT", "peer.py")
    args = vs_peer.build_parser().parse_args([])
    assert args.peer_python == str(tmp_path / "missing") and args.peer_script == "peer.py"
    peer = vs_peer.Peer(args.peer_python, None, args.peer_script)
    assert "does not exist" in peer.ready()
    assert "--peer-data must be" in vs_peer.Peer(sys.executable, str(tmp_path), "peer.py").ready()


def test_torchvision_pipeline_mirrors_the_spec():
    """The PIL baseline gets the same ops as the recipe and returns a normalised float view."""
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as TF

    spec = get_recipe("byol")[1]  # blur p 0.1, solarize p 0.2
    pipe = torchvision_pipeline(spec)
    kinds = [type(t).__name__ for t in pipe.transforms]
    assert kinds[0] == "RandomResizedCrop" and "RandomSolarize" in kinds and kinds[-1] == "Normalize"
    img = TF.to_pil_image(torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8))
    out = pipe(img)
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    plain = torchvision_pipeline(ViewSpec(jitter_p=0.0, blur_p=0.0))
    assert "RandomApply" not in [type(t).__name__ for t in plain.transforms]
    assert isinstance(torchvision_pipeline(get_recipe("infomin")[0]).transforms[-4], v2.RandAugment)


def test_bad_settings_are_user_errors():
    with pytest.raises(UserError, match="auto, fp32, fp32_cl, bf16_cl or"):
        run_bench(BenchOptions(sections=("loss",), settings=("fp16",), log=lambda *a: None))


@pytest.mark.slow
def test_bench_compiled_views_column(capsys):
    """--compile-views adds the compiled view pipeline (train.compile's) beside eager and torchvision."""
    args = ["bench", *TINY, "--sections", "augment", "--compile-views", "--json"]
    args[args.index("simclr_cifar")] = "clip"  # one crop: the quickest recipe to compile
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    row = result["augment"]["recipes"][0]
    assert row["compiled_img_per_s"] > 0 and row["compile_s"] > 0 and row["command"].endswith("--compile-views")
    assert "augment_vs_torchvision_compiled" in vs_peer.judge(result, 0.0625)


def test_accuracy_target_compares_the_fast_default_with_the_peer_and_our_fp32():
    acc = {"fp32": {"ours": {"knn_top1": 0.45}, "peer": {"knn_top1": 0.46}}, "bf16_cl": {"ours": {"knn_top1": 0.47}}}
    assert vs_peer.judge({"accuracy": {"settings": acc}}, 0.25)["accuracy_at_fast_defaults"].startswith("met")
    acc["bf16_cl"]["ours"]["knn_top1"] = 0.455  # above our fp32, below the peer
    assert vs_peer.judge({"accuracy": {"settings": acc}}, 0.25)["accuracy_at_fast_defaults"].startswith("NOT met")


def test_speed_targets_are_judged_in_the_benchmarks_script():
    """The ≥ 8x augmentation, outside-encoder and train-vs-peer targets, the last one lower at full width."""
    result = {"augment": {"recipes": [{"recipe": "a", "ratio": 9.0}, {"recipe": "b", "ratio": 7.5}]},
              "step": {"methods": [{"method": "simclr", "outside_encoder": 0.05},
                                   {"method": "byol", "outside_encoder": 0.2},
                                   {"method": "amdim", "encoder_calls": 0}]},
              "train": {"ours_best_vs_peer_fp32": 1.5, "ours_best_vs_peer_best": 1.2}}
    got = vs_peer.judge(result, 0.25)
    assert got["augment_vs_torchvision"].startswith("NOT met: lowest 7.5x (b)")
    assert "augment_vs_torchvision_compiled" not in got  # no compiled column measured
    assert got["outside_encoder_simclr"].startswith("met") and got["outside_encoder_byol"].startswith("NOT met")
    assert "outside_encoder_amdim" not in got and "outside_encoder_moco_v2" not in got
    assert got["ours_best_vs_peer_fp32"].startswith("NOT met") and got["ours_best_vs_peer_best"].startswith("NOT met")
    assert vs_peer.judge(result, 1.0)["ours_best_vs_peer_best"] == "met: 1.2x (target 1.1x)"
