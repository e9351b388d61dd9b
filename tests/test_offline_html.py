"""Feedback HTML needs no network and runs nothing: TeX becomes MathML, and a policy forbids every script."""

import re
import shutil
import subprocess
import time

import pytest

from instructor.offline_html import POLICY, runs_nothing, tex_to_mathml


def test_inline_and_display_math_become_mathml():
    out = tex_to_mathml(r"The scale is $\sqrt{d_{head}}$ and $$\mathrm{softmax}(x)_i = e^{x_i} / \sum_j e^{x_j}$$")
    assert out.count("<math") == 2 and 'display="block"' in out
    assert "$" not in out


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
    unprotected.write_text(page.replace(f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">', ""))
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
