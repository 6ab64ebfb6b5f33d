"""The equality tests' differences against their floors, as a table (docs/lab/tolerances.md).

Every comparison of two training runs in the suite (tests/support/floors.py) appends what it measured to
``$KONTRAST_FLOOR_LOG`` when that is set. Run the equality tests once per kernel set, each into its own log, then:

    KONTRAST_FLOOR_LOG=$PWD/runs/floors-native.jsonl make test
    KONTRAST_FLOOR_LOG=$PWD/runs/floors-avx2.jsonl make test-kernels
    .venv/bin/python benchmarks/floors_table.py native=runs/floors-native.jsonl avx2=runs/floors-avx2.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(label: str, path: Path) -> list[dict]:
    """A log's comparisons, the last record of each (a test run again appends its new figures)."""
    records = [{"kernels": label, **json.loads(line)} for line in path.read_text().splitlines() if line.strip()]
    return list({r["what"]: r for r in records}.values())


def table(records: list[dict]) -> str:
    out = ["| comparison | kernels | loss: difference / floor | ratio | weights: difference / floor | ratio |",
           "|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r["what"], r["kernels"])):
        d, floor_loss, floor_w = r["diff"], r["floor_loss"], r["floor_weights"]
        out.append(f"| {r['what']} | {r['kernels']} | {d['loss']:.2g} / {floor_loss:.2g} | {r['ratio_loss']:.2f} | "
                   f"{d['weights']:.2g} / {floor_w:.2g} | {r['ratio_weights']:.2f} |")
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) < 2 or not all("=" in a for a in sys.argv[1:]):
        sys.exit("usage: floors_table.py LABEL=FLOOR_LOG.jsonl [LABEL=...]")
    records = [r for arg in sys.argv[1:] for r in rows(*(lambda k, v: (k, Path(v)))(*arg.split("=", 1)))]
    print(table(records))
    for label in dict.fromkeys(r["kernels"] for r in records):
        mine = [r for r in records if r["kernels"] == label]
        worst = max(mine, key=lambda r: max(r["ratio_loss"], r["ratio_weights"]))
        largest = max(worst["ratio_loss"], worst["ratio_weights"])
        print(f"\n{label}: {len(mine)} comparisons; largest ratio {largest:.2f}"
              f" ({worst['what']}); median weight ratio "
              f"{sorted(r['ratio_weights'] for r in mine)[len(mine) // 2]:.2f}")
    print("\ncommand: .venv/bin/python benchmarks/floors_table.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
