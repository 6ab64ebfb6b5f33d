"""Shared test fixtures, and one thread per process when the suite runs on several (``pytest -n 2``)."""

import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # several test processes share the cores: one thread each, for them and
    os.environ["OMP_NUM_THREADS"] = "1"  # the processes they start (2 x 1 thread beat 1 x 2 threads on small models)
    import torch

    torch.set_num_threads(1)


# The suite's longest tests on the 2-core CI machine (their durations in a full `make test` on an AVX-512 CPU, in
# seconds), run first so the two test processes end together: pytest-xdist's worksteal hands each process half of the
# list and lets an idle one take the tail of the other's queue, so a long test left at the end runs alone. The two
# torch.compile tests are long only with inductor's cache empty, as on a fresh clone (181 s and 88 s on an AVX2 CPU,
# where the learning tests take 3.5 times their figures here; 9 s and under 7 s with the cache filled).
LONGEST = {"test_learning[infomin]": 114, "test_learning[dino]": 56, "test_learning[cpc_v2]": 47,
           "test_learning_on_a_vit": 42, "test_learning[amdim]": 41, "test_learning[moco_v2]": 34,
           "test_learning[yadim]": 33, "test_a_killed_rank_ends_the_run_and_resume_continues_bit_for_bit": 31,
           "test_learning[moco_v3]": 30, "test_learning[simsiam]": 27, "test_learning[clip]": 27,
           "test_learning[mmcr]": 27, "test_learning[moco_v1]": 25, "test_learning[barlow_twins]": 25,
           "test_learning[supcon]": 25, "test_learning[ibot]": 25, "test_resume_at_another_world_size_continues": 24,
           "test_learning[simclr_v2]": 24, "test_learning[byol]": 24, "test_learning[swav]": 22,
           "test_learning[vicreg]": 22, "test_distill_learns_from_a_trained_teacher": 22,
           "test_a_plugin_method_on_two_processes_resumes_without_the_option": 21, "test_learning[mae]": 20,
           "test_learning[nnclr]": 19, "test_compiled_views_equal_eager_views_and_compile_once": 50,
           "test_bench_compiled_views_column": 25}


def pytest_collection_modifyitems(config, items):
    """Under ``-n 2`` each process's half of the list starts with long tests (:data:`LONGEST`, dealt out longest
    first to the half with less so far), so both begin with them and the short ones fill the end; the rest keep
    their order. Without xdist the order is unchanged."""
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT") != "2":
        return
    long = sorted((item for item in items if item.name in LONGEST), key=lambda item: -LONGEST[item.name])
    rest = [item for item in items if item.name not in LONGEST]
    halves, sums = ([], []), [0, 0]
    for item in long:
        side = sums.index(min(sums))
        halves[side].append(item)
        sums[side] += LONGEST[item.name]
    cut = len(items) // 2 - len(halves[0])  # worksteal gives the first process len // 2 tests, the other the rest
    items[:] = halves[0] + rest[:cut] + halves[1] + rest[cut:]


@pytest.fixture
def shared_cifar_tar() -> Path:
    """../shared/data/cifar10-jpeg.tar.gz; skips when absent, fails when absent under CI=true."""
    path = Path(__file__).resolve().parents[2] / "shared/data/cifar10-jpeg.tar.gz"
    if not path.is_file():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"shared data missing under CI=true: {path}")
        pytest.skip(f"shared data not found: {path}")
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Many small ops: on a shared 2-core box OpenMP barriers make 2 threads far slower than 1
    (``pytestmark = pytest.mark.usefixtures("one_thread")`` in a module)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Every test starts with the process's thread count: a test that sets it (the bench CLI, a 1-thread
    run) must not change the float summation order, and with it the trajectory, of the tests after it."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_simclr_run(tmp_path_factory) -> Path:
    """One finished tiny run for the tests that only read a run (export, report) or damage a copy of it
    (checkpoints): SimCLR on 32 shapes at 16 px, width 0.125, batch 16, 2 epochs of 2 steps (checkpoints step-2
    and step-4), the kNN monitor every epoch, one CPU thread. Built once per test process; copy it before
    writing anything into it."""
    from support.args import train_command
    from support.cli import in_process

    out = tmp_path_factory.mktemp("shared") / "simclr"
    assert in_process(train_command(out, method="simclr", settings=["train.knn_every=1"])) == 0
    return out
