"""Every config key with its value and one line saying what it is: ``kontrast config`` prints them.

A key's description is the comment beside its field in the schema (:mod:`kontrast.config.schema`, a method's
``Params``): the source says it once, and the command and the reference page read it from there.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
from functools import cache

import yaml

from kontrast.config.schema import SECTIONS, Config, to_dict

METHOD_NAME = "the method (`kontrast methods` lists them); its own keys follow"


@cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: the comment beside it}`` for dataclass ``cls`` and the dataclasses it extends."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        docs.update(_own_docs(klass))
    return docs


def _own_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # defined where no source is kept
        return {}
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    text = source.splitlines()
    docs = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            end = node.end_lineno or node.lineno
            while end < len(text) and text[end].strip().startswith("#"):  # a comment continued on the next lines
                end += 1
            said = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
            if said:
                docs[node.target.id] = " ".join(said)
    return docs


def yaml_value(value) -> str:
    """``value`` as YAML on one line (a list in brackets, a string quoted where YAML needs it)."""
    return yaml.safe_dump([value], default_flow_style=True, width=1 << 16).strip()[1:-1]


def describe(cfg: Config) -> str:
    """The resolved ``cfg`` as YAML, each key with its description as a comment: a file ``--config`` reads back."""
    out = []
    for section, values in to_dict(cfg).items():
        docs = _section_docs(cfg, section)
        out.append(f"{section}:")
        for key, value in values.items():
            doc = METHOD_NAME if (section, key) == ("method", "name") else docs.get(key, "")
            line = f"  {key}: {yaml_value(value)}"
            out.append(f"{line:<36s} # {doc}" if doc else line)
    return "\n".join(out)


def _section_docs(cfg: Config, section: str) -> dict[str, str]:
    """The descriptions of one section's keys (the method section's are its Params')."""
    cls = type(cfg.method.params) if section == "method" else SECTIONS[section]
    return field_docs(cls) if dataclasses.is_dataclass(cls) else {}


def undocumented(cfg: Config) -> list[str]:
    """Keys of ``cfg`` without a description (the schema's and the method's): a test keeps this empty."""
    missing = []
    for section, values in to_dict(cfg).items():
        docs = _section_docs(cfg, section)
        missing += [f"{section}.{key}" for key in values if key not in docs and (section, key) != ("method", "name")]
    return missing


def keys_markdown(cls: type, prefix: str) -> str:
    """A Markdown table of dataclass ``cls``'s keys (``prefix.key``), their defaults and descriptions."""
    docs = field_docs(cls)
    rows = [f"| `{prefix}.{f.name}` | `{yaml_value(_default(f))}` | {_cell(docs.get(f.name, ''))} |"
            for f in dataclasses.fields(cls)]
    return "\n".join(["| key | default | what it is |", "|---|---|---|", *rows])


def _default(f: dataclasses.Field):
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default
    return list(value) if isinstance(value, tuple) else value


def _cell(text: str) -> str:
    """``text`` inside a Markdown table cell (its pipes escaped)."""
    return text.replace("|", "\\|")
