"""nbgrader settings for nbgrader's own commands run from the repository root (e.g. `nbgrader validate FILE`).

Grading uses `python -m instructor.grade`, which writes its course directory's own nbgrader_config.py.
Note that `nbgrader validate` on the command line still treats stderr in a test cell as a failure (its list of
preprocessors cannot be configured); tests/test_learner_notebooks.py validates with the grader's semantics.
"""

from instructor import nbconfig

c = get_config()  # noqa: F821
nbconfig.configure(c)
