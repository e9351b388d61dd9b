"""Feedback HTML that shows everything with no network: formulas as MathML, no scripts loaded from a CDN.

nbgrader's feedback template loads MathJax from a CDN, so offline its formulas stay raw TeX. Browsers render MathML
natively, so the TeX of markdown cells is converted to MathML before the HTML is written (with latex2mathml), and
the MathJax loader is taken out.
"""

from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor

_CODE = re.compile(r"(```.*?```|`[^`\n]*`)", re.DOTALL)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.DOTALL)
_INLINE = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n]+?)(?<=\S)\$(?![\w$])")
_REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc=[\"']https?://[^>]*>\s*</script>", re.IGNORECASE)
_MATHJAX_CONFIG = re.compile(r"<script type=\"text/x-mathjax-config\">.*?</script>", re.DOTALL | re.IGNORECASE)


def _convert(tex: str, display: str) -> str | None:
    from latex2mathml.converter import convert

    try:
        return convert(tex.strip(), display=display)
    except Exception:  # noqa: BLE001 -- TeX latex2mathml cannot read stays as it was written
        return None


def tex_to_mathml(markdown: str) -> str:
    """`$...$` and `$$...$$` outside code spans and blocks, as MathML."""

    def display(match):
        return _convert(match.group(1), "block") or match.group(0)

    def inline(match):
        return _convert(match.group(1), "inline") or match.group(0)

    parts = _CODE.split(markdown)
    for i in range(0, len(parts), 2):  # the odd parts are code: left alone
        parts[i] = _INLINE.sub(inline, _DISPLAY.sub(display, parts[i]))
    return "".join(parts)


def without_remote_scripts(html: str) -> str:
    """The HTML without scripts loaded over the network (MathJax's loader and its configuration)."""
    return _REMOTE_SCRIPT.sub("", _MATHJAX_CONFIG.sub("", html))


class MathAsMathML(NbGraderPreprocessor):
    """Feedback preprocessor: the formulas of markdown cells as MathML."""

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "markdown" and "$" in cell.source:
            cell.source = tex_to_mathml(cell.source)
        return cell, resources
