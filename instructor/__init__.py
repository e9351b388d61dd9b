"""Instructor tools: generate the learner notebooks from `solutions/` and grade submissions.

- `python -m instructor.generate [--check]`: learner notebooks (`notebooks/`) from the solution notebooks.
- `python -m instructor.grade SUBMISSIONS_DIR --out OUT_DIR`: autograde a batch of submissions.
"""
