"""The run configuration: its schema, and the description of every key.

``schema``: the sections as frozen dataclasses, strict loading, YAML and ``--set`` input, the dump kept beside
each run. ``keys``: every key with its value and one line saying what it is (``kontrast config``; the reference
page of docs). Resolution (a method's defaults under the user's values) is
:func:`kontrast.methods.build.resolve`, which needs the methods.
"""

from kontrast.config.schema import (
    SECTIONS,
    AugmentConfig,
    Config,
    DataConfig,
    EncoderConfig,
    EvalConfig,
    MethodConfig,
    OptimConfig,
    TrainConfig,
    build_config,
    check_fields,
    checked,
    dump,
    load_yaml,
    merge,
    parse_override,
    parse_section,
    to_dict,
)

__all__ = ["SECTIONS", "AugmentConfig", "Config", "DataConfig", "EncoderConfig", "EvalConfig", "MethodConfig",
           "OptimConfig", "TrainConfig", "build_config", "check_fields", "checked", "dump", "load_yaml", "merge",
           "parse_override", "parse_section", "to_dict"]
