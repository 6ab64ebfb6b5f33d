"""The report's HTML: one self-contained page (inline CSS, PNGs as base64 data URIs, no scripts,
no external resources), so it opens anywhere, offline, and can be mailed as one file.

Every piece is a function returning an HTML string; all text goes through :func:`html.escape`.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Mapping

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       max-width: 1180px; margin: 0 auto; padding: 1.2em 1.6em 3em; color: #1f2328; background: #fff;
       line-height: 1.45; }
h1 { font-size: 1.6em; margin: 0.2em 0 0.1em; }
h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #d0d7de; padding-bottom: 0.25em; }
.sub { color: #59636e; margin-top: 0; }
nav a { margin-right: 1em; color: #0969da; text-decoration: none; }
figure { margin: 0.6em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { color: #59636e; font-size: 0.92em; margin-top: 0.3em; }
table { border-collapse: collapse; font-size: 0.95em; }
td, th { text-align: left; padding: 0.25em 0.9em 0.25em 0; border-bottom: 1px solid #eaeef2; vertical-align: top; }
th { font-weight: 600; color: #59636e; }
td code { word-break: break-all; }
pre { background: #f6f8fa; padding: 0.8em 1em; overflow-x: auto; font-size: 0.88em; border-radius: 6px; }
.note { background: #fff8c5; border: 1px solid #d4a72c66; padding: 0.5em 0.9em; border-radius: 6px; }
ul.warnings { color: #9a6700; }
"""

PNG_URI = "data:image/png;base64,"


def esc(value) -> str:
    """Any value as escaped HTML text."""
    return html.escape(str(value), quote=True)


def png_uri(png: bytes) -> str:
    """PNG bytes as a ``data:image/png;base64,...`` URI."""
    return PNG_URI + base64.b64encode(png).decode("ascii")


def figure(png: bytes, alt: str, caption: str = "") -> str:
    """An embedded image with its alt text and an optional caption under it."""
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{png_uri(png)}" alt="{esc(alt)}">{cap}</figure>'


def note(text: str) -> str:
    """A highlighted remark (why a part of the page is missing, what was used instead)."""
    return f'<p class="note">{esc(text)}</p>'


def paragraph(text: str) -> str:
    return f"<p>{esc(text)}</p>"


def fmt(value) -> str:
    """Numbers short and readable (4 significant digits), anything else as it is."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(rows: Mapping[str, object] | Iterable[tuple[str, object]]) -> str:
    """A two-column table of name / value (floats to 4 significant digits)."""
    items = rows.items() if isinstance(rows, Mapping) else rows
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(fmt(v))}</td></tr>" for k, v in items)
    return f"<table>{body}</table>"


def bullet_list(items: Iterable[str], cls: str = "") -> str:
    attr = f' class="{esc(cls)}"' if cls else ""
    return f"<ul{attr}>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"


def code_block(text: str) -> str:
    return f"<pre>{esc(text)}</pre>"


def section(anchor: str, title: str, body: str) -> str:
    """An ``<h2>`` titled section with an id for the page's navigation."""
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>\n{body}\n</section>'


def render_page(title: str, subtitle: str, sections: list[tuple[str, str, str]]) -> str:
    """The whole page from ``(anchor, title, body html)`` sections, with a navigation bar."""
    nav = "".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t, _ in sections)
    body = "\n".join(section(a, t, b) for a, t, b in sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title>"
        # a data: favicon: the browser asks for none over the file system (no console error)
        '<link rel="icon" href="data:,">'
        f"<style>{STYLE}</style></head>\n<body>\n"
        f"<h1>{esc(title)}</h1><p class=\"sub\">{esc(subtitle)}</p>\n<nav>{nav}</nav>\n{body}\n"
        "</body></html>\n"
    )
