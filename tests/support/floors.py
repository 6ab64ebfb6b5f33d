"""Tolerances from the machine: two training runs that must agree are compared with a floor measured on the spot.

An equality between two runs (W processes against one, micro-batches against processes, a resumed run against an
uninterrupted one) cannot hold bit for bit: splitting a batch changes the order of every sum, and another CPU's
kernels (AVX2 or AVX-512, oneDNN's AMX path, another thread count) round differently again. How far such rounding
carries after a few steps depends on the run: a method whose short run is chaotic amplifies it a thousandfold. So the
tolerance is not a constant. The *floor* is how far the same run drifts from a change that must not matter, at the
scale of rounding: the run again with every parameter nudged one unit in the last place before its first step
(``KONTRAST_FAULTS=nudge_weights=1``, kontrast.train.faults). A pair of runs agrees when each difference (loss per
step, every weight) is within :data:`FACTOR` times its floor.

Why the factor is what it is: the nudge perturbs each weight once, by one ulp; splitting a batch perturbs every
reduction of every step by a few ulps of its result. Both then grow at the rate the run amplifies rounding, which is
what the floor measures, so their ratio stays within an order of magnitude or two whatever the CPU; the ratios
measured on every method, under AVX2 and default kernels, are in docs/lab/tolerances.md. A logic error (a gradient
averaged over the wrong count, a sample missing from a gather, a queue updated twice) moves the weights by a share
of the learning rate from the first step: many orders of magnitude above the floor, unless the run is so chaotic
that its floor is of that order too, which :func:`assert_floor_meaningful` refuses.

The runs compared train in float64 (:data:`PRECISION`). In float32 a floor cannot foresee a rounding that carries an
activation across a kink (a ReLU's zero, a max-pool tie), where a gradient jumps by a share of the learning rate:
under PyTorch's unvectorised kernels four comparisons failed so, while under AVX2 and AVX-512 they passed
(docs/lab/tolerances.md). Float64 rounding is 2^29 times finer, and the same pairs agree there on every kernel set.
What the comparisons check (the split of a batch over processes and micro-batches, a resume) does not depend on the
dtype; float32 training is what the learning tests and the configuration space run.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from kontrast.checkpoint import latest_checkpoint

# float64: the runs compared are checks of arithmetic that must not depend on how a batch is split, and float64 keeps
# rounding far from every kink on every kernel set (the module doc); `train.precision=fp64` for every run of a pair
PRECISION = "train.precision=fp64"
FACTOR = 50.0  # a difference may be this many times the floor (see the module doc and docs/lab/tolerances.md)
NUDGE = "nudge_weights=1"  # KONTRAST_FAULTS for the floor's run
# The floor is never below one rounding of the values compared per step compared, in the dtype the runs trained in: a
# run that does not amplify rounding leaves a one-ulp nudge at one ulp, while a split batch rounds every step's update
# apart again (MMCR on 2 ranks in float64: the nudge stayed at 6.7e-16 under AVX2 and grew to 1e-14 under PyTorch's
# default kernels, the pair 2.8e-14 and 1e-14 apart; docs/lab/tolerances.md)
EPS32 = float(torch.finfo(torch.float32).eps)
BN_STATISTICS = ("running_mean", "running_var")
LOG_ENV = "KONTRAST_FLOOR_LOG"
# The floor must stay far below what a logic error moves: a one-ulp nudge that has grown to a ten-thousandth of the
# weights' scale within the test's few steps is divergence, not rounding, and FACTOR times it would pass real errors.
MEANINGFUL = 1e-4


@dataclass(frozen=True)
class Difference:
    """The largest difference between two runs: of the loss at any logged step, and of any weight."""

    loss: float
    weights: float
    loss_scale: float  # the largest |loss| seen, for the one-rounding minimum
    weight_scale: float  # the largest |weight| seen
    eps: float = EPS32  # one rounding of the dtype the runs trained in
    steps: int = 1  # the steps compared: n steps of one formula may differ by n roundings (EPS32 above)

    def loss_bound(self) -> float:
        return max(self.loss, self.eps * self.steps * self.loss_scale)

    def weight_bound(self) -> float:
        return max(self.weights, self.eps * self.steps * self.weight_scale)


def losses(run: Path) -> list[float]:
    """The loss of every logged step of a run folder's metrics.jsonl."""
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def weights(run: Path, bn_statistics: bool = True) -> dict[str, torch.Tensor]:
    """The latest checkpoint's floating-point tensors as trained (``bn_statistics=False``: BN running statistics
    left out)."""
    state = load_file(latest_checkpoint(run) / "model.safetensors")
    return {k: v for k, v in state.items()
            if v.is_floating_point() and (bn_statistics or not k.endswith(BN_STATISTICS))}


def difference(a: Path, b: Path, bn_statistics: bool = True) -> Difference:
    """How far run ``b`` is from run ``a``: losses step by step, weights tensor by tensor (the same steps logged)."""
    la, lb = losses(a), losses(b)
    assert len(la) == len(lb), (len(la), len(lb))
    wa, wb = weights(a, bn_statistics), weights(b, bn_statistics)
    assert wa.keys() == wb.keys()
    dtypes = {v.dtype for v in [*wa.values(), *wb.values()]}
    assert len(dtypes) == 1, f"{a.name} and {b.name} trained in {sorted(map(str, dtypes))}: compare runs of one dtype"
    loss = max((abs(x - y) for x, y in zip(la, lb)), default=0.0)
    weight = max((float((wa[k].double() - wb[k].double()).abs().max()) for k in wa if wa[k].numel()), default=0.0)
    return Difference(loss, weight, max((abs(x) for x in la), default=0.0),
                      max((float(v.abs().max()) for v in wa.values() if v.numel()), default=0.0),
                      float(torch.finfo(dtypes.pop()).eps), max(len(la), 1))


def assert_floor_meaningful(floor: Difference, what: str = "") -> None:
    """The floor itself is rounding, not divergence: otherwise the comparison would pass a logic error."""
    assert floor.weights <= MEANINGFUL * max(floor.weight_scale, 1.0), (
        f"{what}: the run is too chaotic for an equality test (a one-ulp nudge moved a weight by {floor.weights:.3g}); "
        f"compare fewer steps or a smaller learning rate and say why")


def assert_runs_agree(a: Path, b: Path, nudged: Path, what: str, bn_statistics: bool = True) -> None:
    """Runs ``a`` and ``b`` within the floor of ``a`` against its nudged twin, in loss and weights."""
    assert_agree(difference(a, b, bn_statistics), difference(a, nudged, bn_statistics), what)


def assert_agree(diff: Difference, floor: Difference, what: str = "", factor: float = FACTOR) -> None:
    """``diff`` (the pair under test) within ``factor`` times ``floor`` (the nudged pair), loss and weights.
    With ``$KONTRAST_FLOOR_LOG`` set, each comparison is appended there first (docs/lab/tolerances.md's table)."""
    if os.environ.get(LOG_ENV):
        with open(os.environ[LOG_ENV], "a") as f:
            f.write(json.dumps({"what": what, "diff": asdict(diff), "floor": asdict(floor),
                                "floor_loss": floor.loss_bound(), "floor_weights": floor.weight_bound(),
                                "ratio_loss": diff.loss / floor.loss_bound(),
                                "ratio_weights": diff.weights / floor.weight_bound()}) + "\n")
    assert_floor_meaningful(floor, what)
    assert diff.loss <= factor * floor.loss_bound(), (
        f"{what}: loss differs by {diff.loss:.3g} > {factor:g} x floor {floor.loss_bound():.3g}")
    assert diff.weights <= factor * floor.weight_bound(), (
        f"{what}: weights differ by {diff.weights:.3g} > {factor:g} x floor {floor.weight_bound():.3g}")
