"""Helpers shared by the test tiers: argument lists, paper reference formulas, the CLI in-process, covering arrays."""
