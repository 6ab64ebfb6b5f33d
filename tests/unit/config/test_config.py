"""Strict config loading, overrides and the recipes in configs/."""

import dataclasses

import pytest

from kontrast.config import build_config, dump, load_yaml, parse_override, to_dict
from kontrast.errors import UserError
from kontrast.methods import METHODS
from kontrast.methods.build import resolve
from support import ROOT

CONFIGS = ROOT / "configs"


def test_unknown_keys_are_errors():
    with pytest.raises(UserError, match="optim.lrr"):
        build_config({"optim": {"lrr": 1}})
    with pytest.raises(UserError, match="unknown config section"):
        build_config({"optimizer": {}})
    with pytest.raises(UserError, match="method.temprature"):
        resolve({"method": {"name": "simclr", "temprature": 0.1}})
    with pytest.raises(UserError, match="unknown method"):
        resolve({"method": {"name": "simclr2000"}})


def test_types_are_checked():
    with pytest.raises(UserError, match="train.epochs"):
        build_config({"train": {"epochs": "ten"}})
    assert build_config({"optim": {"lr": 1}}).optim.lr == 1.0  # ints widen to floats


def test_override_parsing():
    assert parse_override("optim.lr=0.1") == {"optim": {"lr": 0.1}}
    assert parse_override("train.channels_last=true") == {"train": {"channels_last": True}}
    assert parse_override("method.temperature=0.2") == {"method": {"temperature": 0.2}}
    for bad in ("optim.lr", "lr=0.1"):
        with pytest.raises(UserError):
            parse_override(bad)


def test_method_defaults_apply_under_user_values():
    cfg = resolve({"method": {"name": "byol"}})
    assert cfg.optim.name == "lars" and cfg.optim.lr == 1.0
    cfg = resolve({"method": {"name": "byol"}, "optim": {"lr": 0.5}})
    assert cfg.optim.name == "lars" and cfg.optim.lr == 0.5
    assert cfg.method.params.base_momentum == 0.99


@pytest.mark.parametrize("name, lr, wd", [("byol", 1.0, 1e-5), ("moco_v3", 0.3, 1e-6), ("swav", 0.6, 1e-6),
                                         ("dino", 0.3, 1e-6)])
def test_solo_learn_recipes_name_their_lars_variant(name, lr, wd):
    """solo-learn's CIFAR recipes (scripts/pretrain/cifar/{byol,mocov3,swav,dino}.yaml): LARS with clip_lr,
    eta 0.02, biases and norms excluded, lr x batch/256, 10 warm-up epochs (its scheduler default)."""
    optim = resolve({"method": {"name": name}}).optim
    assert (optim.name, optim.lars_clip, optim.lars_eta) == ("lars", True, 0.02)
    assert (optim.lr, optim.lr_batch, optim.weight_decay, optim.warmup_epochs, optim.min_lr) == (lr, 256, wd, 10.0, 0.0)


def test_resolved_config_round_trips(tmp_path):
    cfg = resolve({"method": {"name": "moco_v2", "queue_size": 1024}, "train": {"epochs": 3}})
    dump(cfg, tmp_path / "c.yaml")
    assert resolve(load_yaml(tmp_path / "c.yaml")) == cfg
    assert to_dict(cfg)["method"]["queue_size"] == 1024


@pytest.mark.parametrize("name", METHODS.names())
def test_each_method_has_a_recipe_file_stating_its_defaults(name):
    """configs/<method>_cifar.yaml states the method's hyperparameters and optimizer in full; keep it true."""
    data = "cifar" if METHODS.get(name).recipe is not None else "sequences"  # CPC v1 trains on sequences
    path = CONFIGS / f"{name}_{data}.yaml"
    assert path.is_file(), f"missing {path}"
    raw = load_yaml(path)
    from_file, defaults = resolve(raw), resolve({"method": {"name": name}})
    params = {f.name for f in dataclasses.fields(defaults.method.params)}
    assert set(raw["method"]) - {"name"} == params, "state every method key"
    assert from_file.method == defaults.method
    assert from_file.optim == defaults.optim


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml") if p.name != "short_budget.yaml"))
def test_every_recipe_file_resolves_and_plans(name):
    """Every file in configs/ is a config a user can pass to --config (the fast recipe's progressive views too)."""
    from kontrast.train.plan import plan_run

    raw = load_yaml(CONFIGS / name)
    raw["data"] = {**raw.get("data", {}), "source": "sequences:8" if name == "cpc_sequences.yaml" else "shapes:8"}
    plan_run(resolve(raw))


def test_augment_overrides_apply_to_every_view():
    from kontrast.decisions import view_specs

    cfg = resolve({"method": {"name": "byol"}, "encoder": {"width": 0.125}, "data": {"size": 24},
                   "augment": {"view": {"crop_scale": [0.2, 1.0]}}})
    specs = view_specs(cfg)
    assert [s.crop_scale for s in specs] == [(0.2, 1.0), (0.2, 1.0)]
    assert [s.size for s in specs] == [24, 24]
    assert specs[0].blur_p != specs[1].blur_p  # BYOL's asymmetry survives the override
    bad = resolve({"augment": {"view": {"crop_scales": [0.2, 1.0]}}, "encoder": {"width": 0.125}})
    with pytest.raises(UserError, match="augment.view.crop_scales"):
        view_specs(bad)
    with pytest.raises(UserError, match="recipe"):
        view_specs(resolve({"augment": {"recipe": "nope"}}))


def test_python_api_builds_methods_only_from_resolved_configs():
    """The method's own defaults come from resolve(), the one resolution the CLI uses too; a config built
    from the schema alone (no method params, no method defaults) is refused instead of silently using SGD."""
    from kontrast.methods.build import create_method

    cfg = resolve({"method": {"name": "byol"}, "encoder": {"width": 0.125}})
    assert cfg.optim.name == "lars" and type(create_method(cfg)).__name__ == "BYOL"
    with pytest.raises(UserError, match="resolve"):
        create_method(build_config({"method": {"name": "byol"}, "encoder": {"width": 0.125}}))
    with pytest.raises(UserError, match="resolve"):
        build_config({"method": {"name": "byol", "base_momentum": 0.9}})


def test_every_method_states_its_optimizer():
    """No method inherits its optimizer from OptimConfig's fallbacks without saying so."""
    for name in METHODS.names():
        assert "optim" in METHODS.get(name).defaults, name
