# Set-up is part of every target: a fresh machine needs only python3 and make.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch/torchvision are pinned here (not in pyproject) to the build this project is tested with.
TORCH := torch==2.14.1 torchvision==0.29.1

.PHONY: demo lint check test test-kernels gpu clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kontrast demo

# two test processes of one thread each (tests/conftest.py): on 2 cores faster than one of two threads
PARALLEL := -n 2 --dist worksteal

# ruff (rules and exceptions in pyproject.toml's [tool.ruff]) over src, tests, benchmarks: a few seconds
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# the edit loop: the linter, then unit tests of every room, slow ones left out
check: $(STAMP) lint
	$(PY) -m pytest -q $(PARALLEL) tests/unit -m "not slow"

# everything, what CI runs: the linter, then unit, integration (the configuration space included) and learning tests
test: $(STAMP) lint
	$(PY) -m pytest $(PARALLEL)

# the tests whose figures depend on rounding (equality of runs, learning, the configuration space) with this machine
# computing as an older CPU does: PyTorch's AVX2 kernels and oneDNN without AVX-512, so no native bf16 (precision auto
# takes fp32). CI runs it after `test`. On a CPU whose best kernels are AVX2 that set is the machine's own, which
# `make test` has just run bit for bit (same kernels, threads and seeds), so the leg takes the next set down there,
# PyTorch's unvectorised kernels (ATEN_CPU_CAPABILITY=default), over what fits CI's 90 minutes on such a CPU (a fresh
# clone's .ci/run took 44:37 to 72:31 there, CI 67:24): seven methods' two processes against one (float64, within
# their floors: docs/lab/tolerances.md; 2:42 with the unit tests, all 31 methods 4:15) and the precision and
# micro-batch unit tests. The learning tests under that set would add about 40 minutes. KERNELS picks another set by
# hand, e.g. KERNELS="ATEN_CPU_CAPABILITY=default".
BELOW_AVX512 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
BELOW_AVX2 := ATEN_CPU_CAPABILITY=default
BELOW_AVX2_TESTS := tests/integration/test_distributed.py tests/unit/train/test_precision.py \
	tests/unit/train/test_micro_batches.py tests/unit/methods/test_micro_batched_methods.py
# one method of each kind of state the processes must share: global BN and LARS, a queue with shuffled BN, an EMA
# target, prototypes with Sinkhorn, centres with multi-crop, an SVD (the largest ratio to its floor), a memory bank
BELOW_AVX2_METHODS := not (equal_one_on and not (simclr] or moco_v2 or byol or swav or dino] or mmcr or instdisc))
KERNELS ?= $(BELOW_AVX512)
ROUNDING_TESTS := tests/integration/test_distributed.py tests/integration/test_accumulate.py \
	tests/integration/test_stream_train.py tests/integration/test_config_space.py tests/learning \
	tests/unit/train/test_precision.py tests/unit/train/test_micro_batches.py \
	tests/unit/methods/test_micro_batched_methods.py
# Left out of this leg: how runs stop, fail and resume (marked lifecycle: exact or kernel-free), and the
# configuration space's bf16 cells (bf16 has no native kernels under AVX2; they were 74 % of the space's time).
# torch.compile's cache, one per kernel set: inductor reuses a kernel compiled under AVX-512 when the capability is
# capped to AVX2, and that kernel fails an index check ("index out of bounds: 0 <= tmp2 < 10")
empty :=
KERNELS_CACHE := $(CURDIR)/runs/inductor-$(subst $(empty) $(empty),_,$(subst =,-,$(KERNELS)))
test-kernels: $(STAMP)
	@best=$$($(PY) -c "import torch; print(torch.backends.cpu.get_cpu_capability())"); \
	if [ "$(KERNELS)" = "$(BELOW_AVX512)" ] && [ "$$best" != AVX512 ] && [ "$$best" != AMX ]; then \
	  echo "test-kernels: this CPU's best kernels are $$best, which make test ran; the next set down: $(BELOW_AVX2)"; \
	  env $(BELOW_AVX2) TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/runs/inductor-default $(PY) -m pytest $(PARALLEL) \
	    $(BELOW_AVX2_TESTS) -m "not lifecycle" -k "not test_micro_batches_equal_processes and $(BELOW_AVX2_METHODS)"; \
	else \
	  echo "test-kernels: $(KERNELS)"; \
	  env $(KERNELS) TORCHINDUCTOR_CACHE_DIR=$(KERNELS_CACHE) $(PY) -m pytest $(PARALLEL) $(ROUNDING_TESTS) \
	    -m "not lifecycle" -k "not (test_cell_trains and bf16)"; \
	fi

# on a machine with a CUDA GPU: the configuration space on the GPU and one timed SimCLR epoch
gpu: $(STAMP)
	bash benchmarks/gpu.sh

clean:
	rm -rf $(VENV) runs .pytest_cache
