"""A learner notebook in a real browser: JupyterLab started as `course.sh open` starts it, driven by headless Chromium.

It opens 01_layernorm, runs its cells up to the first check (which fails, as the exercise is not written yet), and
reads the page: the check's message is shown, nbgrader's menu and buttons are not, and the notebook was not marked
modified when it opened. `.ci/run` installs Debian's chromium and chromium-driver; without them the test skips.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from instructor.setup_cell import KERNEL_METADATA

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="Chromium and its driver are not installed (apt-get install chromium chromium-driver; .ci/run does it)",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on a copy of the learner notebooks (autosave must not touch the repository's)."""
    tmp = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "course.sh", tmp / "course.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    shutil.copytree(ROOT / "notebooks", tmp / "notebooks")
    port = _free_port()
    env = {**os.environ, "COURSE_VENV": sys.prefix, "COURSE_NO_SETUP": "1", "HF_HUB_OFFLINE": "1", "HOME": str(tmp)}
    env.pop("JUPYTER_CONFIG_DIR", None)
    log = open(tmp / "lab.log", "w")  # noqa: SIM115 -- closed when the server stops
    server = subprocess.Popen(
        [
            "bash",
            str(tmp / "course.sh"),
            "open",
            "--no-browser",
            f"--port={port}",
            "--ServerApp.ip=127.0.0.1",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            "--LabApp.expose_app_in_browser=True",
        ],
        cwd=tmp,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/api", timeout=2)
            break
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.5)
    else:
        server.terminate()
    if server.poll() is not None:
        pytest.fail("JupyterLab did not start:\n" + (tmp / "lab.log").read_text()[-3000:])
    yield url, tmp
    os.killpg(server.pid, 15)
    server.wait(timeout=20)
    log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
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
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _wait_for(driver, script: str, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_learner_notebook_in_a_real_browser(lab, browser):
    url, _ = lab
    browser.get(f"{url}/lab/tree/01_layernorm.ipynb")
    _wait_for(
        browser, "return window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')", 90, "the notebook"
    )
    _wait_for(
        browser,
        "return window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel?.status === 'idle';",
        90,
        "the kernel",
    )
    time.sleep(1)
    dirty = browser.execute_script("return window.jupyterapp.shell.currentWidget.context.model.dirty")
    metadata = browser.execute_script("return window.jupyterapp.shell.currentWidget.model.metadata")
    if platform.python_version() == KERNEL_METADATA["language_info"]["version"]:
        assert not dirty, f"the notebook was marked modified as soon as it opened; its metadata is now {metadata}"
    else:  # JupyterLab writes the kernel's own Python version: that alone may differ
        assert {**metadata, "language_info": {**metadata["language_info"], "version": "?"}} == {
            **KERNEL_METADATA,
            "language_info": {**KERNEL_METADATA["language_info"], "version": "?"},
        }, metadata

    menus = browser.execute_script(
        "return Array.from(document.querySelectorAll('.lm-MenuBar-itemLabel')).map(e => e.textContent)"
    )
    assert menus and "File" in menus, menus
    assert not any("nbgrader" in m.lower() for m in menus), f"nbgrader's menu is shown to learners: {menus}"
    page = browser.execute_script("return document.body.innerText")
    assert "Validate" not in page and "Create Assignment" not in page, "nbgrader's tools are shown to learners"

    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    message = _wait_for(
        browser,
        "const outs = Array.from(document.querySelectorAll('.jp-OutputArea-output')).map(e => e.innerText);"
        "return outs.find(t => t.includes('is not written yet'));",
        180,
        "the first check's output",
    )
    assert "`LayerNorm.forward` is not written yet: complete the exercise cell above" in message, message
    assert "harness/" not in message, message
