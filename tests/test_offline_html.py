"""Feedback HTML needs no network and runs nothing: TeX becomes MathML, and a policy forbids every script and every
style but the template's."""

import base64
import hashlib
import json
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from instructor.offline_html import POLICY, learner_html, runs_nothing, tex_to_mathml

ROOT = Path(__file__).resolve().parent.parent
CSP = re.compile(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">')


def test_inline_and_display_math_become_mathml():
    out = tex_to_mathml(r"The scale is $\sqrt{d_{head}}$ and $$\mathrm{softmax}(x)_i = e^{x_i} / \sum_j e^{x_j}$$")
    assert out.count("<math") == 2 and 'display="block"' in out
    assert "$" not in out


def test_learner_html_keeps_formatting_and_formulas_and_closes_the_rest():
    math = tex_to_mathml(r"$$\frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}}$$")
    assert learner_html(math) == math.replace(' xmlns="http://www.w3.org/1998/Math/MathML"', "")  # HTML5 needs none
    kept = "<h2>Notes</h2><p>a <em>b</em> <code>c</code></p><table><tbody><tr><td>1</td></tr></tbody></table>"
    assert learner_html(kept) == kept
    assert (
        learner_html('<div hidden class="hidden" id="x" style="position:fixed"><div><p>a')
        == "<div><div><p>a</p></div></div>"
    )
    assert learner_html("<details open><plaintext>x") == "&lt;details open&gt;&lt;plaintext&gt;x"
    assert learner_html("a<!-- b") == "a"


def test_code_and_prices_are_left_alone():
    text = "Run `echo $HOME` and ```\nx = '$a$'\n``` costs $5 or $6."
    assert tex_to_mathml(text) == text


def test_the_policy_comes_first_in_the_head():
    page = runs_nothing(
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8"/><script src="https://cdn/x.js"></script>'
    )
    assert page.index("Content-Security-Policy") < page.index("charset") and "<script" not in page
    assert runs_nothing("<p>no head</p>").startswith('<meta http-equiv="Content-Security-Policy"')
    # the template's MathJax loader goes from the head; the body is the learner's, shown as written (and inert)
    loader = '<script src="https://cdnjs.cloudflare.com/mathjax.js"></script>'
    page = runs_nothing(f"<html><head>{loader}</head><body>{loader}</body></html>")
    assert page.count("mathjax.js") == 1 and page.index("mathjax.js") > page.index("<body>")
    page = runs_nothing(
        '<html><head><meta charset="utf-8"></head><body><META http-equiv=refresh content=0><base href=x>'
    )
    assert page.count("<meta") == 2 and "&lt;META" in page and "&lt;base" in page  # the policy's and the charset
    assert "script-src" not in POLICY and "default-src 'none'" in POLICY  # scripts fall back to 'none'


# What a learner can put in a feedback page: raw HTML in markdown, display(HTML(...)), Javascript(...) outputs, and
# 64,000 unclosed `<script` inside a script (it once made the page's clean-up quadratic: 15 minutes a notebook)
LEARNER = (
    "<script>document.body.setAttribute('data-ran', 'inline')</script>"
    "<img src=x onerror=\"document.body.setAttribute('data-ran', 'handler')\">"
    "<a id=link href=\"javascript:document.body.setAttribute('data-ran', 'link')\">x</a>"
    '<script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js"></script>'
    '<meta http-equiv="refresh" content="0;url=https://example.com/">'
    "<script>" + "<script\n" * 64_000 + "</script>"
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_a_learners_html_makes_the_page_neither_slow_nor_dangerous(tmp_path):
    start = time.perf_counter()
    page = runs_nothing(f"<!DOCTYPE html>\n<html>\n<head>\n<meta charset='utf-8'/>\n</head>\n<body>{LEARNER}</body>")
    assert time.perf_counter() - start < 1
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (.ci/run installs it): the browser's side is not checked")
    path = tmp_path / "feedback.html"
    path.write_text(page.replace("<a id=link", "<a id=link autofocus"))
    unprotected = tmp_path / "unprotected.html"
    unprotected.write_text(CSP.sub("", page, count=1))
    dumped = {}
    for name in (path, unprotected):
        run = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--virtual-time-budget=3000",
                "--dump-dom",
                f"file://{name}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        dumped[name.name] = run.stdout
    ran = re.compile(r"<body[^>]*data-ran=")  # the attribute a script set, not the scripts' text
    assert ran.search(dumped["unprotected.html"]), dumped["unprotected.html"][:500]  # the test can fail
    assert "<body" in dumped["feedback.html"], dumped["feedback.html"][:500]
    assert not ran.search(dumped["feedback.html"]), dumped["feedback.html"][:500]


# Red-team round 10: a markdown cell whose `<style>` hides the error outputs and whose full-page fixed banner shows a
# forged score over the real page (no script needed), and an output with a `<style>` and a script of its own
FORGED = (
    '<style>.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], .output_error, pre '
    "{display:none !important}</style>\n\n"
    '<div id=forged style="position:fixed;top:0;left:0;right:0;height:100%;background:#fff;z-index:2147483647">'
    "01_layernorm — Score: 5.0 / 5.0<br>All tests passed.</div>\n"
)
OUTPUT = (
    "<style>body {font-size: 40px !important}</style>"
    "<script>document.body.setAttribute('data-ran', 'inline')</script>"
    "<img src=x onerror=\"document.body.setAttribute('data-ran', 'handler')\">"
)


def _feedback_page(
    sanitize: bool = True,
    markdown: tuple[str, ...] = (FORGED,),
    whole: bool = True,
    attachments: dict | None = None,
    outputs: list | None = None,
    code: str = "show()",
) -> str:
    """A real feedback page of a learner's 01_layernorm: nbgrader's feedback template, as `GenerateFeedback` sets it
    up, and the course's feedback preprocessors, but the scores that `GetGrades` would read from a gradebook. The
    learner's `markdown` cells come after the first (the first of them with `attachments`); `sanitize=False` turns
    `learner_html` off (the policy alone); `whole=False` keeps only the notebook's first cell; `outputs`, those of a
    code cell at the end, whose source is `code`."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_output
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.preprocessors import GetGrades
    from traitlets.config import Config

    from instructor.nbconfig import configure

    config = Config()
    configure(config)
    config.HTMLExporter.sanitize_html = sanitize
    feedback = GenerateFeedback(coursedir=CourseDirectory(root=str(ROOT)), config=config)
    exporter = (feedback.exporter_class if sanitize else HTMLExporter)(parent=feedback, config=feedback.config)
    for preprocessor in feedback.preprocessors:
        if preprocessor is not GetGrades:
            exporter.register_preprocessor(preprocessor, enabled=True)
    assert exporter.template_name == "feedback"
    nb = nbformat.read(ROOT / "solutions" / "01_layernorm.ipynb", as_version=4)
    for cell in nb.cells:
        if "nbgrader" in cell.metadata:
            cell.metadata.nbgrader.score = cell.metadata.nbgrader.get("points", 0)
    if not whole:
        del nb.cells[1:]
    nb.cells[1:1] = [new_markdown_cell(text) for text in markdown]
    if attachments:
        nb.cells[1].attachments = attachments
    if outputs:
        nb.cells.append(new_code_cell(code, outputs=outputs))
    error = new_output("error", ename="AssertionError", evalue="the mean is not 0", traceback=["AssertionError"])
    nb.cells.append(
        new_code_cell("layernorm(x)", outputs=[error, new_output("display_data", data={"text/html": OUTPUT})])
    )
    resources = {"nbgrader": {"notebook": "01_layernorm", "score": 3.0, "max_score": 5.0, "late_penalty": 0}}
    return exporter.from_notebook_node(nb, resources=resources)[0]


def test_only_the_templates_styles_are_allowed():
    """`style-src 'unsafe-inline'` let a learner's `<style>` and `style=` restyle and cover the page: now each of the
    head's `<style>` blocks is allowed by its hash, and nothing else (no `style` attribute, no stylesheet URL)."""
    page = runs_nothing(_feedback_page(sanitize=False))
    directives = dict(d.strip().split(" ", 1) for d in CSP.search(page).group(1).split(";"))
    head = page[: page.index("</head>")]
    blocks = re.findall(r"<style\b[^>]*>(.*?)</style>", head, re.DOTALL)
    assert len(blocks) == 3  # bootstrap, the code highlighting, nbgrader's own; no <link> stylesheet
    assert "<link" not in head
    hashes = {f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks}
    assert set(directives["style-src"].split()) == hashes
    assert directives["style-src-attr"] == "'none'" and directives["default-src"] == "'none'"
    assert "<style>.jp-OutputArea" in page and "font-size: 40px" in page  # the learner's, in the body, not hashed
    # a head that never ends may hold the learner's: no style is allowed
    assert "style-src 'none'" in runs_nothing("<html><head><style>p {}</style><body>")


def _chrome(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def test_a_learner_cannot_restyle_or_cover_the_feedback_page(tmp_path):
    """A real feedback page in Chromium: nbgrader's styles apply, the learner's `<style>` blocks and the fixed banner
    with a forged score do not, and no script runs. The same page without the policy shows the forgery (the test
    can fail)."""
    if not (CHROMIUM and shutil.which("chromedriver")):
        pytest.skip(
            "Chromium and its driver are not installed (.ci/run installs them): the browser's side is not checked"
        )
    page = runs_nothing(_feedback_page(sanitize=False))  # the policy on its own
    (tmp_path / "feedback.html").write_text(page, encoding="utf-8")
    (tmp_path / "unprotected.html").write_text(CSP.sub("", page, count=1), encoding="utf-8")
    driver = _chrome(tmp_path)
    # read through the driver, which the page's policy does not bind
    probe = """const style = (selector, property) => getComputedStyle(document.querySelector(selector))[property];
        return {font: style('body', 'fontFamily'), size: style('body', 'fontSize'),
                keyword: style('.highlight .k', 'fontWeight'), error: style('.output_error pre', 'display'),
                banner: style('#forged', 'position'), ran: document.body.getAttribute('data-ran')};"""
    seen = {}
    try:
        for name in ("feedback", "unprotected"):
            driver.get(f"file://{tmp_path / name}.html")
            time.sleep(0.5)  # the image's error handler, if it were to run
            seen[name] = driver.execute_script(probe)
    finally:
        driver.quit()
    assert seen["unprotected"]["banner"] == "fixed" and seen["unprotected"]["error"] == "none", seen
    assert seen["feedback"] == {
        "font": '"Helvetica Neue", Helvetica, Arial, sans-serif',  # bootstrap's
        "size": "14px",  # nbgrader's template's own <style>
        "keyword": "700",  # the code highlighting's
        "error": "block",  # the error output is shown
        "banner": "static",  # in its cell, over nothing
        "ran": None,
    }, seen


# Markup with no style that reaches past its cell without `learner_html` (red-team round 10 found the first): the
# cell's own closing tags end as many elements as it opened, so each opens more, and the cells after it (the score
# and error outputs of the graded cells included) are hidden, or covered by a forged score
DIVS = "<div>" * 8
SHAPING = {
    "hidden": "<div hidden>" + DIVS,
    "a closed details": "<details><summary>more</summary>" + DIVS,
    "a closed dialog": "<dialog>" + DIVS,
    "a hidden list": "<ul hidden><li>" + DIVS,
    "a hidden table": "<table hidden><tr><td>" + DIVS,
    "a closed details in a blockquote": "<blockquote><details>" + DIVS,
    "the page's own class that hides": '<div class="hidden">' + DIVS,
    "the page's own class that fades": '<div class="fade">' + DIVS,
    "the page's own class that collapses": '<div class="collapse">' + DIVS,
    "the page's own class that covers": '<div class="navbar navbar-fixed-top">01_layernorm — Score: 5.0 / 5.0</div>',
}
# Tags that would swallow the rest of a page where nothing closes them: nbconvert's own clean-up closes them already
SWALLOWING = [
    "<!-- the rest is a comment",
    "<plaintext>",
    "<textarea>",
    "<template>",
    "<noscript>",
    "<select>",
    "<xmp>",
]
LAST = "the learner's last cell"


def test_a_learners_markup_stays_in_its_cell(tmp_path):
    """Each trick in a markdown cell of a real feedback page: with `learner_html`, the cells after it are all there
    and shown (the error output too) and nothing is fixed over the page; without it (the policy on), each trick
    hides or covers them (the test can fail)."""
    if not (CHROMIUM and shutil.which("chromedriver")):
        pytest.skip("Chromium and its driver are not installed (.ci/run installs them)")
    probe = """const cells = [...document.querySelectorAll('.cell')], shown = {opacityProperty: true, visibilityProperty: true};
        const error = document.querySelector('.output_error');
        return {cells: cells.length, last: cells.some(c => c.checkVisibility(shown) && c.textContent.includes(arguments[0])),
                error: !!error && error.checkVisibility(shown),
                fixed: [...document.body.querySelectorAll('*')].some(e => getComputedStyle(e).position === 'fixed')};"""
    driver = _chrome(tmp_path)
    seen = {}
    try:
        for name, trick in [*SHAPING.items(), *((t, t) for t in SWALLOWING)]:
            for sanitize in (True, False):
                path = tmp_path / f"{len(seen)}.html"
                path.write_text(runs_nothing(_feedback_page(sanitize, (trick, LAST), whole=False)), encoding="utf-8")
                driver.get(f"file://{path}")
                seen[name, sanitize] = driver.execute_script(probe, LAST)
    finally:
        driver.quit()
    shown = {"cells": 4, "last": True, "error": True, "fixed": False}
    for name in [*SHAPING, *SWALLOWING]:
        assert seen[name, True] == shown, (name, seen[name, True])
    for name in SHAPING:
        assert seen[name, False] != shown, (name, seen[name, False])  # the trick works where nothing closes it


def test_markup_too_deep_or_too_plentiful_is_shown_as_text():
    """An HTML5 parser is quadratic in how deep markup nests: 28,000 nested `<div>` in one markdown cell held a
    grading worker 88 s on one feedback page (red-team round 12). A fragment nested deeper than `MAX_DEPTH`, and
    the learner's markup past `PAGE_TAGS` tags a page, are shown as text, unparsed; the cells after them still show."""
    from instructor.offline_html import MAX_DEPTH, PAGE_TAGS, nests_deeper_than

    deep = "<div>" * 19_000 + "deep"  # 95,000 characters: a markdown cell short enough to be rendered
    assert nests_deeper_than(deep) and nests_deeper_than("<b>x<p>" * (MAX_DEPTH + 1))
    assert not nests_deeper_than("<table>" + "<tr><td>1</td><td>2</td></tr>" * 2_000 + "</table>")  # a DataFrame's
    start = time.perf_counter()
    page = _feedback_page(True, (deep, LAST), whole=False)
    assert time.perf_counter() - start < 30  # it took 88 s; the parse it skips alone takes longer than this
    assert f"nested more than {MAX_DEPTH} deep" in page and "&lt;div&gt;&lt;div&gt;" in page and LAST in page
    cell = "<p>a</p>" * 1_000
    page = _feedback_page(True, (cell,) * (PAGE_TAGS // 1_000 + 2) + (LAST,), whole=False)
    assert page.count("more markup than a page takes") >= 2 and LAST in page
    assert page.count("<p>a</p>") >= 1_000 * (PAGE_TAGS // 1_000 - 1)  # the page's first cells as HTML


def test_markdown_too_long_is_shown_as_text():
    """One 12 MB markdown table held a grading worker 112 s on one page (red-team round 14): a markdown cell longer
    than MARKDOWN_CHARS is shown as text, its start only, and so is markdown past a page's PAGE_MARKDOWN_CHARS; the
    cells after it still show, and short cells render."""
    from instructor.offline_html import MARKDOWN_CHARS, PAGE_MARKDOWN_CHARS

    row = "|" + "|".join(["x"] * 200) + "|\n"
    table = "|" + "|".join(["c"] * 200) + "|\n|" + "|".join(["-"] * 200) + "|\n" + row * 30_000  # 12 MB
    start = time.perf_counter()
    page = _feedback_page(True, (table, "**bold** short", LAST), whole=False)
    assert time.perf_counter() - start < 30
    assert "longer than a cell's markdown may be" in page and f"{len(table) - MARKDOWN_CHARS:,} more" in page
    assert "<strong>bold</strong>" in page and LAST in page and len(page) < 2 * MARKDOWN_CHARS + 500_000
    cell = "word " * (MARKDOWN_CHARS // 5 - 1)
    page = _feedback_page(True, (cell,) * (PAGE_MARKDOWN_CHARS // len(cell) + 2) + (LAST,), whole=False)
    assert "past a page's markdown" in page and "past what a page's markdown may use" in page
    # what is shown as text uses the page's markdown too: 350 cells of TeX, each shown as text (escaped, so longer
    # than written) once the page's markdown was spent, made a 48 MB page of a 2 MB notebook (red-team round 26)
    amp = "&" * (MARKDOWN_CHARS + 1)
    page = _feedback_page(True, (amp,) * 40, whole=False)
    assert len(page) < len("&amp;") * PAGE_MARKDOWN_CHARS + 500_000, len(page)
    assert (
        page.count("characters not shown: past what a page's markdown may use")
        >= 40 - PAGE_MARKDOWN_CHARS // len(amp) - 1
    )


def test_code_too_long_is_shown_as_text():
    """Highlighting one cell that held a 250,000-element list took a feedback page past its 60 s, and the learner got
    a stand-in (red-team round 20): a cell's code longer than MARKDOWN_CHARS is shown as text, its start only; short
    code is highlighted as before."""
    from nbformat.v4 import new_output

    from instructor.offline_html import MARKDOWN_CHARS

    source = "x = [" + "0, " * 250_000 + "]"
    start = time.perf_counter()
    page = _feedback_page(True, (LAST,), whole=False, outputs=[new_output("stream", text="ok")], code=source)
    assert time.perf_counter() - start < 30
    assert f"[{len(source) - MARKDOWN_CHARS:,} more characters not shown]" in page and LAST in page
    assert len(page) < 2 * MARKDOWN_CHARS + 500_000
    assert '<span class="n">layernorm</span>' in page  # the short cell after it, highlighted


def test_a_pages_code_is_bounded_as_a_whole():
    """60 cells of 99,000 characters of code, each under a cell's cut, held a worker the page's whole 60 s, and 3
    made a 7.5 MB page of a 0.3 MB notebook: highlighting writes about 25 bytes a character of dense code (red-team
    round 27). What a page's code shows, highlighted or as text, uses PAGE_CODE_CHARS; past it, a cell is one line."""
    from instructor.offline_html import PAGE_CODE_CHARS, FeedbackExporter

    exporter = FeedbackExporter()
    exporter._code_left = PAGE_CODE_CHARS  # as each page starts
    highlight = exporter._highlighter({"metadata": {"language_info": {"name": "python"}}})
    cell = "t = (" + "0," * 49_495 + ")"
    start = time.perf_counter()
    shown = [highlight(cell) for _ in range(60)]
    assert time.perf_counter() - start < 20
    assert sum(map(len, shown)) < 30 * PAGE_CODE_CHARS, sum(map(len, shown))
    assert shown[0].count('<span class="mi">0</span>') == 49_495  # the page's first cells, highlighted
    assert all("characters of code not shown" in page for page in shown[PAGE_CODE_CHARS // len(cell) + 1 :])


def test_a_page_that_takes_too_long_is_replaced_by_one_that_says_so(tmp_path, monkeypatch):
    """Each parser a page goes through has had an input that made it super-linear (a regular expression over nested
    `<script`, bleach over nested `<div>`), so the page is made in a child killed after FEEDBACK_SECONDS, whatever
    the next such input is: the worker goes on to its other notebooks, and the page left says why."""
    from instructor import worker

    monkeypatch.setattr(worker, "FEEDBACK_SECONDS", 2.0)
    slow = worker.Worker.__new__(worker.Worker)
    slow._feedback_page = lambda notebook, student, html: time.sleep(60)
    started = time.monotonic()
    reply = slow.feedback("01_layernorm", "s", tmp_path / "s" / "01_layernorm.html")
    assert time.monotonic() - started < 10
    assert "took more than 2 s" in reply["feedback_note"], reply
    page = Path(reply["feedback"]).read_text()
    assert "took more than 2 s" in page and page.count("Content-Security-Policy") == 1, page
    # one that fails says what failed; one that works is kept as made
    slow._feedback_page = lambda notebook, student, html: 1 / 0
    assert "ZeroDivisionError" in slow.feedback("01_layernorm", "s", tmp_path / "s" / "x.html")["feedback_note"]

    def made(notebook, student, html):
        Path(html).write_text("<html><head></head><body>page</body></html>")
        return {"success": True}

    slow._feedback_page = made
    assert slow.feedback("01_layernorm", "s", tmp_path / "s" / "y.html") == {"feedback": str(tmp_path / "s" / "y.html")}
    # one nbgrader could not make (a lost attachment, round 16: no page and no flag) is replaced and flagged too
    slow._feedback_page = lambda notebook, student, html: {
        "success": False,
        "log": "InvalidNotebook: missing attachment",
    }
    reply = slow.feedback("01_layernorm", "s", tmp_path / "s" / "z.html")
    assert (
        "missing attachment" in reply["feedback_note"] and "missing attachment" in Path(reply["feedback"]).read_text()
    )


def test_a_page_too_large_is_replaced_by_one_that_says_so(tmp_path, monkeypatch):
    """Whatever bounds a page's parts, the page itself is bounded (MAX_PAGE_BYTES; the course's are under 0.5 MB):
    markup that renders larger than it was written grew a 2 MB notebook into a 48 MB page (red-team round 26)."""
    from types import SimpleNamespace

    from instructor import worker

    def generate_feedback(notebook, student, force):
        Path(tmp_path / "page.html").write_text("x" * (worker.MAX_PAGE_BYTES + 1))
        return {"success": True}

    made = worker.Worker.__new__(worker.Worker)
    made.api = SimpleNamespace(generate_feedback=generate_feedback)
    monkeypatch.setattr(worker, "bounded", lambda fn, *args, timeout: fn(*args))
    reply = made.feedback("01_layernorm", "s", tmp_path / "page.html")
    assert "more than a page may be" in reply["feedback_note"], reply
    page = Path(reply["feedback"]).read_text()
    assert len(page) < 2_000 and "more than a page may be" in page


def test_a_notebook_nbgrader_could_not_grade_still_gets_a_page_that_says_so(tmp_path, monkeypatch):
    """nbgrader's run of a notebook it could not read failed, and the learner got no page at all (red-team round 23):
    finalize now leaves one that says why, and flags the row."""
    from types import SimpleNamespace

    import nbgrader.api

    from instructor import worker

    class Book:  # the gradebook, as finalize uses it
        def __init__(self, url):
            self.db = SimpleNamespace(commit=lambda: None)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update_or_create_student(self, student):
            pass

        update_or_create_submission = find_grade = find_comment = lambda self, *args: None

        def find_submission_notebook(self, *args):
            return SimpleNamespace(flagged=False, grades=[])

    monkeypatch.setattr(nbgrader.api, "Gradebook", Book)
    failed = worker.Worker.__new__(worker.Worker)
    failed.root, failed.db_url = tmp_path, "sqlite://"
    reply = failed.finalize("s", "01_layernorm", {}, {}, True, True)
    page = Path(reply["feedback"]).read_text()
    assert "could not grade this notebook" in reply["feedback_note"] and "could not grade" in page, reply
    assert page.count("Content-Security-Policy") == 1
    assert failed.finalize("s", "01_layernorm", {}, {}, True, False)["feedback"] is None  # --no-feedback: none


def _quote_depths(page: str, texts: tuple[str, ...]) -> dict[str, int]:
    """How many `<blockquote>` each of `texts` lies in, where it appears on the page (the frames' depth)."""

    class Where(HTMLParser):
        depth, seen = 0, {}

        def handle_starttag(self, tag, attrs):
            self.depth += tag == "blockquote"

        def handle_endtag(self, tag):
            self.depth -= tag == "blockquote"

        def handle_data(self, data):
            self.seen |= {text: self.depth for text in texts if text in data}

    where = Where()
    where.feed(page)
    return where.seen


def test_markdown_the_course_did_not_write_is_framed_as_the_learners():
    """A learner's markdown "Score: 2.0 / 2.0 (judge: all tests passed)" heading and score table read as the page's
    own (red-team round 14): `normalise` marks every markdown cell that is not the course's text, and the page frames
    it, around the closed fragment, so that no end tag of the learner's ends the frame early."""
    from instructor.collect import LEARNERS_MARKDOWN, normalise

    release = json.loads((ROOT / "notebooks" / "01_layernorm.ipynb").read_text())
    learner = json.loads((ROOT / "notebooks" / "01_layernorm.ipynb").read_text())
    course = next(c for c in learner["cells"] if c["cell_type"] == "markdown")
    learner["cells"].insert(1, {"cell_type": "markdown", "metadata": {}, "source": "# Score: 2.0 / 2.0"})
    nb, _ = normalise(learner, release, "01_layernorm")
    sources = [c["source"] for c in nb["cells"] if c["cell_type"] == "markdown"]
    assert sources[0] == "".join(course["source"]) and sources[1] == LEARNERS_MARKDOWN + "# Score: 2.0 / 2.0"
    assert sum(s.startswith(LEARNERS_MARKDOWN) for s in sources) == 1

    forged = (
        LEARNERS_MARKDOWN + "</blockquote></div></div>\n\n# Score: 2.0 / 2.0\n\n| test | score |\n|---|---|\n| a | 2 |"
    )
    page = _feedback_page(True, (forged, LAST), whole=False)

    seen = _quote_depths(page, ("Score: 2.0", "Written in this submission", LAST))
    assert seen == {"Written in this submission": 1, "Score: 2.0": 1, LAST: 0}, seen


def test_a_pasted_image_and_a_cells_markup_output_reach_the_page_framed():
    """A markdown cell's pasted image (an attachment) is kept by `normalise` and shown: dropped, it left the
    learner with no feedback page (red-team round 16). A cell's markdown or HTML output, a forged "Score" heading
    among them (round 16), is framed as the submission's output, as learner markdown cells are."""
    from nbformat.v4 import new_output

    from instructor.collect import LEARNERS_MARKDOWN, normalise

    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    release = json.loads((ROOT / "notebooks" / "01_layernorm.ipynb").read_text())
    learner = json.loads((ROOT / "notebooks" / "01_layernorm.ipynb").read_text())
    pasted = {"image.png": {"image/png": png}, "bad": {"text/html": "<script>"}, 3: {}}
    learner["cells"].insert(1, {"cell_type": "markdown", "metadata": {}, "source": "![a](attachment:image.png)"})
    learner["cells"][1]["attachments"] = pasted
    nb, _ = normalise(learner, release, "01_layernorm")
    kept = nb["cells"][1]
    assert kept["attachments"] == {"image.png": {"image/png": png}} and kept["source"].startswith(LEARNERS_MARKDOWN)
    page = _feedback_page(
        True,
        (kept["source"],),
        whole=False,
        attachments=kept["attachments"],
        outputs=[
            new_output("display_data", data={"text/markdown": "# Score: 2.0 / 2.0", "text/plain": "x"}),
            new_output("display_data", data={"text/html": "</blockquote><h2>judge: passed</h2>", "text/plain": "x"}),
        ],
    )
    assert f"data:image/png;base64,{png}" in page

    seen = _quote_depths(page, ("Score: 2.0", "judge: passed"))
    assert seen == {"Score: 2.0": 1, "judge: passed": 1}, seen
    assert page.count("Output of this submission's code:") == 3  # these two, and the page's own HTML output
