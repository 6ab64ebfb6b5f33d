"""Run under torchrun (tests/integration/test_distributed.py): the collectives kontrast's methods use, against
analytic answers.

Each rank checks its own results and exits non-zero with the failed check on stderr.
"""

import json
import math
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from kontrast.train.distributed import GlobalBatchNorm, ProcessGroupRanks, global_batch_norm

PASSED: list[str] = []  # what this rank checked, printed at the end for the test to compare with its list


def check(ok: bool, what: str) -> None:
    if not ok:
        print(f"rank {dist.get_rank()}: {what}", file=sys.stderr)
        sys.exit(1)
    PASSED.append(what)


def near(x: torch.Tensor, reference: torch.Tensor, terms: int) -> bool:
    """Equal up to the rounding of a sum of ``terms`` values of the dtype (the standard bound of recursive summation:
    terms x eps x the largest magnitude), not a tolerance tuned to pass."""
    bound = terms * torch.finfo(reference.dtype).eps * max(reference.abs().max().item(), 1.0)
    return (x - reference).abs().max().item() <= bound


def main() -> None:
    dist.init_process_group("gloo")
    ranks = ProcessGroupRanks()
    r, w = ranks.rank, ranks.world
    torch.manual_seed(0)  # every rank draws the same global tensors, then takes its slice

    # gather: rank-ordered concatenation; gradient of sum(weights * gathered) is the sum over ranks of their weights
    x_all = torch.randn(w * 3, 4, dtype=torch.float64)
    weights = torch.randn(w, w * 3, 4, dtype=torch.float64)  # rank q's weights on the gathered tensor
    x = x_all[r * 3:(r + 1) * 3].clone().requires_grad_(True)
    gathered = ranks.gather(x)
    check(torch.equal(gathered.detach(), x_all), "gather is not the rank-ordered concatenation")
    (gathered * weights[r]).sum().backward()
    expected = weights.sum(0)[r * 3:(r + 1) * 3]  # d/dx_r of sum_q <weights_q, gathered>
    check(torch.allclose(x.grad, expected), f"gather gradient {x.grad} != {expected}")

    # a non-contiguous input (a transposed view) keeps its gradient (pytorch issue 120386)
    base = x_all[r * 3:(r + 1) * 3].T.contiguous().requires_grad_(True)  # [4, 3]
    view = base.T  # [3, 4], not contiguous
    check(not view.is_contiguous(), "test setup: the view should be non-contiguous")
    (ranks.gather(view) * weights[r]).sum().backward()
    check(base.grad is not None and torch.allclose(base.grad.T, expected), "non-contiguous input lost its gradient")

    # pass_on: rank r - 1's rows come back; the gradient of sum(weights_r * received) reaches the sender, rank r - 1
    y = x_all[r * 3:(r + 1) * 3].clone().requires_grad_(True)
    received = ranks.pass_on(y)
    previous = (r - 1) % w
    check(torch.equal(received.detach(), x_all[previous * 3:(previous + 1) * 3]), "pass_on brings rank r-1's rows")
    (received * weights[r][:3]).sum().backward()
    check(torch.allclose(y.grad, weights[(r + 1) % w][:3]), f"pass_on gradient {y.grad} reaches the sender")

    # GlobalBatchNorm on each rank's slice == BatchNorm on the global batch (output, gradients, running stats),
    # for maps (BatchNorm2d) and vectors (BatchNorm1d, the heads)
    for bn, shape in ((nn.BatchNorm2d, (3, 5, 5)), (nn.BatchNorm1d, (3,))):
        images = torch.randn(w * 4, *shape)
        upstream = torch.randn(w * 4, *shape)
        reference = bn(3)
        nn.init.uniform_(reference.weight)
        nn.init.uniform_(reference.bias)
        syncd = global_batch_norm(nn.Sequential(bn(3)))[0]
        syncd.load_state_dict(reference.state_dict())
        check(isinstance(syncd, GlobalBatchNorm), "global_batch_norm did not convert")
        xs = images.clone().requires_grad_(True)
        expected_out = reference(xs)
        (expected_out * upstream).sum().backward()
        mine = images[r * 4:(r + 1) * 4].clone().requires_grad_(True)
        # under DDP, as a step runs it: BN's backward all_reduce between DDP's bucket all_reduces (the wrapper held
        # till the backward ends: its reducer's hooks go with it)
        replicas = DistributedDataParallel(syncd, forward_sync_buffers=False)
        out = replicas(mine)
        (out * upstream[r * 4:(r + 1) * 4]).sum().backward()  # DDP averages the parameters' gradients over ranks
        terms = w * 4 * math.prod(shape[1:])  # values each channel's statistics and parameter gradients sum
        check(near(out, expected_out[r * 4:(r + 1) * 4], terms), f"{bn.__name__} output")
        # the global loss is the sum of the ranks' here, so its gradient is w times DDP's average
        check(near(mine.grad, xs.grad[r * 4:(r + 1) * 4], terms), f"{bn.__name__} input gradient")
        check(near(syncd.weight.grad * w, reference.weight.grad, terms)
              and near(syncd.bias.grad * w, reference.bias.grad, terms), f"{bn.__name__} weight, bias gradient")
        check(near(syncd.running_var, reference.running_var, terms)
              and near(syncd.running_mean, reference.running_mean, terms), f"{bn.__name__} running stats")
    for speaker in range(w):  # one rank at a time: the lines of the ranks' reports never interleave
        if speaker == r:
            print(json.dumps({"rank": r, "passed": PASSED}), flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
