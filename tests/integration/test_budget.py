"""benchmarks/budget.py: the schedule every method gets for a budget, from its pilots' paces (the rule of its
docstring), against a step-by-step count."""

from __future__ import annotations

import importlib.util
import math
import sys

from kontrast.augment.spec import side_schedule
from support import ROOT

spec = importlib.util.spec_from_file_location("budget", ROOT / "benchmarks/budget.py")
budget = importlib.util.module_from_spec(spec)
sys.modules["budget"] = budget
spec.loader.exec_module(budget)


def paces(ramp: bool) -> dict:
    pilots = [{"side": 16, "s_per_step": 0.5, "steps_per_epoch": 100}] if ramp else []
    return {"ramp": ramp, "pilots": [*pilots, {"side": 32, "s_per_step": 1.7, "steps_per_epoch": 100}]}


def steps_that_fit(budget_s: float, cost) -> int:
    """The naive count: the most steps whose schedule, laid over that many steps, fits the budget."""
    steps = 0
    while sum(cost(side) for side in side_schedule(steps + 1, 16, 32, (0.0, 0.75))) <= budget_s:
        steps += 1
    return steps


def test_a_step_costs_a_plus_b_side_squared_through_the_two_pilots():
    cost = budget.step_seconds(paces(ramp=True))
    assert math.isclose(cost(16), 0.5) and math.isclose(cost(32), 1.7)
    assert math.isclose(cost(24), 0.5 + 1.2 * (24 ** 2 - 16 ** 2) / (32 ** 2 - 16 ** 2))
    assert budget.step_seconds(paces(ramp=False))(16) == 1.7  # one pilot: one pace


def test_the_schedule_is_1_3_times_the_epochs_the_budget_holds_and_the_warm_up_shrinks_with_it():
    for budget_s in (60.0, 600.0):
        fits = steps_that_fit(budget_s, budget.step_seconds(paces(ramp=True)))
        got = budget.schedule(paces(ramp=True), budget_s, recipe_epochs=200, recipe_warmup=10)
        assert got["fits_epochs"] == round(fits / 100, 2)
        assert got["epochs"] == math.ceil(1.3 * fits / 100)
        assert got["warmup_epochs"] == round(10 * got["epochs"] / 200, 3)
    flat = budget.schedule(paces(ramp=False), 600.0, recipe_epochs=200, recipe_warmup=0)
    assert flat["fits_epochs"] == round(int(600 / 1.7) / 100, 2) and flat["warmup_epochs"] == 0


def test_each_kind_of_cpu_keeps_its_own_rows(monkeypatch):
    monkeypatch.setattr(budget, "native_bf16", lambda device: (True, "CPU AVX512 with amx_bf16 and avx512_bf16"))
    monkeypatch.setattr(budget, "cpu_flags", lambda: {"avx512f", "avx512_bf16", "amx_bf16"})
    assert budget.cpu_kind() == "amx"
    monkeypatch.setattr(budget, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert budget.cpu_kind() == "avx512-bf16"
    monkeypatch.setattr(budget, "native_bf16", lambda device: (False, "CPU AVX2 without AMX or AVX512-BF16"))
    monkeypatch.setattr(budget.torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert budget.cpu_kind() == "avx2"  # also a capped AVX-512 CPU (ATEN_CPU_CAPABILITY=avx2): it computes as one
