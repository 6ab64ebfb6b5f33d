"""Covering arrays of strength 2: every pair of values of any two factors in at least one cell.

A greedy construction in the manner of AETG (Cohen et al. 1997, "The AETG system"): each new cell starts
from the first pair still uncovered and fills the other factors one by one with the value that covers the
most uncovered pairs, ties going to the cheaper value. Deterministic: the same factors give the same cells.
Pairs that ``allowed`` rejects are neither required nor produced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import combinations

Cell = dict[str, object]


def all_pairs(factors: Mapping[str, Sequence], allowed: Callable[[Cell], bool] = lambda cell: True) -> set:
    """Every ``((f1, v1), (f2, v2))`` with f1 before f2 in ``factors`` that some allowed cell can hold."""
    names = list(factors)
    return {((a, va), (b, vb)) for a, b in combinations(names, 2) for va in factors[a] for vb in factors[b]
            if allowed({a: va, b: vb})}


def pairs_of(cell: Cell, names: Sequence[str]) -> set:
    return {((a, cell[a]), (b, cell[b])) for a, b in combinations(names, 2) if a in cell and b in cell}


def covering_array(factors: Mapping[str, Sequence], allowed: Callable[[Cell], bool] = lambda cell: True,
                   cost: Callable[[Cell], float] = lambda cell: 0.0) -> list[Cell]:
    """Cells (dicts factor -> value) covering every allowed pair; ``allowed`` sees partial cells too."""
    names = list(factors)
    uncovered = all_pairs(factors, allowed)
    cells: list[Cell] = []
    while uncovered:
        (a, va), (b, vb) = min(uncovered, key=lambda p: (names.index(p[0][0]), names.index(p[1][0]),
                                                         list(factors[p[0][0]]).index(p[0][1]),
                                                         list(factors[p[1][0]]).index(p[1][1])))
        cell: Cell = {a: va, b: vb}
        for name in names:
            if name in cell:
                continue
            options = [v for v in factors[name] if allowed({**cell, name: v})]
            cell[name] = max(options, key=lambda v: (len(pairs_of({**cell, name: v}, names) & uncovered),
                                                     -cost({**cell, name: v}), -list(factors[name]).index(v)))
        uncovered -= pairs_of(cell, names)
        cells.append(cell)
    return cells
