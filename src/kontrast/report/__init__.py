"""``kontrast report``: one self-contained HTML page about a run (curves, embedding map, nearest
neighbours, augmented views, config and summary), for a person to read in a browser.

:mod:`~kontrast.report.metrics` reads the run directory, :mod:`~kontrast.report.embedding`
computes what the pictures show, :mod:`~kontrast.report.figures` draws them (matplotlib, Agg,
PNG bytes), :mod:`~kontrast.report.page` assembles the HTML and :mod:`~kontrast.report.write`
puts it together: :func:`write_report`.
"""

from kontrast.report.write import write_report

__all__ = ["write_report"]
