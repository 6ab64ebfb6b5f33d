"""A user's config, assembled: a run's saved config (on ``--resume``), ``--config FILE``, ``--method``, the
command's flags, ``--set key=value`` items; later wins. The result is the raw nested dict that
:func:`kontrast.methods.build.resolve` turns into a :class:`~kontrast.config.Config` (method defaults under it)."""

from __future__ import annotations

from kontrast.config.schema import load_yaml, merge, parse_override
from kontrast.errors import UserError


def assemble(*, saved: dict | None = None, config_file: str | None = None, method: str | None = None,
             flags: dict | None = None, sets: list[str] = (), where: str = "") -> dict:
    """The raw config from its sources, in order. ``saved``: a run's own config (resuming it: ``--method`` must name
    its method; ``where`` is the run's folder, for that error). ``flags``: ``{section: {key: value or None}}``,
    the None values left out (a flag not given)."""
    raw = dict(saved or {})
    if config_file:
        raw = merge(raw, load_yaml(config_file))
    if method:
        before = (raw.get("method") or {}).get("name")
        if saved and before and before != method:
            raise UserError(f"{where} was trained with --method {before}, not {method}; drop --method to resume")
        if before != method:
            raw["method"] = {"name": method}  # another method's keys do not carry over
    for section, values in (flags or {}).items():
        raw = merge(raw, {section: {k: v for k, v in values.items() if v is not None}})
    for item in sets:
        raw = merge(raw, parse_override(item))
    return raw
