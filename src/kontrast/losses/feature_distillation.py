"""Feature distillation: the student's features regress a frozen teacher's, both on the unit sphere.

For B images, the student's head output ``s [B, D_t]`` (the student encoder's features mapped to the teacher's
width) and the teacher's features ``t [B, D_t]`` of the same views:

    ŝ_i = s_i / ||s_i||,  t̂_i = t_i / ||t_i||                      (row-wise L2 normalisation, [B, D_t])
    L = 1 / (B D_t) sum_{i, d} (ŝ_id − t̂_id)²  =  mean_i (2 − 2 cos(s_i, t_i)) / D_t

the mean squared error of the normalised features, as ``F.mse_loss`` averages it: over the rows and the teacher's
D_t dimensions. It is BYOL's normalised MSE (:func:`kontrast.losses.normalized_mse`, summed over the dimensions)
divided by D_t, so its gradient is 1/D_t of BYOL's: an adaptive optimizer (AdamW, the method's default) does not see
the factor, SGD would need a learning rate D_t times larger. Normalising both sides makes the loss ignore the
teacher's feature scale, which differs from teacher to teacher, and bounds it: 0 ≤ L ≤ 4 / D_t.

The regression of a teacher's features with an MSE is the loss of LightlyTrain's feature distillation
(https://docs.lightly.ai/train/stable/methods/distillation.html, which applies it to the teacher's patch tokens),
after Beyer et al. 2022, "Knowledge distillation: A good teacher is patient and consistent",
https://arxiv.org/abs/2106.05237 (teacher and student see the same view). A per-row mean: W processes, each
averaging its own rows with the gradients averaged over them, compute what one process does on the global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def normalized_feature_mse(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """``mean((s/|s| − t/|t|)²)`` over rows and dimensions: 0-d.

    student: [B, D] the student's head output (gradient flows into it)
    teacher: [B, D] the teacher's features of the same views (no gradient is taken through it: detached here)
    """
    if student.shape != teacher.shape:
        raise ValueError(f"student {tuple(student.shape)} and teacher {tuple(teacher.shape)} features differ in shape")
    s = F.normalize(student, dim=1)  # [B, D] on the unit sphere
    t = F.normalize(teacher.detach().to(student.dtype), dim=1)  # [B, D]
    return (s - t).pow(2).mean()  # 1/(B D) sum_{i,d} (ŝ_id − t̂_id)²
