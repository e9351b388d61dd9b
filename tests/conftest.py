"""Test selection shared by tests/.

The `fullsize` tests (tests/test_fullsize.py: notebooks in their default mode with the reference at GPT-2 small's
size, on a stand-in hub) take most of an hour on 2 cores, so a plain `pytest` deselects them; `-m fullsize` (or any
-m expression naming them) selects them. The `ray` tests (tests/test_grading_ray.py: a batch graded on a Ray
cluster of three nodes started on this machine) take a few minutes and are opt-in the same way (`-m ray`); `.ci/run`
runs them after the default suite. So do the `exhaustive` tests (tests/test_exercise_arguments.py: every solution
notebook run once, then each exercise argument ignored in turn; about five minutes; and the judge's verdicts on
the wrong versions that mutation sweeps and red-team rounds found, tests/test_judge.py's SWEPT_MISTAKES), and the
`slow` ones (nbgrader's
Validator on every solution notebook, which nbval also runs end to end; the Colab set-up's install in a fresh
environment; the reference on every window of Milton's verse: about five minutes together), which keep the default
suite near 15 minutes on 2 cores. This lives here rather than in pyproject.toml's addopts because
course.sh re-runs the set-up (pip) whenever pyproject.toml changes.
"""

from __future__ import annotations

# With pytest-xdist (`course.sh test` runs two workers), every file's tests stay together on one worker, in order,
# so that a module's fixtures (a graded batch, a browser, nbval's kernel of a notebook) are made once; the tests of
# these files, each its own judging with nothing shared, are spread over the workers. (xdist's own `loadgroup`
# renames node ids, which pytest 9 no longer reads: its groups were ignored, and a notebook's cells ran apart.)
SPREAD = {"test_judge.py"}


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path.rsplit("/", 1)[-1] in SPREAD else path

    return FileScheduling(config, log)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fullsize: a notebook's default mode at GPT-2 small's size (opt-in: select with -m fullsize)"
    )
    config.addinivalue_line("markers", "ray: grading on a Ray cluster started here (opt-in: select with -m ray)")
    config.addinivalue_line(
        "markers",
        "exhaustive: every solution notebook run to try variants of its exercises, and the swept wrong versions through "
        "the judge (opt-in: -m exhaustive)",
    )
    config.addinivalue_line(
        "markers", "slow: a long run of what the default suite checks another way (opt-in: select with -m slow)"
    )


OPT_IN = ("fullsize", "ray", "exhaustive", "slow")


def pytest_collection_modifyitems(config, items):
    named = config.getoption("markexpr") or ""
    skipped = [marker for marker in OPT_IN if marker not in named]

    def opt_in(item):
        return any(item.get_closest_marker(marker) for marker in skipped)

    deselected = [item for item in items if opt_in(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not opt_in(item)]
