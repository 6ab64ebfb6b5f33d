"""Methods: each one small file composing the rooms. ``METHODS`` lists them."""

from __future__ import annotations

from kontrast.registry import Registry

METHODS = Registry("method")

# Registration happens on import; keep this list in sync with the files.
from kontrast.methods import byol, moco_v2, simclr  # noqa: E402,F401
from kontrast.methods.base import Method  # noqa: E402

__all__ = ["METHODS", "Method"]
