"""Loss room: pure functions of scores / embeddings, plus stores of negatives."""

from kontrast.losses.bootstrap import negative_cosine, normalized_mse
from kontrast.losses.chunked import info_nce_chunked
from kontrast.losses.decoupled import decoupled_info_nce, von_mises_fisher_weights
from kontrast.losses.distillation import (
    dino_loss,
    mean_entropy,
    target_statistics,
    teacher_distribution,
    teacher_temperature,
    update_centre,
)
from kontrast.losses.infonce import (
    info_nce,
    mi_bound,
    moco_loss,
    nt_xent,
    symmetric_info_nce,
    two_view_info_nce,
    two_view_targets,
    use_blocks,
)
from kontrast.losses.local import nce_shared_negatives, score_penalty
from kontrast.losses.nce import estimate_log_z, nce_loss
from kontrast.losses.negatives import MemoryBank, Queue
from kontrast.losses.redundancy import barlow_twins_loss, vicreg_loss
from kontrast.losses.spectral import spectral_contrastive_loss, spectral_loss_from_scores

__all__ = ["info_nce", "mi_bound", "nce_shared_negatives", "score_penalty",
           "nt_xent", "moco_loss", "symmetric_info_nce", "negative_cosine", "normalized_mse", "Queue",
           "spectral_contrastive_loss", "spectral_loss_from_scores", "two_view_info_nce", "two_view_targets",
           "use_blocks", "MemoryBank", "nce_loss", "estimate_log_z", "info_nce_chunked", "barlow_twins_loss",
           "vicreg_loss", "decoupled_info_nce", "von_mises_fisher_weights", "dino_loss", "mean_entropy",
           "target_statistics", "teacher_distribution", "teacher_temperature", "update_centre"]
