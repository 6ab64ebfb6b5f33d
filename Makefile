# Set-up is part of every target: a fresh machine needs only python3 and make.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch/torchvision are pinned here (not in pyproject) to the build this project is tested with.
TORCH := torch==2.14.1 torchvision==0.29.1

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kontrast demo

test: $(STAMP)
	$(PY) -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache
