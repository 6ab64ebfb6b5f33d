"""Helpers shared by the test tiers: argument lists, paper reference formulas, the CLI in-process, covering arrays."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: README, configs/, benchmarks/, src/
