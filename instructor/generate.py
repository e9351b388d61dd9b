"""Build the learner notebooks, `notebooks/NN_name.ipynb`, from `solutions/NN_name.ipynb` with nbgrader.

    python -m instructor.generate            # (re)write notebooks/
    python -m instructor.generate --check    # exit 1 if notebooks/ is not what generation gives now

nbgrader's generate_assignment replaces each `### BEGIN SOLUTION ... ### END SOLUTION` region by
`raise NotImplementedError()`, clears outputs, keeps the test cells (without hidden tests) and locks them. The
output is deterministic (nbformat's sorted-key JSON, cell ids kept from the solutions, no timestamps), so the
check can regenerate into a temporary folder and compare bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

from instructor import setup_cell
from instructor.course import NOTEBOOKS_DIR, SOLUTIONS_DIR, build_course, dumps_notebook, notebook_names, read_json


def sync_solutions(solutions_dir: Path = SOLUTIONS_DIR, write: bool = True) -> list[str]:
    """Bring each solution's set-up cell and kernel metadata in line with `instructor/setup_cell.py`.

    Returns the notebooks that were (or, with `write=False`, would be) changed.
    """
    url = setup_cell.repository_url()
    changed = []
    for name in notebook_names(solutions_dir):
        path = Path(solutions_dir) / f"{name}.ipynb"
        before = path.read_text(encoding="utf-8")
        after = dumps_notebook(setup_cell.apply(read_json(path), url))
        if after != before:
            changed.append(name)
            if write:
                path.write_text(after, encoding="utf-8")
    return changed


def _normalise(release: dict, source: dict, name: str) -> dict:
    """Stable output: ids from the source notebook (or derived from the position), kernel metadata from it."""
    used = set()
    for index, (cell, src) in enumerate(zip(release["cells"], source["cells"])):
        cell_id = src.get("id") or hashlib.sha1(f"{name}:{index}".encode()).hexdigest()[:8]
        while cell_id in used:
            cell_id = hashlib.sha1(cell_id.encode()).hexdigest()[:8]
        used.add(cell_id)
        cell["id"] = cell_id
    release["nbformat"], release["nbformat_minor"] = 4, 5
    release["metadata"] = {k: v for k, v in source.get("metadata", {}).items() if k in ("kernelspec", "language_info")}
    url = setup_cell.repository_url()
    return setup_cell.add_badge(setup_cell.apply(release, url), url, name)


def generate(out_dir: Path, names: list[str] | None = None, solutions_dir: Path = SOLUTIONS_DIR) -> list[Path]:
    """Write the learner version of each solution notebook into `out_dir`; returns the paths written."""
    names = names or notebook_names(solutions_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="tfs-generate-") as tmp:
        build_course(Path(tmp), names, solutions_dir)
        for name in names:
            release = read_json(Path(tmp) / "release" / name / f"{name}.ipynb")
            source = read_json(Path(solutions_dir) / f"{name}.ipynb")
            if len(release["cells"]) != len(source["cells"]):
                raise RuntimeError(f"{name}: nbgrader changed the number of cells; check the solution markers")
            path = out_dir / f"{name}.ipynb"
            path.write_text(dumps_notebook(_normalise(release, source, name)), encoding="utf-8")
            written.append(path)
    return written


def check(notebooks_dir: Path = NOTEBOOKS_DIR, solutions_dir: Path = SOLUTIONS_DIR) -> list[str]:
    """Problems that make `notebooks_dir` differ from a fresh generation (empty when up to date)."""
    names = notebook_names(solutions_dir)
    problems = [
        f"solutions/{name}.ipynb: its set-up cell or kernel metadata differs from instructor/setup_cell.py"
        for name in sync_solutions(solutions_dir, write=False)
    ]
    with tempfile.TemporaryDirectory(prefix="tfs-check-") as tmp:
        generate(Path(tmp), names, solutions_dir)
        for name in names:
            fresh = (Path(tmp) / f"{name}.ipynb").read_bytes()
            committed = Path(notebooks_dir) / f"{name}.ipynb"
            if not committed.exists():
                problems.append(f"{committed} is missing")
            elif committed.read_bytes() != fresh:
                problems.append(f"{committed} is stale (differs from the generation of solutions/{name}.ipynb)")
    for path in sorted(Path(notebooks_dir).glob("*.ipynb")):
        if path.stem not in names:
            problems.append(f"{path} has no solution notebook")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m instructor.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that notebooks/ is up to date")
    parser.add_argument("--out", type=Path, default=NOTEBOOKS_DIR, help="output folder (default: notebooks/)")
    parser.add_argument("names", nargs="*", help="notebooks to generate (default: all)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.out)
        for problem in problems:
            print(problem)
        if problems:
            print("Run `python -m instructor.generate` to regenerate the learner notebooks.")
            return 1
        print(f"{args.out} is up to date.")
        return 0
    for name in sync_solutions():
        print(f"updated the set-up cell of solutions/{name}.ipynb")
    for path in generate(args.out, args.names or None):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
