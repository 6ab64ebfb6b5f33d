"""Brace expansion of shard lists, as WebDataset writes them: ``"train-{000000..000127}.tar"``.

The bash forms that shard lists use (https://github.com/webdataset/webdataset): numeric ranges
``{a..b}`` (zero-padded to the width of a padded bound, descending when ``b < a``) and
alternatives ``{x,y,z}``, nested and several per pattern, expanded left to right in order.
A brace pair that is neither (``{}``, ``{x}``) stays as written, as in bash. Written here
instead of depending on the ``braceexpand`` package (on PyPI, unchanged since 2021) for these
few lines.
"""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
MAX_EXPANDED = 1_000_000  # a pattern naming more shards than this is a typo ({0..99999999})


def expand_braces(pattern: str) -> list[str]:
    """Every string ``pattern`` names, in order (``"a{1..3}"`` -> ``["a1", "a2", "a3"]``)."""
    out = _expand(pattern)
    if len(out) > MAX_EXPANDED:
        raise ValueError(f"{pattern!r} expands to {len(out)} names, more than {MAX_EXPANDED}")
    return out


def _expand(text: str) -> list[str]:
    start = text.find("{")
    while start >= 0:
        end = _matching_brace(text, start)
        if end < 0:
            return [text]  # unbalanced: literal, as in bash
        options = _options(text[start + 1 : end])
        if options is not None:
            head, tails = text[:start], _expand(text[end + 1 :])
            return [head + option + tail for body in options for option in _expand(body) for tail in tails]
        start = text.find("{", start + 1)  # not an expansion: keep the braces, look further on
    return [text]


def _matching_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return -1


def _options(body: str) -> list[str] | None:
    """The alternatives inside one brace pair, or None when it expands to nothing (kept literal)."""
    match = _RANGE.match(body)
    if match:
        a, b = match.groups()
        lo, hi = int(a), int(b)
        width = max(len(a), len(b)) if (a.lstrip("-").startswith("0") or b.lstrip("-").startswith("0")) else 0
        step = 1 if hi >= lo else -1
        if abs(hi - lo) >= MAX_EXPANDED:
            raise ValueError(f"{{{body}}} names more than {MAX_EXPANDED} shards")
        return [f"{n:0{width}d}" for n in range(lo, hi + step, step)]
    parts, depth, last = [], 0, 0
    for i, ch in enumerate(body):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(body[last:i])
            last = i + 1
    if not parts:
        return None
    return [*parts, body[last:]]
