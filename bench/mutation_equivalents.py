"""Surviving mutants that compute what the solution computes, each with the reason (reviewed here, in one place).

`bench/mutation_score.py` counts a survivor as equivalent only when an entry here matches its exercise (grade id)
and its changed line, before and after (whitespace stripped). Any other survivor is a blind spot of the check.
"""

EQUIVALENTS: list[dict] = []
