"""Feedback HTML that shows everything with no network and runs nothing: formulas as MathML, no script at all.

nbgrader's feedback template loads MathJax from a CDN, so offline its formulas stay raw TeX. Browsers render MathML
natively, so the TeX of markdown cells is converted to MathML before the HTML is written (with latex2mathml).

A feedback page holds what the learner wrote (markdown with raw HTML, `display(HTML(...))` and `Javascript(...)`
outputs), and instructors open the pages of a whole class. So every page starts with a Content-Security-Policy that
lets it load nothing and run no script, inline or not (event handlers and `javascript:` links included), and that
lets only the page's own styles apply: the `<style>` blocks of the head, which nbgrader's template writes
(bootstrap, the code highlighting, its own), each allowed by its sha256 hash. A learner's `<style>` block and
`style="..."` attribute apply nowhere, so what the learner wrote cannot restyle or cover the page (a fixed full-page
banner with a forged score over the real page, error outputs hidden, passed the old `style-src 'unsafe-inline'`).
The cost: the page's body has no inline styles of its own to lose, but a learner's outputs lose theirs (a
DataFrame's `<style scoped>`, 24-bit ANSI colours), and images and fonts are the page's own (data: URLs). The browser
enforces the policy, whatever the page holds, and with no network request.

Markup with no style still shapes the body, which no policy covers: more `<div hidden>`, closed `<details>` or
`<dialog>` opened in one cell than the cell closes hid every cell after it, and the page's own classes (bootstrap's
`hidden`, `fade`, `navbar-fixed-top`) hide or cover as a style would. So what a learner wrote, every markdown and raw
cell and every HTML, markdown and SVG output, goes through `learner_html` (`FeedbackExporter`: nbgrader's feedback
template renders markdown cells with no `clean_html` of its own). It is parsed on its own, as HTML5 does (bleach, as
nbconvert's `sanitize_html`), and written back closed, with only formatting and MathML tags and none of the
attributes that hide, move, name or restyle (`hidden`, `id`, `class`, `style`, `open`); any other tag is shown as
text. So no cell's markup reaches past the cell, and none can look like the grader's. Markup nested too deep for the
parser's quadratic time, or past a page's budget of tags, is shown as text, unparsed (`MAX_DEPTH`, `PAGE_TAGS`).

The template's MathJax loader is taken out of the head; the body, which the learner wrote, is never
searched, so no page is slow to write (a search of the whole page was quadratic in nested `<script`).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import re
from html import escape

from jinja2 import BytecodeCache
from nbconvert.exporters import HTMLExporter
from nbgrader.preprocessors import NbGraderPreprocessor

from instructor.collect import LEARNERS_MARKDOWN

_CODE = re.compile(r"(```.*?```|`[^`\n]*`)", re.DOTALL)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.DOTALL)
_INLINE = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n]+?)(?<=\S)\$(?![\w$])")
# Scripts fall back to default-src; `style-src` is per page (`policy`)
POLICY = "default-src 'none'; img-src data:; font-src data:; base-uri 'none'; form-action 'none'"
# The end of a `<style>` element's text is the first `</style` (its text is raw: no comment or quote ends it sooner)
_STYLE = re.compile(r"<style\b[^>]*>(.*?)</style", re.DOTALL | re.IGNORECASE)
# Tags no policy covers in a body (a `<meta http-equiv="refresh">` moves the page elsewhere): shown as text
_BODY_TAGS = re.compile(r"<(?=(?:meta|base|link)\b)", re.IGNORECASE)
_REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc=[\"']https?://[^>]*>\s*</script>", re.IGNORECASE)
_MATHJAX_CONFIG = re.compile(r"<script type=\"text/x-mathjax-config\">.*?</script>", re.DOTALL | re.IGNORECASE)


# Formatting, tables, images, links and the MathML `tex_to_mathml` writes; every other tag is shown as text
_HTML = (
    "a abbr b blockquote br caption cite code dd del div dl dt em h1 h2 h3 h4 h5 h6 hr i img ins kbd li ol p pre q s"
)
_HTML += " samp small span strong sub sup table tbody td tfoot th thead tr u ul var"
_MATHML = "math mrow mi mn mo ms mtext mspace mfrac msqrt mroot msub msup msubsup munder mover munderover mtable mtr"
_MATHML += " mtd menclose mpadded mphantom mstyle semantics annotation"
# None of them hides, names, moves or restyles
_MATH_ATTRIBUTES = "display mathvariant stretchy fence separator form accent accentunder lspace rspace width minsize"
_MATH_ATTRIBUTES += (
    " maxsize symmetric largeop movablelimits displaystyle scriptlevel linethickness notation columnalign"
)
_ATTRIBUTES = {
    "a": ("href", "title"),
    "img": ("src", "alt", "title"),
    "td": ("colspan", "rowspan"),
    "th": ("colspan", "rowspan"),
    **dict.fromkeys(_MATHML.split(), tuple(_MATH_ATTRIBUTES.split())),
}


def learner_html(html) -> str:
    """What a learner wrote, closed and inert: the feedback template's `clean_html` (`sanitize_html` on)."""
    import bleach

    html = html.decode() if isinstance(html, bytes) else str(html)
    return bleach.clean(
        html,
        tags={*_HTML.split(), *_MATHML.split()},
        attributes=_ATTRIBUTES,
        protocols={"http", "https", "mailto", "data"},
    )


# An HTML5 parser takes time quadratic in how deep the markup nests (28,000 nested `<div>` in one markdown cell held
# a grading worker 88 s writing one feedback page: red-team round 12). A fragment that nests deeper than this, or
# that comes after a page's learner markup has used up its tags, is shown as text, unparsed.
MAX_DEPTH = 64
PAGE_TAGS = 50_000
# Markdown is rendered, then parsed, in time that grows with its length: one 12 MB markdown table (a learner's
# notebook may be 20 MB) held a grading worker 112 s on one page (red-team round 14). A markdown cell longer than
# this, or past what a page's markdown may use, is shown as text, its first MARKDOWN_CHARS characters only. The
# course's longest markdown cell is under 4,000 characters.
MARKDOWN_CHARS = 100_000
PAGE_MARKDOWN_CHARS = 1_000_000
# A page's code, highlighted or shown as text: highlighting writes about 25 bytes for each character of dense code
# and takes about 13 s a MB, so 60 cells of 99,000 characters, each under the cell's cut, held a worker the page's
# whole 60 s, and 3 such cells made a 7.5 MB page of a 0.3 MB notebook (red-team round 27). The course's notebooks
# hold at most 40,000 characters of code.
PAGE_CODE_CHARS = 200_000
_TAG = re.compile(r"<[A-Za-z]")
_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())  # noqa: SIM905


def nests_deeper_than(html: str, limit: int = MAX_DEPTH) -> bool:
    """Whether `html` opens more than `limit` elements inside one another, counting every start tag but a void one
    as open until its end tag (what a parser would close by itself counts as open: never an underestimate)."""
    from html.parser import HTMLParser

    class Depth(HTMLParser):
        depth = deepest = 0

        def handle_starttag(self, tag, attrs):
            if tag not in _VOID:
                self.depth += 1
                self.deepest = max(self.deepest, self.depth)

        def handle_startendtag(self, tag, attrs):
            pass

        def handle_endtag(self, tag):
            self.depth = max(self.depth - 1, 0)

    parser = Depth(convert_charrefs=False)
    parser.feed(html)
    parser.close()
    return parser.deepest > limit


# Markup the course did not write is framed on the page, in a quote that says whose it is: a learner's heading
# "Score: 2.0 / 2.0" and a score table read as the page's own, in a markdown cell (red-team round 14) and in a
# cell's markdown or HTML output (round 16). The frame goes around the cleaned, closed fragment (`learner_html`):
# nothing in it can end the frame early.
_OUTPUT = "<!-- output of this submission -->\n"
_FRAMES = {
    LEARNERS_MARKDOWN: "Written in this submission, not the course's text:",
    _OUTPUT: "Output of this submission's code:",
}
_MARKUP = ("text/html", "text/markdown", "image/svg+xml")


def _framed(label: str, html: str) -> str:
    return f"<blockquote><p><em>{label}</em></p>{html}</blockquote>"


class _Compiled(BytecodeCache):
    """The feedback templates' compiled code, kept in this process: nbgrader makes a new exporter, and so a new
    jinja environment, for every page, and each compiled the course's templates afresh. The worker fills it once
    (`warm_feedback`) and every page's child, forked from it, starts with it (the templates are the course's files,
    keyed by their path and checked against their text)."""

    def __init__(self):
        self.store: dict[str, bytes] = {}

    def load_bytecode(self, bucket) -> None:
        if bucket.key in self.store:
            bucket.bytecode_from_string(self.store[bucket.key])

    def dump_bytecode(self, bucket) -> None:
        self.store[bucket.key] = bucket.bytecode_to_string()


_COMPILED = _Compiled()


class FeedbackExporter(HTMLExporter):
    """nbconvert's HTML, with every markdown cell (the feedback template's own rendering) and everything
    `sanitize_html` cleans through `learner_html`, each page's learner markup within `MAX_DEPTH` and `PAGE_TAGS`."""

    _tags_left = PAGE_TAGS  # what the page's learner markup may still use (reset for every page)
    _markdown_left = PAGE_MARKDOWN_CHARS  # the same for its markdown's characters
    _code_left = PAGE_CODE_CHARS  # and its code's

    def from_notebook_node(self, nb, resources=None, **kw):
        self._tags_left, self._markdown_left, self._code_left = PAGE_TAGS, PAGE_MARKDOWN_CHARS, PAGE_CODE_CHARS
        self.filters = {**self.filters, "highlight_code": self._highlighter(nb)}
        nb = copy.deepcopy(nb)
        for cell in nb.get("cells", []):  # markup a cell's run produced: framed as the submission's, as below
            for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else ():
                data = output.get("data") or {}
                for mime in _MARKUP:
                    if isinstance(data.get(mime), str):
                        data[mime] = _OUTPUT + data[mime]
        return super().from_notebook_node(nb, resources, **kw)

    def _create_environment(self):
        environment = super()._create_environment()
        environment.bytecode_cache = _COMPILED
        return environment

    def _highlighter(self, nb):
        """nbconvert's code highlighting, within the page's PAGE_CODE_CHARS: a cell's code longer than
        MARKDOWN_CHARS, or past what the page's code may use, is shown as text, its start only (highlighting a cell
        that held a 250,000-element list took the page past its 60 s: red-team round 20); once the page's code is
        spent, a cell is one line that counts its characters (round 27)."""
        from nbconvert.filters.highlight import Highlight2HTML

        info = nb.get("metadata", {}).get("language_info", {})
        highlight = Highlight2HTML(pygments_lexer=info.get("pygments_lexer", info.get("name")), parent=self)

        def highlight_code(source, *args, **kwargs):
            if self._code_left <= 0:
                return f"<pre>({len(source):,} characters of code not shown: past what a page's code may use)</pre>"
            shown = source[: min(MARKDOWN_CHARS, self._code_left)]
            self._code_left -= len(shown)
            if len(shown) == len(source):
                return highlight(source, *args, **kwargs)
            return f"<pre>{escape(shown)}\n[{len(source) - len(shown):,} more characters not shown]</pre>"

        return highlight_code

    def _clean(self, html) -> str:
        html = html.decode() if isinstance(html, bytes) else str(html)
        for mark, label in _FRAMES.items():  # a raw cell the course did not write, a cell's HTML or SVG output
            if html.startswith(mark):
                return _framed(label, self._clean(html[len(mark) :]))
        tags = len(_TAG.findall(html))
        self._tags_left -= tags
        if self._tags_left < 0 or tags > MAX_DEPTH and nests_deeper_than(html):
            why = "more markup than a page takes" if self._tags_left < 0 else f"nested more than {MAX_DEPTH} deep"
            return f"<p><em>(shown as text, not as HTML: {why})</em></p><pre>{escape(html)}</pre>"
        return learner_html(html)

    def markdown2html(self, context, source):
        for mark, label in _FRAMES.items():  # `collect.normalise`'s mark, or a markdown output's
            if source.startswith(mark):
                return _framed(label, self._markdown(context, source[len(mark) :]))
        return self._markdown(context, source)

    def _markdown(self, context, source):
        # What a cell shows uses the page's markdown, rendered or as text: a page past it shows nothing more of
        # the learner's markdown (350 cells of TeX, each shown as text once the page's markdown was spent, made a
        # 48 MB page from a 2 MB notebook: red-team round 26)
        if self._markdown_left <= 0:
            return f"<p><em>({len(source):,} characters not shown: past what a page's markdown may use)</em></p>"
        shown = source[: min(MARKDOWN_CHARS, self._markdown_left)]
        self._markdown_left -= len(shown)
        if len(shown) < len(source):
            why = "longer than a cell's markdown may be" if len(source) > MARKDOWN_CHARS else "past a page's markdown"
            cut = f"\n[{len(source) - len(shown):,} more characters not shown]"
            return f"<p><em>(shown as text, not rendered: {why})</em></p><pre>{escape(shown)}{cut}</pre>"
        return self._clean(super().markdown2html(context, source))

    markdown2html.jinja_pass_arg = HTMLExporter.markdown2html.jinja_pass_arg  # jinja hands it the context

    def default_filters(self):
        yield from super().default_filters()
        yield ("clean_html", self._clean)


def warm_feedback(parent) -> None:
    """Make one page of the course's own (a markdown cell, a code cell and its output) with nbgrader's feedback
    exporter as `parent` (the worker's NbGraderAPI) configures it, before any submission's page: what every page's
    child would otherwise import, load and compile for itself (a page's child took 1.6 to 2.2 s of CPU cold, 1.2 to
    1.5 s once the worker had made a page, measured). Nothing here reads a submission."""
    import nbformat
    from nbgrader.converters import GenerateFeedback

    app = GenerateFeedback(coursedir=parent.coursedir, parent=parent)
    exporter = app.exporter_class(parent=app, config=app.config)
    code = nbformat.v4.new_code_cell("x = 1\nprint(x)", outputs=[nbformat.v4.new_output("stream", text="1\n")])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A page\n*of the course's own*, $x^2$"), code])
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    resources = {"nbgrader": {"score": 0, "max_score": 0, "late_penalty": 0, "notebook": "warm", "student": "warm"}}
    exporter.from_notebook_node(nb, resources=resources)


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


def policy(head: str) -> str:
    """The policy for a page whose `<head>` holds `head`: only its `<style>` blocks apply, no `style` attribute.

    A browser hashes a `<style>` element's text as it parsed it (line ends as LF, NUL as U+FFFD), in UTF-8. A
    stylesheet the head would link would not apply (a hash allows inline text only): nbgrader's head has none."""
    hashes = []
    for match in _STYLE.finditer(head):
        text = match.group(1).replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd")
        digest = base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")
        hashes.append(f"'sha256-{digest}'")
    styles = " ".join(dict.fromkeys(hashes)) or "'none'"
    # style-src-attr says it outright; a browser without it falls back to style-src, whose hashes allow no attribute
    return f"{POLICY}; style-src {styles}; style-src-attr 'none'"


def runs_nothing(html: str) -> str:
    """The page with its policy as the first thing its head holds, and without the template's MathJax loader: the
    head is nbconvert's template (what the learner wrote is in the body, never searched). A page with no `<head>`
    in its first 4 kB gets the policy before everything; one whose head never ends, a policy with no style at all
    (what would be its head may hold the learner's)."""
    head = html.find("<head>", 0, 4096)
    if head < 0:
        return _meta(policy("")) + html
    end = html.find("</head>", head)
    template = _REMOTE_SCRIPT.sub("", _MATHJAX_CONFIG.sub("", html[head + 6 : len(html) if end < 0 else end]))
    if end < 0:
        return html[: head + 6] + _meta(policy("")) + template
    return html[: head + 6] + _meta(policy(template)) + template + _BODY_TAGS.sub("&lt;", html[end:])


def _meta(content: str) -> str:
    return f'<meta http-equiv="Content-Security-Policy" content="{content}">'


class MathAsMathML(NbGraderPreprocessor):
    """Feedback preprocessor: the formulas of markdown cells as MathML."""

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "markdown" and "$" in cell.source:
            cell.source = tex_to_mathml(cell.source)
        return cell, resources
