"""The kNN monitor of a training run: kNN top-1 of the encoder on held-out data at epoch ends."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from kontrast.config import Config
from kontrast.data import load_images
from kontrast.data.stream_source import StreamSource, is_shard_spec
from kontrast.errors import UserError
from kontrast.evaluate.protocol import evaluate_encoder
from kontrast.methods.build import view_specs
from kontrast.train.rundir import MetricLog
from kontrast.train.step import StepContext


@dataclass
class KnnMonitor:
    """kNN top-1 of the encoder on held-out data at epoch ends (``train.knn_every``)."""

    cfg: Config
    ctx: StepContext
    train: object
    test: object

    @classmethod
    def create(cls, cfg: Config, data, ctx: StepContext) -> "KnnMonitor | None":
        tc = cfg.train
        if not tc.knn_every or data.labels is None:
            return None
        try:
            test = load_images(cfg.data.source, "test", size=cfg.data.size, cache_dir=cfg.data.cache_dir,
                               skip_bad_images=cfg.data.skip_bad_images)
        except UserError as exc:  # shards without an index hold one split
            if not is_shard_spec(cfg.data.source):
                raise
            print(f"note: no kNN monitor: {exc}", file=sys.stderr)
            return None
        if isinstance(data, StreamSource):  # the streaming path: the monitor's bank decoded whole, at most knn_max_train
            data = data.decoded(tc.knn_max_train, cfg.data.size, seed=tc.seed)
        return cls(cfg, ctx, data, test.subset(tc.knn_max_test, seed=tc.seed))

    def __call__(self, epoch: int, step: int, log: MetricLog, bar) -> None:
        specs = view_specs(self.cfg, self.ctx.method)
        mean, std = (specs[0].mean, specs[0].std) if specs else (None, None)  # sequences: not normalised
        res = evaluate_encoder(self.ctx.method.encoder, self.train, self.test, self.cfg.eval, mean=mean, std=std,
                               device=str(self.ctx.device), precision=self.cfg.train.precision, linear=False,
                               max_train=self.cfg.train.knn_max_train)
        log.write(step, {"epoch": epoch, "knn_top1": res["knn_top1"]})
        bar.write(f"epoch {epoch}: kNN top-1 {res['knn_top1']:.4f}")
        self.ctx.method.train()
