"""Notebook 08's circuitsvis figures, drawn by a real browser with no network.

The solution notebook runs in its fast mode; every HTML output it leaves is checked: no reference to anything
outside the page (no CDN import), and props that describe a real attention pattern (shape [n_heads, pos, pos] with
pos = len(tokens), each row summing to 1, nothing above the diagonal). Each figure is then opened from a file in
headless Chromium, with every host name unresolvable and a dead proxy, and must draw: the figure's element exists,
has a non-zero size and holds rendered content, and the page requested nothing over the network.
`.ci/run` installs Debian's chromium and chromium-driver; without them the browser half skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
RENDER = re.compile(
    r'CircuitsVis\.render\(\s*"(?P<id>[^"]+)",\s*CircuitsVis\.(?P<kind>\w+),\s*(?P<props>\{.*\})\s*\)', re.DOTALL
)


@pytest.fixture(scope="module")
def figures(tmp_path_factory) -> list[str]:
    import nbformat
    from nbclient import NotebookClient

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(ROOT / "solutions" / "08_interpretability.ipynb", as_version=4)
    env = {"COURSE_FAST": "1", "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "solutions")}}
        ).execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    html = [
        "".join(output["data"]["text/html"])
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if "text/html" in output.get("data", {}) and "CircuitsVis" in "".join(output["data"]["text/html"])
    ]
    assert html, "the notebook drew no circuitsvis figure"
    return html


def test_figures_are_inlined_and_describe_patterns(figures):
    assert len(figures) == 2  # each inlines about 1.3 MB: the notebook keeps to two
    for html in figures:
        assert "unpkg.com" not in html and "import {" not in html, "a CDN import: the figure would not draw offline"
        assert not re.search(r'src="https?://', html)
        match = RENDER.search(html)
        assert match and match["kind"] == "AttentionHeads"
        props = json.loads(match["props"])
        n_pos = len(props["tokens"])
        attention = props["attention"]
        assert len(props["attentionHeadNames"]) == len(attention) >= 2
        for head in attention:
            assert len(head) == n_pos and all(len(row) == n_pos for row in head)
            for q, row in enumerate(head):
                assert abs(sum(row) - 1) < 1e-4
                assert all(abs(value) < 1e-6 for value in row[q + 1 :])  # causal: no weight on later keys


@pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="Chromium and its driver are not installed (apt-get install chromium chromium-driver; .ci/run does it)",
)
def test_figures_draw_in_chromium_offline(figures, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # no name resolves: nothing online can be reached
        "--proxy-server=127.0.0.1:9",
        "--window-size=1200,900",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(flag)
    from circuitsvis.utils.render import render_cdn

    # The same figure as circuitsvis writes it when it finds a network: a CDN import, which must NOT draw here
    # (this is what shows the test can tell a drawn figure from an empty one).
    props = json.loads(RENDER.search(figures[0])["props"])
    cdn = render_cdn("AttentionHeads", **props).replace("CircuitsVis.render(", "render(")
    cdn_id = re.search(r'id="([^"]+)"', cdn)[1]
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        (tmp_path / "cdn.html").write_text(f"<!doctype html><html><body>{cdn}</body></html>", encoding="utf-8")
        driver.get((tmp_path / "cdn.html").as_uri())
        time.sleep(3)
        drawn = driver.execute_script(
            "return document.getElementById(arguments[0]).querySelectorAll('*').length;", cdn_id
        )
        assert drawn <= 1, "a CDN-imported figure drew with no network: the checks below could not tell"  # its <script>
        for i, html in enumerate(figures):
            page = tmp_path / f"figure{i}.html"
            page.write_text(f"<!doctype html><html><body>{html}</body></html>", encoding="utf-8")
            driver.get(page.as_uri())
            element_id = RENDER.search(html)["id"]
            deadline = time.time() + 30
            box = None
            while time.time() < deadline:
                box = driver.execute_script(
                    "const el = document.getElementById(arguments[0]);"
                    "if (!el) return null;"
                    "const r = el.getBoundingClientRect();"
                    "return {w: r.width, h: r.height, children: el.querySelectorAll('*').length};",
                    element_id,
                )
                if box and box["w"] > 0 and box["h"] > 0 and box["children"] > 10:
                    break
                time.sleep(0.3)
            assert box and box["w"] > 0 and box["h"] > 0 and box["children"] > 10, f"figure {i} did not draw: {box}"
            requested = driver.execute_script(
                "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith('file:'));"
            )
            assert requested == [], f"figure {i} requested {requested}"
            errors = [
                e
                for e in driver.get_log("browser")
                if e["level"] == "SEVERE" and "cdn" not in e["message"].lower() and "unpkg" not in e["message"]
            ]
            assert not errors, errors
    finally:
        driver.quit()
