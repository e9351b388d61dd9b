"""Test selection shared by tests/.

The `fullsize` tests (tests/test_fullsize.py: notebooks in their default mode with the reference at GPT-2 small's
size, on a stand-in hub) take most of an hour on 2 cores, so a plain `pytest` deselects them; `-m fullsize` (or any
-m expression naming them) selects them. This lives here rather than in pyproject.toml's addopts because
course.sh re-runs the set-up (pip) whenever pyproject.toml changes.
"""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fullsize: a notebook's default mode at GPT-2 small's size (opt-in: select with -m fullsize)"
    )


def pytest_collection_modifyitems(config, items):
    if "fullsize" in (config.getoption("markexpr") or ""):
        return
    deselected = [item for item in items if item.get_closest_marker("fullsize")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("fullsize")]
