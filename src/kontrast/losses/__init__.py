"""Loss room: pure functions of scores / embeddings, plus stores of negatives."""

from kontrast.losses.bootstrap import negative_cosine, normalized_mse
from kontrast.losses.infonce import info_nce, moco_loss, nt_xent
from kontrast.losses.negatives import Queue

__all__ = ["info_nce", "nt_xent", "moco_loss", "negative_cosine", "normalized_mse", "Queue"]
