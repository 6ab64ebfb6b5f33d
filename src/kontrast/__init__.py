"""kontrast: contrastive self-supervised learning as five composable components.

Rooms (imports point downward only): cli -> train / evaluate -> methods ->
augment, encoders, extract, similarity, losses, data.
"""

__version__ = "0.1.0"
