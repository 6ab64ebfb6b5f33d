"""The Python API: ``from kontrast import ...`` gives what a training script needs, and the examples run."""

import doctest
import os
import re
import subprocess
import sys

import pytest

import kontrast
from support import ROOT

README = ROOT / "README.md"


def test_every_exported_name_resolves():
    for name in kontrast.__all__:
        assert getattr(kontrast, name) is not None, name
    assert set(kontrast.__all__) <= set(dir(kontrast))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kontrast.nope  # noqa: B018


def test_import_kontrast_does_not_import_torch():
    code = "import sys, kontrast; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_resolve_applies_the_methods_own_defaults():
    cfg = kontrast.resolve({"method": {"name": "byol"}})
    assert cfg.optim.name == "lars"  # BYOL's recipe, not the SGD fallback
    method = kontrast.create_method(cfg)
    assert type(method).__name__.lower().startswith("byol")


def test_docstring_examples_run():
    result = doctest.testmod(kontrast, verbose=False)
    assert result.attempted >= 8 and result.failed == 0


def _readme_python() -> str:
    """The README's Python quickstart: the first ```python block under the '## Python' heading."""
    text = README.read_text()
    section = text[text.index("\n## Python"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README has no ```python block under ## Python"
    return match.group(1)


@pytest.mark.slow
def test_readme_python_quickstart_runs(tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(_readme_python())
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "quickstart"
    assert (run / "embeddings.parquet").is_file() and (run / "backbone" / "backbone.json").is_file()
    assert (run / "report.html").is_file()
