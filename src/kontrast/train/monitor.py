"""The kNN monitor of a training run: kNN top-1 of the encoder on held-out data at epoch ends."""

from __future__ import annotations

import sys

from kontrast.data import load_images
from kontrast.data.stream_source import StreamSource, is_shard_spec
from kontrast.errors import UserError
from kontrast.evaluate.options import EvalOptions
from kontrast.evaluate.protocol import evaluate_encoder
from kontrast.train.data_path import load_validation
from kontrast.train.events import Listener
from kontrast.train.plan import RunPlan


class KnnMonitor(Listener):
    """kNN top-1 of the encoder on held-out data: of the untrained encoder at a run's start, then at the end of every
    ``train.knn_every``-th epoch and of the last (rank 0 only; the baseline every later figure is read against)."""

    def __init__(self, plan: RunPlan, train, test):
        self.plan, self.train, self.test = plan, train, test

    @classmethod
    def create(cls, plan: RunPlan, data) -> KnnMonitor | None:
        """The monitor of a run on ``data`` (its training split), or None: off, unlabelled, or no test split."""
        cfg = plan.cfg
        tc = cfg.train
        if not tc.knn_every or data.labels is None:
            return None
        if cfg.data.validation:  # the rows held out of the training split, not the test split
            return cls(plan, _bank(data, cfg), load_validation(cfg).subset(tc.knn_max_test, seed=tc.seed))
        try:
            test = load_images(cfg.data.source, "test", size=cfg.data.size, cache_dir=cfg.data.cache_dir,
                               skip_bad_images=cfg.data.skip_bad_images)
        except UserError as exc:  # shards without an index hold one split
            if not is_shard_spec(cfg.data.source):
                raise
            print(f"note: no kNN monitor: {exc}", file=sys.stderr)
            return None
        return cls(plan, _bank(data, cfg), test.subset(tc.knn_max_test, seed=tc.seed))

    def run_start(self, loop) -> None:
        if loop.start_step == 0:
            self.measure(loop, 0)

    def epoch_end(self, loop, epoch: int) -> None:
        tc = self.plan.cfg.train
        if (epoch + 1) % tc.knn_every == 0 or epoch + 1 == tc.epochs:
            self.measure(loop, epoch + 1)

    def measure(self, loop, epoch: int) -> None:
        views, cfg, method = self.plan.views, self.plan.cfg, loop.ctx.method
        mean, std = (views[0].mean, views[0].std) if views else (None, None)  # sequences: not normalised
        options = EvalOptions(device=str(loop.ctx.device), precision=cfg.train.precision, linear=False,
                              clustering=False)  # kNN alone
        bank = self.train.subset(cfg.train.knn_max_train)  # at most knn_max_train rows (0: all)
        res = evaluate_encoder(method.encoder, bank, self.test, cfg.eval, options, mean=mean, std=std)
        key, split = ("knn_val_top1", " (validation)") if cfg.data.validation else ("knn_top1", "")
        loop.events.emit("record", loop, {"epoch": epoch, key: res["knn_top1"]},
                         f"epoch {epoch}: kNN top-1{split} {res['knn_top1']:.4f}")
        method.train()


def _bank(data, cfg):
    """The kNN bank's source: the training rows (the streaming path's decoded whole, at most knn_max_train)."""
    if isinstance(data, StreamSource):
        return data.decoded(cfg.train.knn_max_train, cfg.data.size, seed=cfg.train.seed)
    return data
