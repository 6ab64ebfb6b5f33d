"""`kontrast config`: the resolved configuration, every key with its value and one line saying what it is."""

import pytest
import yaml

from kontrast.cli import main
from kontrast.config.keys import describe, field_docs, undocumented
from kontrast.config.schema import TrainConfig
from kontrast.methods import METHODS
from kontrast.methods.build import resolve


@pytest.mark.parametrize("name", METHODS.names())
def test_every_key_of_every_method_says_what_it_is(name):
    assert undocumented(resolve({"method": {"name": name}})) == []


def test_a_description_is_the_comment_beside_the_field():
    assert field_docs(TrainConfig)["log_every"].startswith("steps between metric lines; auto: 10")


def test_the_command_prints_a_config_that_reads_back_as_the_same(capsys, tmp_path):
    assert main(["config", "--method", "moco_v2", "--set", "optim.lr=0.1", "--set", "encoder.width=0.5"]) == 0
    out = capsys.readouterr().out
    raw = yaml.safe_load(out)  # valid YAML: the descriptions are comments
    cfg = resolve({"method": {"name": "moco_v2"}, "optim": {"lr": 0.1}, "encoder": {"width": 0.5}})
    assert resolve(raw) == cfg and raw["optim"]["lr"] == 0.1
    keys = [line for line in out.splitlines() if line.startswith("  ")]
    assert len(keys) > 60 and all(" # " in line for line in keys)  # every key with what it is
    path = tmp_path / "moco.yaml"
    path.write_text(out)
    assert main(["config", "--config", str(path)]) == 0 and capsys.readouterr().out == out
    assert describe(cfg) == out.rstrip("\n")


def test_a_mistyped_key_is_one_line(capsys):
    assert main(["config", "--set", "optim.lrr=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown config key 'optim.lrr' (did you mean 'optim.lr'?)") and "\n" not in err


def test_the_reference_page_is_current(capsys):
    """docs/reference.md is `kontrast config --reference`: every command and every key, from the code."""
    from support import ROOT

    assert main(["config", "--reference"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs/reference.md").read_text(), \
        "regenerate it: kontrast config --reference > docs/reference.md"
