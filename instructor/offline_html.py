"""Feedback HTML that shows everything with no network and runs nothing: formulas as MathML, no script at all.

nbgrader's feedback template loads MathJax from a CDN, so offline its formulas stay raw TeX. Browsers render MathML
natively, so the TeX of markdown cells is converted to MathML before the HTML is written (with latex2mathml).

A feedback page holds what the learner wrote (markdown with raw HTML, `display(HTML(...))` and `Javascript(...)`
outputs), and instructors open the pages of a whole class. So every page starts with a Content-Security-Policy that
lets it load nothing and run no script, inline or not (event handlers and `javascript:` links included): styles
and images written into the page itself only. The browser enforces it, whatever the page holds, and with no
network request. The template's MathJax loader is taken out of the head; the body, which the learner wrote, is
never searched, so no page is slow to write (a search of the whole page was quadratic in nested `<script`).
"""

from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor

_CODE = re.compile(r"(```.*?```|`[^`\n]*`)", re.DOTALL)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.DOTALL)
_INLINE = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n]+?)(?<=\S)\$(?![\w$])")
POLICY = (
    "default-src 'none'; style-src 'unsafe-inline' data:; img-src data:; font-src data:; base-uri 'none'; "
    "form-action 'none'"
)
# Tags no policy covers in a body (a `<meta http-equiv="refresh">` moves the page elsewhere): shown as text
_BODY_TAGS = re.compile(r"<(?=(?:meta|base|link)\b)", re.IGNORECASE)
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


def runs_nothing(html: str) -> str:
    """The page with the policy as the first thing its head holds, and without the template's MathJax loader: the
    head is nbconvert's template (what the learner wrote is in the body, never searched). A page with no `<head>`
    in its first 4 kB gets the policy before everything."""
    meta = f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
    head = html.find("<head>", 0, 4096)
    if head < 0:
        return meta + html
    end = html.find("</head>", head)
    end = len(html) if end < 0 else end
    template = _REMOTE_SCRIPT.sub("", _MATHJAX_CONFIG.sub("", html[head + 6 : end]))
    return html[: head + 6] + meta + template + _BODY_TAGS.sub("&lt;", html[end:])


class MathAsMathML(NbGraderPreprocessor):
    """Feedback preprocessor: the formulas of markdown cells as MathML."""

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "markdown" and "$" in cell.source:
            cell.source = tex_to_mathml(cell.source)
        return cell, resources
