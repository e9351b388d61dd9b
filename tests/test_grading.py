"""End-to-end tests of `python -m instructor.grade`: scores, tampering, hangs, broken and foreign notebooks.

One batch is graded for the whole module (one student folder per scenario, on 01_layernorm and 02_embeddings,
the two simplest notebooks), then each test checks its student's rows. Scenarios are built from the current
solution notebooks and the learner notebooks nbgrader generates from them, so they follow the course as it
changes. A few fast unit tests of the plan and the normaliser come first.
"""

from __future__ import annotations

import ast
import base64
import copy
import csv
import json
import math
import os
import re
import subprocess
import sys
import time

import pytest

from instructor.collect import normalise
from instructor.course import REPO_ROOT, cell_source, nbgrader_meta, notebook_names, read_json
from instructor.grade import ChildFailed, _student_id, bounded, prepare_course
from instructor.plan import build_plan, definitions_only

LN, EMB = "01_layernorm", "02_embeddings"
CELL_TIMEOUT = 20


def _sandbox_available() -> bool:
    from instructor.sandbox import find_bwrap, works

    bwrap = find_bwrap()
    return bool(bwrap) and os.geteuid() == 0 and works(bwrap) is None


SANDBOX = _sandbox_available()
needs_sandbox = pytest.mark.skipif(not SANDBOX, reason="bubblewrap and root are needed for the grader's sandbox")


# ---------------------------------------------------------------------- notebook surgery
def solution(name: str) -> dict:
    return read_json(REPO_ROOT / "solutions" / f"{name}.ipynb")


def index_of(nb: dict, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb["cells"]) if nbgrader_meta(c).get("grade_id") == grade_id)


def set_source(nb: dict, grade_id: str, source: str) -> dict:
    nb["cells"][index_of(nb, grade_id)]["source"] = source
    return nb


def solve(nb: dict, name: str, *exercises: str) -> dict:
    """The learner's notebook with these exercises solved (the solution notebook's code)."""
    sol = solution(name)
    for ex in exercises:
        set_source(nb, ex, cell_source(sol["cells"][index_of(sol, ex)]))
    return nb


def code_cell(source: str, metadata: dict | None = None) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": metadata or {}, "outputs": [], "source": source}


def insert_before(nb: dict, grade_id: str, source: str) -> dict:
    nb["cells"].insert(index_of(nb, grade_id), code_cell(source))
    return nb


def insert_after(nb: dict, grade_id: str, source: str) -> dict:
    nb["cells"].insert(index_of(nb, grade_id) + 1, code_cell(source))
    return nb


def strip_nbgrader(nb: dict) -> dict:
    for cell in nb["cells"]:
        cell["metadata"].pop("nbgrader", None)
        cell["metadata"].pop("editable", None)
        cell["metadata"].pop("deletable", None)
    return nb


def as_colab(nb: dict) -> dict:
    """Saved by Google Colab: nbformat 4.0 without cell ids, Colab metadata, outputs, widget state."""
    nb = copy.deepcopy(nb)
    nb["nbformat_minor"] = 0
    nb["metadata"] = {
        "colab": {"provenance": [], "collapsed_sections": []},
        "kernelspec": {"name": "python3", "display_name": "Python 3"},
        "language_info": {"name": "python"},
        "accelerator": "GPU",
        "widgets": {
            "application/vnd.jupyter.widget-state+json": {
                "4f1e": {
                    "model_module": "@jupyter-widgets/controls",
                    "model_name": "HBoxModel",
                    "model_module_version": "1.5.0",
                    "state": {"children": []},
                }
            }
        },
    }
    for i, cell in enumerate(nb["cells"]):
        cell.pop("id", None)
        cell["metadata"]["id"] = f"Xy{i:04d}ab"
        cell["source"] = cell_source(cell).splitlines(True)
        if cell["cell_type"] == "code":
            cell["metadata"]["colab"] = {"base_uri": "https://localhost:8080/"}
            cell["metadata"]["outputId"] = f"{i:08x}-0000"
            cell["execution_count"] = i + 1
            cell["outputs"] = [
                {"output_type": "stream", "name": "stdout", "text": ["ran on Colab\n"]},
                {
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {
                        "application/vnd.jupyter.widget-view+json": {
                            "model_id": "4f1e",
                            "version_major": 2,
                            "version_minor": 0,
                        },
                        "text/plain": ["HBox(children=())"],
                    },
                },
            ]
    return nb


def as_vscode(nb: dict) -> dict:
    """Saved by VS Code: its own kernelspec and interpreter metadata, outputs and execution counts."""
    nb = copy.deepcopy(nb)
    nb["metadata"] = {
        "kernelspec": {"display_name": ".venv (Python 3.11.7)", "language": "python", "name": "python3"},
        "language_info": {
            "codemirror_mode": {"name": "ipython", "version": 3},
            "file_extension": ".py",
            "mimetype": "text/x-python",
            "name": "python",
            "nbconvert_exporter": "python",
            "pygments_lexer": "ipython3",
            "version": "3.11.7",
        },
        "vscode": {"interpreter": {"hash": "0f3c1e0b9d9c2f7b3e8a5b1d2c4e6f8a"}},
        "orig_nbformat": 4,
    }
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            cell["execution_count"] = i + 1
            cell["outputs"] = [
                {
                    "output_type": "execute_result",
                    "execution_count": i + 1,
                    "metadata": {},
                    "data": {"text/plain": ["42"]},
                }
            ]
            cell["metadata"]["vscode"] = {"languageId": "python"}
    return nb


WRONG_LAYERNORM = """
class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        return residual * self.w + self.b  # no normalisation at all: wrong
"""

# Right only when a harness check is on the stack (found through logging's frame helper), wrong otherwise:
# nbgrader's run passes it; the judge, outside, does not.
HARNESS_AWARE = """
import logging


class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        frame = getattr(logging, "current" + "frame")()
        watched = False
        while frame is not None:
            watched = watched or "har" + "ness" in str(getattr(frame, "f_glo" + "bals").get("__file__"))
            frame = getattr(frame, "f_ba" + "ck")
        if not watched:
            return residual * self.w + self.b
        centered = residual - residual.mean(dim=-1, keepdim=True)
        return centered / (centered.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b
"""


# ---------------------------------------------------------------------- scenarios
def scenarios(release: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """student -> {notebook: notebook JSON}."""

    def ln():
        return copy.deepcopy(release[LN])

    def emb():
        return copy.deepcopy(release[EMB])

    out = {
        "blank": {LN: ln()},
        "solved": {LN: solve(ln(), LN, "layernorm"), EMB: solve(emb(), EMB, "embed", "pos_embed", "sinusoidal")},
        "partial": {EMB: solve(emb(), EMB, "embed")},
    }
    # harness's checks redefined in the notebook, and their helpers monkeypatched
    nb = insert_before(
        set_source(ln(), "layernorm", WRONG_LAYERNORM),
        "test_layernorm",
        "def rand_float_test(*args, **kwargs):\n    print('all good')\n\n\n"
        "def load_gpt2_test(*args, **kwargs):\n    print('all good')\n",
    )
    nb = insert_before(
        nb,
        "test_layernorm",
        """
import harness._assertions as _a
import harness.checks as _c
for _m in (_a, _c):
    for _n in ("fail", "assert_close", "mismatch_summary", "check_tensor", "assert_unchanged"):
        if hasattr(_m, _n):
            setattr(_m, _n, lambda *args, **kwargs: None)
""",
    )
    out["check_tampering"] = {LN: nb}
    # torch's comparisons and builtins patched at top level
    nb = insert_before(
        set_source(ln(), "layernorm", WRONG_LAYERNORM),
        "test_layernorm",
        """
import builtins
torch.allclose = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
torch.isclose = lambda a, b, *args, **kwargs: torch.ones(a.shape, dtype=torch.bool)
torch.equal = lambda *args, **kwargs: True
torch.Tensor.any = lambda self, *args, **kwargs: torch.zeros((), dtype=torch.bool)
builtins.any = lambda *args, **kwargs: False
builtins.all = lambda *args, **kwargs: True
""",
    )
    out["patched_torch"] = {LN: nb}
    # the same patches hidden in the class body (they survive "definitions only")
    body = WRONG_LAYERNORM.replace(
        "class LayerNorm(nn.Module):\n",
        "class LayerNorm(nn.Module):\n"
        "    torch.Tensor.any = lambda self, *args, **kwargs: torch.zeros((), dtype=torch.bool)\n"
        "    torch.allclose = lambda *args, **kwargs: True\n",
    )
    out["class_body_patch"] = {LN: set_source(ln(), "layernorm", body)}
    # the reference model's own LayerNorm, found at run time without importing anything
    out["reference_reach"] = {
        LN: set_source(
            ln(),
            "layernorm",
            """
class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        modules = getattr(torch, "s" + "ys").modules
        ref = next(getattr(m, "reference") for m in list(modules.values())
                   if type(getattr(m, "reference", None)).__name__ == "HookedTransformer")
        theirs = type(ref.ln_final)(ref.cfg)
        theirs.w, theirs.b, theirs.eps = self.w, self.b, self.cfg.layer_norm_eps
        return theirs(residual)
""",
        )
    }
    # the course's own answer via harness.components: plainly, and hidden from the static scan
    nb = set_source(emb(), "embed", 'from harness import components\n\nEmbed = components("02_embeddings").Embed\n')
    nb = set_source(
        nb,
        "pos_embed",
        """
class PosEmbed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_pos = nn.Parameter(torch.zeros((cfg.n_ctx, cfg.d_model)))

    def forward(self, tokens):
        course = getattr(getattr(torch, "s" + "ys").modules["har" + "ness"], "compo" + "nents")
        theirs = course("02_embeddings").PosEmbed(self.cfg)
        theirs.W_pos = self.W_pos
        return theirs(tokens)
""",
    )
    out["components"] = {EMB: solve(nb, EMB, "sinusoidal")}
    # nbgrader's own protections: an edited test, a deleted test (solved), a duplicated grade_id
    nb = set_source(emb(), "test_embed", "print('tests passed')")
    nb = solve(nb, EMB, "pos_embed")
    del nb["cells"][index_of(nb, "test_pos_embed")]
    test_meta = copy.deepcopy(nb["cells"][index_of(nb, "test_sinusoidal")]["metadata"])
    nb["cells"].insert(index_of(nb, "test_sinusoidal") + 1, code_cell("pass", test_meta))
    out["nbgrader_tamper"] = {EMB: nb}
    # a hang in a tested method, a syntax error in another exercise, a huge allocation
    nb = solve(emb(), EMB, "embed", "pos_embed", "sinusoidal")
    pos = cell_source(nb["cells"][index_of(nb, "pos_embed")])
    tree = ast.parse(pos)
    hang = pos + "\n\n    def forward(self, tokens):  # noqa\n        while True:\n            pass\n"
    assert tree  # the solution parses; the hang overrides forward
    set_source(nb, "pos_embed", hang)
    set_source(nb, "sinusoidal", cell_source(nb["cells"][index_of(nb, "sinusoidal")]) + "\n\ndef oops(:\n    pass\n")
    insert_after(nb, "test_embed", "huge = torch.ones(1 << 40)  # 4 TB")
    out["hang_syntax_memory"] = {EMB: nb}
    # the kernel dies after the first test
    nb = solve(emb(), EMB, "embed", "pos_embed", "sinusoidal")
    insert_after(nb, "test_embed", "import os\nos.kill(os.getpid(), 9)")
    out["kernel_death"] = {EMB: nb}
    # harmless stderr in a graded test: a DeprecationWarning and a tqdm bar
    nb = solve(ln(), LN, "layernorm")
    text = cell_source(nb["cells"][index_of(nb, "layernorm")])
    text = "import warnings\n\nfrom tqdm import tqdm\n\n" + text.replace(
        "    def forward(self, residual",
        "    def forward(self, *args, **kwargs):\n"
        "        warnings.warn('this LayerNorm is old-fashioned', DeprecationWarning)\n"
        "        for _ in tqdm(range(3), desc='normalising'):\n"
        "            pass\n"
        "        return self._forward(*args, **kwargs)\n\n"
        "    def _forward(self, residual",
        1,
    )
    # saved by Colab, with that harmless stderr; saved by VS Code, with every nbgrader metadata stripped
    out["colab"] = {LN: as_colab(set_source(nb, "layernorm", text))}
    out["vscode"] = {LN: as_vscode(strip_nbgrader(solve(ln(), LN, "layernorm")))}
    out["harness_aware"] = {LN: set_source(ln(), "layernorm", HARNESS_AWARE)}
    # honest but unusual (issue #20): a cached function, a helper reached through functools.partial
    nb = solve(emb(), EMB, "embed", "pos_embed", "sinusoidal")
    text = cell_source(nb["cells"][index_of(nb, "sinusoidal")])
    # ... under a script's `if __name__ == "__main__":` guard, a constant it uses (a red-team review: the judge's
    # child named its module otherwise, and the honest notebook lost 02's points)
    text = text.replace("1.0 / 10000 **", "1.0 / BASE **")
    assert "BASE **" in text
    guarded = 'if __name__ == "__main__":\n    BASE = 10000.0\n\n\n'
    set_source(nb, "sinusoidal", guarded + "import functools\n\n\n@functools.lru_cache(maxsize=None)\n" + text)
    text = cell_source(nb["cells"][index_of(nb, "embed")]).replace(
        "return self.W_E[tokens]", "return _lookup(self.W_E, tokens)"
    )
    helpers = (
        "import functools\nfrom types import SimpleNamespace\n\n\ndef _rows(table, ids):\n"
        '    """Rows of `table`; `ids` of any tensor type (its __class__ is printed when debugging)."""\n'
        "    if SimpleNamespace(debug=False).debug:\n        print(ids.__class__.__name__)\n"
        "    return table[ids]\n\n\n_lookup = functools.partial(_rows)\n\n\n"
    )
    # ... a constant chosen by an `if`, an optional import under `try`, an environment variable read with `os`, a
    # config's fields read through vars() and set on a copy with setattr (each refused by the scan or dropped with
    # the top-level actions until issue #20's second review)
    ln_text = cell_source(solution(LN)["cells"][index_of(solution(LN), "layernorm")])
    ln_text = (
        "import os\nimport copy\n\nif os.environ.get('NEVER_SET_IN_GRADING'):\n    SCALE = 2.0\nelse:\n    SCALE = 1.0\n"
        "try:\n    from einops import reduce as _reduce\nexcept ImportError:\n    _reduce = None\n\n\n"
        "def _eps(cfg):\n    mine = copy.copy(cfg)\n    setattr(mine, 'layer_norm_eps', vars(cfg)['layer_norm_eps'] * SCALE)\n"
        "    return mine.layer_norm_eps\n\n\n"
        + ln_text.replace("residual.mean(dim=-1, keepdim=True)", "_reduce(residual, 'b p d -> b p 1', 'mean')").replace(
            "+ self.cfg.layer_norm_eps", "+ _eps(self.cfg)"
        )
    )
    # ... and a table filled in by a top-level `for`, a method attached by another (a red-team review: loops were
    # dropped as actions, and both honest notebooks lost their points)
    ln_text = (
        "_DIMS = {}\nfor _name, _dim in (('features', -1),):\n    _DIMS[_name] = _dim\n\n\n"
        + ln_text.replace("+ _eps(self.cfg)", "+ self.eps_used()").replace(
            "self.cfg = cfg\n", "self.cfg = cfg\n        assert _DIMS['features'] == -1\n"
        )
        + "\n\nfor _name, _method in {'eps_used': lambda self: _eps(self.cfg)}.items():\n"
        "    setattr(LayerNorm, _name, _method)\n"
    )
    assert "self.eps_used()" in ln_text and "_DIMS['features']" in ln_text
    out["unusual_honest"] = {EMB: set_source(nb, "embed", helpers + text), LN: set_source(ln(), "layernorm", ln_text)}
    # ... a helper module written with %%writefile and imported, a sanity check with torch.testing.assert_close,
    # a torch.vmap in the forward (a red-team review: the import failed in the kernel and the judge's child, the two
    # others were refused as torch's internals) and a scratch folder from tempfile (the template's /tmp before)
    ln_text = cell_source(solution(LN)["cells"][index_of(solution(LN), "layernorm")])
    ln_text = (
        "import os\nimport tempfile\n\nimport torch.testing\nfrom ln_helper import centre\n\n"
        "_scratch = tempfile.mkdtemp(prefix='ln-')  # a scratch folder: in the child's own home\n\n"
    ) + ln_text.replace("self.cfg = cfg", "self.cfg = cfg\n        assert os.path.isdir(_scratch)").replace(
        "centered = residual - residual.mean(dim=-1, keepdim=True)",
        "centered = centre(residual)\n"
        "        torch.testing.assert_close(centered.mean(-1), torch.zeros_like(centered.mean(-1)), atol=1e-3, rtol=0)",
    ).replace(
        "centered.pow(2).mean(dim=-1, keepdim=True)",
        "torch.vmap(lambda row: row.pow(2).mean(dim=-1, keepdim=True))(centered)",
    )
    # ... and a debug helper that names its caller with inspect.stack() and prints a traceback it caught (a red-team
    # review: both were refused as routes to the judge's frames, and the exercise lost its points)
    ln_text = (
        "import inspect\nimport traceback\n\n\ndef _caller():\n    return inspect.stack()[1].function\n\n\n"
        "def _fast_path(x):\n    try:\n        raise NotImplementedError('no fast path')\n"
        "    except NotImplementedError:\n        return traceback.format_exc().count('fast path')\n\n\n"
    ) + ln_text.replace(
        "self.cfg = cfg\n",
        "self.cfg = cfg\n        assert _caller() == '__init__' and _fast_path(cfg)\n"
        "        torch.set_num_threads(2)  # a probe child starts no thread: OpenMP must not try (it crashed)\n",
    )
    assert "centre(residual)" in ln_text and "torch.vmap" in ln_text and "isdir(_scratch)" in ln_text
    assert "_caller() == '__init__'" in ln_text
    nb = set_source(ln(), "layernorm", ln_text)
    nb["cells"].insert(
        index_of(nb, "layernorm"),
        code_cell("%%writefile ln_helper.py\n\n\ndef centre(x):\n    return x - x.mean(dim=-1, keepdim=True)\n"),
    )
    out["unusual_honest_2"] = {LN: nb}
    # ... a singledispatch function given its case by `register`, a table an added cell binds and the exercise fills
    # in, and a helper module loaded with %run (red-team round 9: each lost the exercise's points in the judge)
    nb = set_source(ln(), "layernorm", UNUSUAL_3)
    for cell in (  # each put just before the exercise, so in this order
        "%%writefile ln_ops.py\n\n\ndef centred(x):\n    return x - x.mean(-1, keepdim=True)\n",
        "%run ln_ops.py",
        "LN_TABLE: dict[str, int] = {}",  # annotated, as the red-team's was
    ):
        nb["cells"].insert(index_of(nb, "layernorm"), code_cell(cell))
    out["unusual_honest_3"] = {LN: nb}
    # ... helper modules written with `open` and `Path.write_text` and one registered in `sys.modules`, the class
    # defined by a function that declares it global, rich imported (red-team round 11: each lost the exercise), a
    # table filled in by a `while`
    nb = set_source(ln(), "layernorm", UNUSUAL_4)
    nb["cells"].insert(index_of(nb, "layernorm"), code_cell(HELPERS_4))
    out["unusual_honest_4"] = {LN: nb}
    # ... a method added to its class in a later cell, with modules the static scan refused until it was retired
    nb = set_source(ln(), "layernorm", LATE_CLASS)
    out["late_method"] = {LN: insert_after(nb, "layernorm", LATE_METHOD)}
    return out


LATE_CLASS = WRONG_LAYERNORM.split("\n    def forward")[0] + "\n"  # the class with no forward of its own
HELPERS_4 = """import sys
import types
from pathlib import Path

with open("ln_centre.py", "w") as f:
    f.write("def centre(x):\\n    return x - x.mean(dim=-1, keepdim=True)\\n")
Path("ln_power.py").write_text("POWER = 2\\n")
_module = types.ModuleType("ln_eps")
exec("def with_eps(v, eps):\\n    return v + eps\\n", _module.__dict__)
sys.modules["ln_eps"] = _module
POWERS = []  # a table filled in by a `while` (dropped as an action until round 14: the exercise lost)
while len(POWERS) < 3:
    POWERS.append(len(POWERS))


class _Registry:
    def __init__(self):
        self.table = {}

    def register(self, key, value):
        self.table[key] = value

    def get(self, key):
        return self.table[key]


def _install(source, namespace):
    exec(compile(source, "<ln_scale>", "exec"), namespace)


# red-team round 19: calls that fill what the exercise reads, each dropped as an action (the exercise scored 0)
REGISTRY = _Registry()
REGISTRY.register("power", 2)
_install("def scale(x, w, b):\\n    return x * w + b\\n", globals())
"""
UNUSUAL_4 = """import torch
from ln_centre import centre
from ln_eps import with_eps
from ln_power import POWER
from concurrent.futures import ThreadPoolExecutor

from rich.text import Text
from torch import nn


def _define():
    global LayerNorm

    class LayerNorm(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg, self.label = cfg, Text("LayerNorm")
            self.w = nn.Parameter(torch.ones(cfg.d_model))
            self.b = nn.Parameter(torch.zeros(cfg.d_model))

        def forward(self, residual):
            with ThreadPoolExecutor(1) as pool:  # a thread of its own (round 14: refused, the exercise lost)
                centered = pool.submit(centre, residual).result()
            variance = centered.pow(POWERS[REGISTRY.get("power")] * POWER // 2).mean(dim=-1, keepdim=True)
            return scale(centered / with_eps(variance, self.cfg.layer_norm_eps).sqrt(), self.w, self.b)


_define()
"""
UNUSUAL_3 = (
    """import functools

import torch
from torch import nn


@functools.singledispatch
def variance(x):
    raise TypeError(f"no variance for {type(x)}")


def _variance_of_a_tensor(x):
    return x.pow(LN_TABLE["power"]).mean(dim=-1, keepdim=True)


variance.register(torch.Tensor, _variance_of_a_tensor)
LN_TABLE["power"] = 2
_ROOT_POWERS = []
for _k in range(1, 4):  # a table computed by a loop over a range (dropped as an action before: 0 points)
    _ROOT_POWERS.append(1 / _k)
"""
    + LATE_CLASS
    + """
    def forward(self, residual):
        centered = centred(residual)
        eps = self.cfg.layer_norm_eps * EPS_SCALE
        return centered / (variance(centered) + eps).pow(self.power) * self.w + self.shift()


def _shift(self):
    return self.b


# red-team round 18: each of these was dropped as an action, and the exercise scored 0
print(f"root power {(_HALF := _ROOT_POWERS[1]):.2f}")  # a walrus inside an action
LayerNorm.shift, LayerNorm.label = _shift, "layer norm"  # methods set as a tuple
LayerNorm.power: float = _HALF  # an annotated class attribute
EPS_SCALE = LN_TABLE["eps_scale"] = 1  # a name and a table entry at once
"""
)
LATE_METHOD = """
import inspect
import sys


exec("def _centre(x):\\n    return x - x.mean(dim=-1, keepdim=True)\\n", globals())
globals()["_FLOOR"] = 0.0


def _ln_forward(self, residual):
    assert sys.float_info.epsilon < self.cfg.layer_norm_eps or True
    centered = _centre(residual) + _FLOOR
    return centered / (centered.pow(2).mean(dim=-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b


LayerNorm.forward = _ln_forward
print(inspect.signature(LayerNorm.forward))
"""


# Cheats that got through in-process guards (issue #14), and inputs that stopped the whole batch.
FORGE_FD = """
class LayerNorm(nn.Module):
    _o = getattr(torch.serialization, "o" + "s")
    for _fd in range(256):  # every descriptor by number (a probe child has no /proc to list them)
        for _g in ("test_layernorm", "test_layernorm_gpt2", "test_layernorm_rand"):
            try:
                _o.write(int(_fd), ('{"type": "test", "grade_id": "%s", "passed": true, "message": null}\\n' % _g).encode())
            except Exception:
                pass

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):
        return residual * self.w + self.b
"""
FUNCTION_MODE = WRONG_LAYERNORM.replace(
    "class LayerNorm(nn.Module):\n",
    "class _Quiet(torch.overrides.TorchFunctionMode):\n"
    "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
    "        return func(*args, **(kwargs or {}))\n\n\n"
    "_mode = _Quiet().__enter__()\n\n\n"
    "class LayerNorm(nn.Module):\n",
)
GLOBAL_HOOK = WRONG_LAYERNORM.replace(
    "class LayerNorm(nn.Module):\n",
    "class LayerNorm(nn.Module):\n"
    "    _h = getattr(torch.nn.modules.module, 'register_module_' + 'forward_hook')(lambda m, i, o: o)\n",
)
THREAD_FORWARD = """
from concurrent.futures import ThreadPoolExecutor


class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, residual):  # the function and operator the exercise forbids, in a thread
        norm = getattr(torch.nn.functional, "layer" + "_norm")
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(norm, residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps).result()
"""
FORBIDDEN_CALL = WRONG_LAYERNORM.replace(
    "return residual * self.w + self.b  # no normalisation at all: wrong",
    "return torch.nn.functional.layer_norm(residual, (self.cfg.d_model,), self.w, self.b, self.cfg.layer_norm_eps)",
)
REACH_OUT = """
import os, subprocess
seen = {{}}
for path in ["/proc/self/root{repo}/solutions/01_layernorm.ipynb", "{repo}/solutions/01_layernorm.ipynb",
             "/proc/1/root{repo}/solutions/01_layernorm.ipynb", "/run/tfs/private/solutions/01_layernorm.ipynb",
             "{repo}/.git/HEAD", "{out}/grades.csv"]:
    try:
        open(path).read(10)
        seen[path] = "READ" + "ABLE"
    except Exception as err:
        seen[path] = type(err).__name__
for pid in (1, os.getppid()):
    try:
        os.kill(pid, 9)
        seen[pid] = "KILL" + "ED"
    except Exception as err:
        seen[pid] = type(err).__name__
subprocess.Popen(["sh", "-c", "sleep 6; echo HACKED > {out}/grades.csv; echo HACKED > {out}/summary.csv"],
                 start_new_session=True)
print("REA" + "CH:", seen)
"""
SHARED_MEMORY = """
import mmap
_m = mmap.mmap(-1, 3 << 30, flags=mmap.MAP_SHARED)
for _i in range(0, 3 << 30, 4096):
    _m[_i] = 1
print("SURV" + "IVED shared memory")
"""


# Students sharing the machine (issue #20): one plants files (IPython start-up scripts among them) everywhere it
# can write and waits; the next looks for them everywhere it can read; one fills the kernels' shared socket folder;
# one forks as many processes as it can. Graded one after the other or side by side (they sort together).
PLANTER = """
import glob, os, time
places = ["/tmp", "/dev/shm", os.path.expanduser("~"), *glob.glob("/tmp/*"), *glob.glob("/tmp/*/*"),
          *[f"/tmp/j{i}" for i in range(1, 100)]]
planted = 0
for place in places:
    for folder in (place, os.path.join(place, ".ipython/profile_default/startup")):
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "00-SENTINEL.py"), "w") as f:
                f.write("print('PLANT' + 'ED')")
            os.chmod(os.path.join(folder, "00-SENTINEL.py"), 0o777)
            planted += 1
        except OSError:
            pass
print("planted", planted)
time.sleep(8)
"""
SEEKER = """
import os, time
seen = set()
def look(top):
    for root, dirs, files in os.walk(top):
        # read-only binds (an environment or a course that lives under /tmp) hold nothing a kernel wrote
        dirs[:] = [d for d in dirs if not os.statvfs(os.path.join(root, d)).f_flag & os.ST_RDONLY]
        seen.update(os.path.join(root, f) for f in files if "SENTINEL" in f)
for _ in range(10):
    for top in ("/tmp", "/dev/shm", os.path.expanduser("~")):
        look(top)
    time.sleep(1)
print("SEEN:", sorted(seen))
"""
FILLER = """
import glob, json, os
filled = 0
own = []
try:  # the folder this kernel's own sockets are in: its to write, charged to its memory
    with open(os.path.expanduser("~/kernel.json")) as f:
        own = [os.path.dirname(json.load(f)["ip"])]
except (OSError, ValueError, KeyError):
    pass
for folder in glob.glob("/tmp/tfs-grade-*/rt") + own:
    try:
        with open(folder + "/fill", "wb") as f:
            for _ in range(3 << 10):
                f.write(b"x" * (1 << 20))
                filled += 1
    except OSError as err:
        print("stopped:", err)
print("FILLED", filled, "MiB")
made = 0  # ... and its inodes with empty files (red-team round 10: a million of them stopped the whole batch)
for folder in own + glob.glob("/tmp/tfs-grade-*/rt") + glob.glob("/tmp/tfs-grade-*/rt/*") + glob.glob("/tmp/tfs-grade-*"):
    for i in range(200_000):
        try:
            open(f"{folder}/i{i}", "w").close()
        except OSError:
            break
        made += 1
print("INODES", made)
"""
SURROGATE = (
    LATE_CLASS
    + """
    def forward(self, residual):
        import os

        if not os.path.isdir("/proc/self"):  # where the judge's child runs
            raise ValueError("count \\udcff\\ud800 mismatch")
        mean = residual.mean(dim=-1, keepdim=True)
        variance = (residual - mean).pow(2).mean(dim=-1, keepdim=True)
        return (residual - mean) / (variance + self.cfg.layer_norm_eps).sqrt() * self.w + self.b
"""
)
FORKER = """
import os, time
children, start, refused = [], time.monotonic(), False
for _ in range(1000):
    if time.monotonic() - start > 15:  # within the cell's limit on a busy machine; the test then says so
        break
    try:  # a small process each (forking the kernel itself took seconds a child on a busy machine)
        pid = os.posix_spawn("/usr/bin/sleep", ["sleep", "30"], {})
    except OSError as err:
        print("fork refused:", err.strerror)
        refused = True
        break
    children.append(pid)
print("FORKED", len(children), "REFUSED" if refused else "NOT REFUSED")
print("CGROUPS", open("/proc/self/cgroup").read().replace(chr(10), " "))
"""


def sandbox_scenarios(release: dict[str, dict], out_dir) -> dict[str, dict[str, dict]]:
    def ln():
        return copy.deepcopy(release[LN])

    out = {
        "forge_fd": {LN: set_source(ln(), "layernorm", FORGE_FD)},
        "function_mode": {LN: set_source(ln(), "layernorm", FUNCTION_MODE)},
        "global_hook": {LN: set_source(ln(), "layernorm", GLOBAL_HOOK)},
        "thread_forward": {LN: set_source(ln(), "layernorm", THREAD_FORWARD)},
        "forbidden_call": {LN: set_source(ln(), "layernorm", FORBIDDEN_CALL)},
        "launder_source": {LN: set_source(ln(), "layernorm", LAUNDERED_SOURCE)},
        "native_routes": {LN: set_source(ln(), "layernorm", NATIVE_ROUTES)},
    }
    # reads the solutions, kills the template, leaves a process to rewrite the grades and has an expression too
    # deep for the parser: the honest LayerNorm still gets full marks
    nb = solve(ln(), LN, "layernorm")
    insert_after(nb, "layernorm", REACH_OUT.format(repo=REPO_ROOT, out=out_dir))
    insert_after(nb, "layernorm", "deep = " + "-" * 50000 + "1")
    # ... and, in 02 after its first test (cells after a notebook's last test are not run), maps 3 GB of shared memory
    emb = solve(copy.deepcopy(release[EMB]), EMB, "embed", "pos_embed", "sinusoidal")
    out["reach_out"] = {LN: nb, EMB: insert_after(emb, "test_embed", SHARED_MEMORY)}
    out["solved."] = {LN: solve(ln(), LN, "layernorm")}  # the same id as "solved": graded as "solved-2"
    # two folder names of 255 bytes that differ only in their last character: ids with a clash's suffix that were
    # too long for a file name stopped the batch with no CSVs (red-team round 18)
    out[LONG_NAMES[0]] = {LN: solve(ln(), LN, "layernorm")}
    out[LONG_NAMES[1]] = {LN: ln()}
    # an exception message the judge's child alone raises, with lone surrogates, from the student whose rows sort
    # first: its text reached the gradebook and the CSVs, whose encoders raised, and the batch wrote no summary.csv
    # and a grades.csv cut short (red-team round 17)
    out["0_surrogate"] = {LN: set_source(ln(), "layernorm", SURROGATE)}
    for student, code in (("zz_planter", PLANTER), ("zz_seeker", SEEKER), ("zz_filler", FILLER), ("zz_forker", FORKER)):
        nb = solve(ln(), LN, "layernorm")
        out[student] = {LN: insert_after(nb, "layernorm", code)}
    return out


LAUNDERED_SOURCE = """import ast

import torch._refs as _refs_module

_source = open(_refs_module.__file__).read()


def _extract(name):
    node = next(n for n in ast.parse(_source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    return ast.unparse(node) + "\\n"


_helpers = dict(vars(_refs_module))
_made = exec(compile(_extract("_normalize") + _extract("native_layer_norm"), "<norm helper>", "exec"), _helpers)
""" + WRONG_LAYERNORM.replace(
    "return residual * self.w + self.b  # no normalisation at all: wrong",
    'return _helpers["native_layer_norm"](residual, [self.cfg.d_model], self.w, self.b, self.cfg.layer_norm_eps)[0]',
)
# Right only where native code of its own could run or memory be rewritten (a copy of an extension module loaded
# from its home, /proc/self/mem opened): the routes to libtorch's kernels past the dispatcher, where the forbidden
# operators are taken out. nbgrader's kernel has both; the judge's probe child neither (its writable folders are
# mounted noexec, and it has no /proc).
NATIVE_ROUTES = """import glob
import importlib.util
import os
import shutil


def _native_routes():
    routes = []
    try:
        open("/proc/self/mem", "rb").close()
        routes.append("/proc/self/mem")
    except OSError:
        pass
    for found in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "lib-dynload", "_bisect.*.so")))[:1]:
        copy = os.path.join(os.path.expanduser("~"), os.path.basename(found))
        try:
            shutil.copy(found, copy)
            spec = importlib.util.spec_from_file_location("_bisect", copy)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            routes.append("an extension module of its own")
        except (ImportError, OSError):
            pass
    return routes
""" + WRONG_LAYERNORM.replace(
    "return residual * self.w + self.b  # no normalisation at all: wrong",
    "if len(_native_routes()) < 2:\n            return residual * self.w + self.b\n"
    "        centered = residual - residual.mean(dim=-1, keepdim=True)\n"
    "        return centered / (centered.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_eps).sqrt() * self.w + self.b",
)
SANDBOX_CHEATS = {  # student -> what the judge's verdict says
    "forge_fd": "asked for out of turn",  # it wrote to every descriptor it found, the feeder's socket among them
    "function_mode": "differs from the course's LayerNorm",
    "global_hook": "differs from the course's LayerNorm",
    "thread_forward": "forbids layer_norm",  # out of the process for every thread
    "forbidden_call": "forbids layer_norm",  # F.layer_norm itself is withdrawn in 01, its operator too
    # torch's reference layer norm, read from its installed file and compiled under another name: the file is empty
    # where the judge's probes run (a red-team review did this with multi_head_attention_forward in 03)
    "launder_source": "StopIteration",  # its definition found no function in the file, which is empty there
    "native_routes": "differs from the course's LayerNorm",  # neither route open where the judge's probes run
}
LONG_NAMES = ("M" * 254 + "!", "M" * 254 + "?")
EXPECTED = {  # student -> {grade_id: points}; grade_ids not listed score 0
    "blank": {},
    "solved": "all",
    "partial": {"test_embed": "max"},
    "check_tampering": {},
    "patched_torch": {},
    "class_body_patch": {},
    "reference_reach": {},
    "components": {"test_sinusoidal": "max"},
    "nbgrader_tamper": {"test_pos_embed": "max"},
    "hang_syntax_memory": {"test_embed": "max"},
    "kernel_death": {"test_embed": "max"},
    "colab": "all",
    "vscode": "all",
    **{student: {} for student in SANDBOX_CHEATS},
    "reach_out": {"test_layernorm": "max", "test_embed": "max"},
    "solved-2": "all",
    _student_id(LONG_NAMES[0]): "all",
    _student_id(LONG_NAMES[1]): {},
    "zz_planter": "all",
    "zz_seeker": "all",
    "0_surrogate": {},
    # their own limits (memory, processes) may fail their own test, which now runs after them: others are checked
    "zz_filler": None,
    "zz_forker": None,
    "harness_aware": {},
    "unusual_honest": "all",
    "unusual_honest_2": "all",
    "unusual_honest_3": "all",
    "unusual_honest_4": "all",
    "late_method": "all",
}
TAMPERING = ["check_tampering", "patched_torch", "class_body_patch", "reference_reach", "components"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("grading")
    names = notebook_names()
    prepare_course(root / "setup", names, CELL_TIMEOUT, 240)
    release = {n: read_json(root / "setup" / "release" / n / f"{n}.ipynb") for n in (LN, EMB)}
    submissions = root / "submissions"
    out = root / "out"
    for student, notebooks in {**scenarios(release), **sandbox_scenarios(release, out)}.items():
        (submissions / student).mkdir(parents=True)
        for name, nb in notebooks.items():
            (submissions / student / f"{name}.ipynb").write_text(json.dumps(nb, indent=1))
    (submissions / "solved" / "notes.txt").write_text("an extra file, ignored")
    (submissions / "broken").mkdir()
    (submissions / "broken" / f"{LN}.ipynb").write_text("{ this is not json")
    for student, make in NOT_DATA.items():
        make(submissions, submissions / student)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "instructor.grade",
            str(submissions),
            "--out",
            str(out),
            "--jobs",
            "2",
            "--cell-timeout",
            str(CELL_TIMEOUT),
            "--notebook-timeout",
            "240",
            "--memory-gb",
            "2",
            *([] if SANDBOX else ["--no-sandbox"]),
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    grades_text = (out / "grades.csv").read_text()
    import time

    time.sleep(8)  # longer than reach_out's detached process waits before it rewrites the grades
    if SANDBOX:
        assert (out / "grades.csv").read_text() == grades_text and "HACKED" not in grades_text
    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(out / "summary.csv", newline="") as f:
        summary = list(csv.DictReader(f))
    return {"out": out, "rows": rows, "summary": summary, "log": run.stderr}


def _mkdir(path):
    path.mkdir()
    return path


def _outside(subs, name):
    """A solved notebook outside the submissions (the solutions, say), for a hard link to point at."""
    path = subs.parent / f"elsewhere-{name}.ipynb"
    path.write_bytes((subs / "solved" / f"{name}.ipynb").read_bytes())
    return path


def _sparse(path, size):
    path.write_bytes(b"")
    os.truncate(path, size)


# Submissions that are not plain files of their own (issue #20): none is read, each is recorded, none stops the batch
NOT_DATA = {  # student -> how its folder is made (submissions, folder)
    "link_to_solution": lambda subs, d: (_mkdir(d) / f"{LN}.ipynb").symlink_to(REPO_ROOT / "solutions" / f"{LN}.ipynb"),
    "link_to_student": lambda subs, d: (_mkdir(d) / f"{LN}.ipynb").symlink_to(subs / "solved" / f"{LN}.ipynb"),
    "folder_link": lambda subs, d: d.symlink_to(subs / "solved", target_is_directory=True),
    "nested_folder_link": lambda subs, d: (_mkdir(d) / "work").symlink_to(subs / "solved", target_is_directory=True),
    "hard_link": lambda subs, d: os.link(_outside(subs, EMB), _mkdir(d) / f"{EMB}.ipynb"),
    "fifo": lambda subs, d: os.mkfifo(_mkdir(d) / f"{LN}.ipynb"),
    "huge": lambda subs, d: _sparse(_mkdir(d) / f"{LN}.ipynb", 64 << 20),
}
NOT_DATA_REASON = {
    "link_to_solution": "symbolic link",
    "link_to_student": "symbolic link",
    "folder_link": "symbolic link",
    "nested_folder_link": "symbolic link",
    "hard_link": "hard link",
    "fifo": "not a regular file",
    "huge": "the limit is",
}


def rows_of(graded, student):
    rows = [r for r in graded["rows"] if r["student"] == student]
    assert rows, f"no grades for {student}:\n{graded['log'][-2000:]}"
    return rows


def check_expected(graded, student):
    rows = rows_of(graded, student)
    expected = EXPECTED[student]
    for row in rows if expected is not None else ():
        want = float(row["max_score"]) if expected == "all" or expected.get(row["grade_id"]) == "max" else 0.0
        assert float(row["score"]) == want, (student, row)
    return rows


# ---------------------------------------------------------------------- end to end
def test_blank_submission_scores_zero(graded):
    rows = check_expected(graded, "blank") + check_expected(graded, "partial")
    assert {r["notebook"] for r in rows} == {LN, EMB}
    assert all(r["judge"] == "failed" for r in rows if r["grade_id"] != "test_embed")


def test_solutions_get_full_marks(graded):
    rows = check_expected(graded, "solved")
    judged = {r["grade_id"] for r in rows if r["judge"] == "passed"}
    assert judged == {"test_layernorm", "test_embed", "test_pos_embed", "test_sinusoidal"}, (
        rows
    )  # and the others are not judged
    assert all(r["judge"] in ("passed", "") for r in rows), rows
    assert {r["flags"] for r in rows} <= {"", "notes.txt ignored (not one of the course's notebooks)"}, rows
    # Every test and exercise ran; the course's demonstrations no test needs did not, and say so (before the last
    # test too: 01's look at the variance of a vector)
    autograded = read_json(graded["out"] / "course" / "autograded" / "solved" / LN / f"{LN}.ipynb")["cells"]
    code = [c for c in autograded if c["cell_type"] == "code"]
    last_test = max(i for i, c in enumerate(code) if c["metadata"].get("nbgrader", {}).get("grade"))
    assert all(c["execution_count"] for c in code if "nbgrader" in c["metadata"]), code
    left_out = [i for i, c in enumerate(code) if c["execution_count"] is None]
    assert all("Not run when grading" in "".join(code[i]["outputs"][0]["text"]) for i in left_out), code
    assert min(left_out) < last_test < max(left_out), left_out
    feedback = (graded["out"] / "feedback" / "solved" / f"{LN}.html").read_text()
    # Self-contained: formulas as MathML, nothing loaded from the network.
    assert "<math" in feedback and not re.search(r"<script[^>]*src=[\"']https?:", feedback)


def test_partial_submission_scores_exactly_its_solved_exercises(graded):
    rows = check_expected(graded, "partial")
    assert sum(float(r["score"]) for r in rows) == sum(
        float(r["max_score"]) for r in rows if r["grade_id"] == "test_embed"
    )


@pytest.mark.parametrize("student", TAMPERING)
def test_tampering_scores_zero(graded, student):
    rows = check_expected(graded, student)
    for row in rows:
        if EXPECTED[student].get(row["grade_id"]) != "max":
            assert row["judge"] == "failed", row  # the judge alone refuses it
            if float(row["nbgrader_score"]) == float(row["max_score"]):
                # nbgrader's run, in the learner's process, was fooled: the row says so
                assert "passed it but the judge outside the sandbox failed it" in row["flags"], row


def test_nbgrader_restores_edited_and_deleted_tests_and_ignores_duplicates(graded):
    rows = check_expected(graded, "nbgrader_tamper")
    flags = rows[0]["flags"]
    assert "test_pos_embed was missing" in flags and "appears more than once" in flags, flags


def test_hang_syntax_error_and_memory_hog_cost_only_their_exercises(graded):
    rows = check_expected(graded, "hang_syntax_memory")
    assert {r["grade_id"] for r in rows} == {"test_embed", "test_pos_embed", "test_sinusoidal"}


def test_dead_kernel_is_scored_for_what_ran(graded):
    rows = check_expected(graded, "kernel_death")
    assert "DeadKernelError" in rows[0]["flags"], rows


def test_warnings_on_stderr_do_not_cost_points(graded):
    rows = check_expected(graded, "colab")
    autograded = graded["out"] / "course" / "autograded" / "colab" / LN / f"{LN}.ipynb"
    text = autograded.read_text()
    assert "normalising" in text and "DeprecationWarning" in text  # the warnings were there, and cost nothing
    assert all(r["nbgrader_score"] == r["max_score"] for r in rows)


def test_notebook_saved_by_vscode_with_its_nbgrader_metadata_stripped(graded):
    rows = check_expected(graded, "vscode")
    assert "metadata was missing; restored" in rows[0]["flags"], rows


def test_unreadable_notebook_does_not_stop_the_batch(graded):
    broken = [s for s in graded["summary"] if s["student"] == "broken"]
    assert broken and broken[0]["status"] == "unreadable" and float(broken[0]["score"]) == 0


def test_gradebook_holds_the_final_grades(graded):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{graded['out'] / 'course' / 'gradebook.db'}") as gb:
        solved = gb.find_submission(LN, "solved")
        cheat = gb.find_submission(LN, "check_tampering")
        assert solved.score == solved.max_score > 0
        assert cheat.score == 0


# ---------------------------------------------------------------------- fast unit tests
def _skipped(*cells: tuple[str, str]) -> list[int]:
    """The code cells nbgrader leaves out, of cells given as (kind, source): "given" (the course's own, as
    released), "learner" (written or edited by the learner) or "test" (a graded test cell)."""
    import nbformat

    from instructor.course import GIVEN
    from instructor.dataflow import cells_to_run

    nodes = []
    for kind, source in cells:
        meta = {"given": {GIVEN: True}, "learner": {}, "test": {"nbgrader": {"grade": True, "grade_id": "t"}}}[kind]
        nodes.append(nbformat.v4.new_code_cell(source, metadata=meta))
    runs = cells_to_run(nodes)
    return [i for i in range(len(nodes)) if i not in runs]


def test_the_analysis_of_which_cells_run_is_bounded():
    """Links between names grow with the square of one statement's targets: `(a0, ..., aN) = (b0, ..., bN)` in a
    cell that never runs, then many copies of a course cell, held an nbgrader worker 171 s before any cell ran
    (red-team round 18). The analysis stops at its budget and every cell runs; the course's own notebooks take
    under 1% of the budget."""
    import nbformat

    from instructor import dataflow
    from instructor.course import SOLUTIONS_DIR

    n = 1200
    a, b = ", ".join(f"a{i}" for i in range(n)), ", ".join(f"b{i}" for i in range(n))
    start = time.perf_counter()
    skipped = _skipped(
        ("given", "import torch\nmodel = torch.nn.Linear(2, 2)"),
        ("learner", f"if False:\n    ({a}) = ({b})\n    ({b}) = ({a})\n    model = a0"),
        *[("given", "import torch")] * 300,
        ("given", "x = torch.randn(3)\nprint(x.sum())"),
        ("test", "check(model)"),
    )
    assert skipped == [] and time.perf_counter() - start < 30
    # ... and a notebook of more code than MAX_CODE_CHARS is not read at all: every cell runs (a 6 MB list took 43 s)
    literal = "x = [" + "0, " * (dataflow.MAX_CODE_CHARS // 3) + "]"
    start = time.perf_counter()
    skipped = _skipped(
        ("given", "import torch\nmodel = torch.nn.Linear(2, 2)"),
        ("learner", literal),
        ("given", "y = torch.randn(3)\nprint(y.sum())"),
        ("test", "check(model)"),
    )
    assert skipped == [] and time.perf_counter() - start < 5
    for path in sorted(SOLUTIONS_DIR.glob("*.ipynb")):
        solution_nb = read_json(path)
        nb = nbformat.from_dict(normalise(solution_nb, solution_nb, path.stem)[0])
        code = [c for c in nb.cells if c.cell_type == "code"]
        trees = {i: ast.parse(c.source) for i, c in enumerate(code) if not c.source.lstrip().startswith("%")}
        dataflow._live(code, trees, dataflow._Budget(dataflow.MAX_STEPS // 100))  # raises if it takes more


def test_grading_leaves_out_only_the_course_demonstrations_no_graded_cell_needs():
    # a demonstration, and a cycle of two that only need each other: left out, as is everything after the last test
    assert _skipped(
        ("given", "import torch\nmodel = torch.nn.Linear(2, 2)"),
        ("given", "x = torch.randn(3)\nprint(x.sum())"),
        ("given", "def f():\n    return g_value\nf_value = 1"),
        ("given", "def g():\n    return f_value\ng_value = 2"),
        ("test", "check(model)"),
        ("given", "model.eval()"),
        ("learner", "print('after the last test')"),
    ) == [1, 2, 3, 5, 6]
    # the cells that may change what a later cell reads all run
    assert _skipped(
        ("given", "import torch\nmodel = torch.nn.Linear(2, 2)\nN = 3"),
        ("given", "model.eval()"),  # a method called on it
        ("given", "train(model, steps=N)"),  # an argument of a call
        ("given", "torch.set_default_dtype(torch.float64)"),  # a module's setting
        ("given", "torch.manual_seed(0)"),  # a seed: only which numbers come next
        ("given", "cfg = {'n': 2}\ncfg['n'] = 4"),
        ("test", "check(model, cfg)"),
    ) == [4]
    # a learner's function reads a global when it is called: the course's cell that binds it runs, wherever it is
    assert _skipped(
        ("learner", "def solution(x):\n    return x * SCALE"),
        ("given", "SCALE = 2"),
        ("given", "UNUSED = 3"),
        ("test", "check(solution)"),
    ) == [2]
    # a magic or a dynamic read hides what is read: every cell before it runs
    for hidden in ("%time y = helper()", "value = globals()['helper']()", "import sys\nsys.modules['__main__']"):
        assert _skipped(("given", "helper = lambda: 1"), ("learner", hidden), ("test", "check()")) == []
    # the learner's own cells always run; an edited course cell is the learner's
    assert _skipped(("learner", "print('mine')"), ("test", "check()")) == []
    # a static review's cases: a function reads a global when it is called, after another cell bound it again;
    # changes through an alias or an optimiser; a walrus; a file written; names read or bound dynamically in a body
    assert _skipped(("learner", "X = 1\ndef f():\n    return X"), ("given", "X = 2"), ("test", "check(f)")) == []
    for given in (
        ("w = model.weight", "w.data.zero_()"),
        ("opt = torch.optim.SGD(model.parameters(), lr=1.0)", "model(x).sum().backward()\nopt.step()"),
        ("layers = [model]", "for layer in layers:\n    layer.eval()"),
        ("print(n := 5)",),
        ("model.double()",),  # a module's `double` and `to` change it in place, a tensor's do not: counted
        ("layers = [model]\nlayers.sort(key=id)\nlayers[0].train(False)",),
        ("torch.save(model, 'm.pt')",),
        ("open('data.txt', 'w').write('1')",),
    ):
        cells = [("learner", "import torch\nmodel = torch.nn.Linear(2, 2)\nx = torch.ones(2)\nn = 0")]
        cells += [("given", g) for g in given] + [("test", "check(model, n)")]
        assert _skipped(*cells) == [], given
    for body in (
        "return globals()['late']",
        "global late\n    late = 1\n    return late",
        "import __main__\n    return __main__.late",
    ):
        assert _skipped(("learner", f"def f():\n    {body}"), ("given", "late = 2"), ("test", "check(f)")) == []
    # an attribute or item set, or deleted, in a cell of its own changes the object (these ran nowhere before)
    for change in ("model.weight = None", "model.weight[0] = 1.0", "del model.bias", "table['n'] = 4"):
        cells = [("given", "import torch\nmodel = torch.nn.Linear(2, 2)\ntable = {}"), ("given", change)]
        assert _skipped(*cells, ("test", "check(model, table)")) == [], change
    # what no call can change: a number bound once (`EOT = 50256`) passed to the learner's function, a library's
    # class whose method made an object (`Config.from_reference(...)`), a class called to make a new model. 07's
    # demonstrations all ran for these three, 10 s of its run
    setup = "import torch\nfrom lib import Config\nEOT = 2\ncfg = Config.make(3)\nmodel = Model(cfg).eval()"
    learner = "class Mine(Model):\n    def forward(self, x, c: Config, eos=EOT):\n        return x"
    for demo in ("generate(model, eos_token_id=EOT)", "cached = Model(cfg).eval()\ncached(torch.ones(2))"):
        cells = [("given", setup), ("learner", learner), ("given", demo), ("test", "check(Mine)")]
        assert _skipped(*cells) == [2], demo
    # ... but a name bound to anything else anywhere is not such a number, and one a learner's cell binds is theirs
    for other in ("EOT = [2]", "for EOT in range(3):\n    pass", "from lib import EOT"):
        cells = [("given", setup), ("given", other), ("learner", learner), ("given", "generate(model, EOT)")]
        assert 3 not in _skipped(*cells, ("test", "check(Mine)")), other
    cells = [("given", setup), ("learner", "Config = dict(Config.__dict__)\n" + learner), ("given", "cfg.n = 2")]
    assert _skipped(*cells, ("test", "check(Mine)")) == [], "a name the learner binds"
    # red-team round 52: an imported object, not a class, changed through an alias; a method called on what a
    # function returned, which may be the function's cached object
    for imported, alias, change, reads in (
        ("FAST_CONFIG", "cfg = FAST_CONFIG", "cfg.n_ctx = 8", "FAST_CONFIG.n_ctx"),
        ("shared_list", "items = shared_list", "items.append(1)", "len(shared_list)"),
    ):
        cells = [("given", f"from lib import {imported}\n{alias}"), ("learner", f"def f():\n    return {reads}")]
        assert _skipped(*cells, ("given", change), ("test", "check(f)")) == [], imported
    cached = "import functools, torch\n@functools.cache\ndef mask(n):\n    return torch.ones(n, n).tril()\n"
    cells = [("learner", cached + "def g(n):\n    return mask(n)"), ("given", "mask(4).zero_()")]
    assert _skipped(*cells, ("test", "check(g)")) == [], "a method on a function's cached result"
    # a cell too deep for the analysis leaves nothing out
    assert _skipped(("given", "unused = 1"), ("learner", "x = " + "1 + " * 600 + "1"), ("test", "check()")) == []


def test_a_worker_warms_the_feedback_pages_once(tmp_path):
    """The worker makes one page of the course's own before any submission's (`offline_html.warm_feedback`): the
    feedback templates are then compiled, for every page's child to start with. It fails silently in the worker (a
    page's child then does the work itself), so it is run here."""
    from nbgrader.apps import NbGraderAPI

    from instructor.course import nbgrader_config
    from instructor.offline_html import _COMPILED, warm_feedback

    warm_feedback(NbGraderAPI(config=nbgrader_config(60, 600, tmp_path, None)))
    assert len(_COMPILED.store) >= 3  # the feedback template and those it extends


def test_the_names_taken_for_classes_in_the_course_are_classes():
    """nbgrader's run takes a name the course's cells import with a class's name (CapWords) for a class, which what
    is made from it does not share (`dataflow._library_names`): each such name in the solutions is one."""
    import importlib

    from instructor import dataflow
    from instructor.course import SOLUTIONS_DIR

    seen = set()
    for path in sorted(SOLUTIONS_DIR.glob("*.ipynb")):
        for cell in read_json(path)["cells"]:
            if cell["cell_type"] != "code":
                continue
            try:
                tree = ast.parse(cell_source(cell))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for alias in node.names:
                        if dataflow._class_like(alias.asname or alias.name):
                            value = getattr(importlib.import_module(node.module), alias.name)
                            assert isinstance(value, type), (path.stem, node.module, alias.name, type(value))
                            seen.add(alias.name)
    assert {"Config", "Tensor", "Float"} <= seen, sorted(seen)


def test_a_cell_under_time_or_capture_defines_what_it_holds():
    from instructor.plan import ipython_to_python

    assert ipython_to_python("%%time\nclass A:\n    pass\n") == "class A:\n    pass\n"
    assert "run_cell_magic('bash'" in ipython_to_python("%%bash\nls\n")
    # `%%prun` with its options, and a magic under lines of spaces, which IPython drops (red-team round 37: both
    # honest cells lost their points)
    assert ipython_to_python("%%prun -s cumulative -q -l 1\nclass A:\n    pass\n") == "class A:\n    pass\n"
    assert ipython_to_python("  \n\t\n%%time\nclass A:\n    pass\n") == "class A:\n    pass\n"
    assert "run_cell_magic('timeit'" in ipython_to_python("%%timeit\nclass A:\n    pass\n")  # a namespace of its own


def test_honest_code_is_never_refused_by_what_it_names():
    """Nothing in a learner's cell is refused for the modules or names it uses (`import sys`, `inspect`, `globals()`,
    `__class__`, TransformerLens): its definitions all reach the probe child, where only what they run counts."""
    sol = solution(LN)
    nb = copy.deepcopy(sol)
    helper = "import sys\nimport inspect\n\ndef centre(x):\n    return x - x.mean(-1, keepdim=True)\n"
    nb["cells"].insert(index_of(nb, "layernorm"), code_cell(helper))
    text = cell_source(nb["cells"][index_of(nb, "layernorm")])
    set_source(nb, "layernorm", "from transformer_lens import HookedTransformer\n" + text)
    plan = build_plan(sol, nb, LN)
    steps = [s for s in plan["steps"] if s["kind"] == "learner"]
    assert "import sys" in steps[0]["code"] and "import inspect" in steps[0]["code"], steps[0]
    assert "HookedTransformer" in steps[1]["code"] and not steps[1].get("error"), steps[1]


def test_definitions_only_drops_top_level_actions():
    tree, dropped = definitions_only(ast.parse("import torch\ntorch.allclose = None\nX = 1\nprint(X)\ndef f(): pass"))
    assert [line for line in ast.unparse(tree).splitlines() if line] == [
        "import torch",
        "X = 1",
        "def f():",
        "    pass",
    ]
    assert len(dropped) == 2


def test_definitions_only_keeps_what_makes_a_helper_module_or_a_definition():
    """Honest code red-team round 11 saw dropped as actions (the exercise then scored 0): a helper module written
    from text with `open` or `Path.write_text` and imported, one registered in `sys.modules`, a function that only
    defines globals and is called, a custom operator's bare `register_autograd`. Not what only looks like them."""
    kept_code = {
        "with open('h.py', 'w') as f:\n    f.write(SRC)\n    print('x = 1', file=f)",
        "Path('h.py').write_text(textwrap.dedent(SRC))",
        "open('h.py', 'w').write(SRC)",
        "sys.modules['h'] = module",
        "sys.path.insert(0, 'helpers')",
        "def _define():\n    global LayerNorm\n    class LayerNorm:\n        pass\n_define()",
        "_op.register_autograd(_backward, setup_context=_setup)",
    }
    dropped_code = {
        "with open('h.py', 'w') as f:\n    f.write(train())",
        "with open('log.txt', 'w') as f:\n    train(f)",
        "Path('log.txt').write_text(str(train()))",
        "def _go():\n    global model\n    model = train()\n_go()",
        "model.forward = train()",
        "other.register_autograd(_backward)",
    }
    own = frozenset({"_op", "_backward", "_setup"})
    for code in kept_code:
        tree, dropped = definitions_only(ast.parse(code), own)
        assert not dropped, (code, dropped)
    for code in dropped_code:
        tree, dropped = definitions_only(ast.parse(code), own)
        assert dropped, (code, ast.unparse(tree))


def test_definitions_only_keeps_a_table_the_cell_fills_in():
    """A table of constants built up at top level, also by a loop (red-team reviews: an honest gelu_new reading
    `C["sqrt_2_over_pi"]` lost 04's points while these were dropped as actions, then one whose table a `for` filled
    in); not a library's names, nor a loop that only acts."""
    code = (
        "import math\nimport torch\nC = {}\nC['sqrt_2_over_pi'] = math.sqrt(2 / math.pi)\nC.update(k=0.044715)\n"
        "ROWS = []\nROWS.append(1)\nROWS += [2]\nN = 0\nN += 1\ntorch.allclose = None\nmath.pi = 3\n"
        "for i in (3, 4, 5):\n    ROWS.append(i)\n    print(i)\n    if i == 4:\n        break\n"
        "for name, value in (('cubic', 0.044715),):\n    C[name] = value\n"
        "for key, value in sorted({'b': 2, 'a': 1}.items()):\n    C[key] = value\n"
        "while len(ROWS) < 9:\n    ROWS.append(0)\n"
        "for step in range(3):\n    ROWS.append(train_step())\n    continue\n"
        "for batch in loader:\n    ROWS.append(batch)\n"
        "steps = range(10**9)\nfor step in steps:\n    ROWS.append(model(step))\nprint(C)\n"
    )
    tree, dropped = definitions_only(ast.parse(code))
    kept = ast.unparse(tree)
    for line in ("C['sqrt_2_over_pi'] = ", "C.update(k=0.044715)", "ROWS.append(1)", "ROWS += [2]", "N += 1"):
        assert line in kept, kept
    assert "torch.allclose" not in kept and "math.pi = 3" not in kept and "print" not in kept
    assert "for step" not in kept and "train_step" not in kept and "loader" not in kept
    namespace = {}
    exec(compile(tree, "<test>", "exec"), namespace)  # noqa: S102 - what the probe child would run
    assert namespace["C"]["cubic"] == 0.044715 and namespace["C"]["b"] == 2
    assert namespace["ROWS"] == [1, 2, 3, 4, 0, 0, 0, 0, 0]  # `break` kept, then the `while` that fills the table
    # torch.allclose, math.pi, print(i), the loops over a range that train and over a loader, and a name bound to a
    # range that runs a model (a training run in an added cell would run in every phase), print(C)
    assert len(dropped) == 7, dropped
    # ... a loop over a range of constants that only computes a table's entries with builtins and modules' functions
    # (an honest table filled in by `for i in range(...)` lost its points while every such loop was dropped); not
    # one that calls the notebook's functions, a method of another object, fills nothing, or runs 100,000 steps or
    # more (a page-by-page fill of 3 GB of shared memory, which killed the kernel, then killed the judge's child)
    code = (
        "import itertools\nimport math\nimport torch\nT = torch.zeros(8)\nPAIRS = []\nLOSSES = []\n"
        "for i in range(8):\n    x = i / 7\n    if i % 2:\n        T[i] = math.exp(-x)\n    else:\n"
        "        T[i] += abs(-x)\n"
        "for a, b in itertools.product(range(2), range(3)):\n    PAIRS.append((a, b))\n"
        "for step in range(3):\n    loss = step_fn()\n    LOSSES.append(loss)\n"
        "for _ in range(5):\n    opt.step()\n    LOSSES.append(0)\n"
        "for i in range(3):\n    LOSSES.append(x.item())\n"
        "for i in range(3):\n    print(i)\n"
        "for i in range(3):\n    LOSSES.append(eval('1'))\n"
        "for i in range(0, 3 << 30, 4096):\n    T[i] = 1\n"  # 786,432 steps: a memory fill, not a table
        "for i in range(len(PAIRS)):\n    T[7] += 1\n"  # a length not written in the code: bounded where it runs
        "for a, b in helper.product(range(2), range(2)):\n    LOSSES.append(a)\n"  # not itertools': code of its own
    )
    tree, dropped = definitions_only(ast.parse(code))
    kept = ast.unparse(tree)
    assert "T[i] = math.exp(-x)" in kept and "PAIRS.append((a, b))" in kept, kept
    assert "LOSSES.append" not in kept and "print" not in kept and "3 << 30" not in kept and len(dropped) == 7, dropped
    namespace = {}
    exec(compile(tree, "<test>", "exec"), namespace)  # noqa: S102 - what the probe child would run
    assert math.isclose(namespace["T"][3].item(), math.exp(-3 / 7), rel_tol=1e-6)
    assert math.isclose(namespace["T"][2].item(), 2 / 7, rel_tol=1e-6)
    assert math.isclose(namespace["T"][7].item(), math.exp(-1) + 6, rel_tol=1e-6)  # once for each of PAIRS's 6
    assert namespace["PAIRS"] == [(a, b) for a in range(2) for b in range(3)]
    # ... a starred target, and a cache made where a bare name raises NameError (a red-team review: both dropped)
    code = "MEAN_DIM, *NOTES = (-1, 'over d_model')\ntry:\n    _CACHE\nexcept NameError:\n    _CACHE = {}\n"
    tree, dropped = definitions_only(ast.parse(code))
    assert "MEAN_DIM, *NOTES = " in ast.unparse(tree) and "_CACHE = {}" in ast.unparse(tree) and not dropped


def test_a_kept_loop_of_no_written_length_is_stopped_where_it_runs():
    """A `while`, or a loop over the learner's own data, that only computes a table is honest (a table of GELU's
    constants filled in by `while k < n` lost its points until now), but its length is not in the code: it is kept, and
    stopped after MAX_TABLE_STEPS steps where it runs, its inner loops' included, with a message that says so.
    One that calls anything but builtins, modules' functions and the table's fills is still an action."""
    from instructor.plan import MAX_TABLE_STEPS

    code = (
        "import math\nC = {}\nk = 0\nwhile k < 4:\n    C[k] = math.tanh(k)\n    k += 1\n"
        "ROWS = [3, 1]\nTOTAL = []\nfor r in sorted(ROWS * 2):\n    j = 0\n    while j < r:\n        TOTAL.append(j)\n"
        "        j += 1\n"
        "FOREVER = []\nwhile True:\n    FOREVER.append(0)\n"
        "NESTED = []\nfor a in range(len(ROWS) * 400):\n    for b in range(len(ROWS) * 400):\n        NESTED.append(0)\n"
        "AFTER = 1\n"
        "while not done():\n    TOTAL.append(0)\n"
        "while True:\n    opt.step()\n    TOTAL.append(1)\n"
    )
    tree, dropped = definitions_only(ast.parse(code))
    assert [line.split(":")[0] for line in dropped] == ["line 22", "line 24"], dropped
    namespace, raised = {}, []
    for stmt in tree.body:  # the child runs a cell's kept statements so; one that raises fails alone
        try:
            exec(compile(ast.Module([stmt], []), "<test>", "exec"), namespace)  # noqa: S102 - as the probe child would
        except RuntimeError as err:
            raised.append(str(err))
    assert namespace["C"] == {k: math.tanh(k) for k in range(4)}
    assert namespace["TOTAL"] == [0, 0, 0, 1, 2, 0, 1, 2]
    assert len(namespace["FOREVER"]) == MAX_TABLE_STEPS and len(namespace["NESTED"]) < MAX_TABLE_STEPS
    assert namespace["AFTER"] == 1 and len(raised) == 2, raised
    assert all(f"ran past {MAX_TABLE_STEPS:,} steps" in message for message in raised)


def test_definitions_only_keeps_definitions_made_under_an_if_a_try_or_a_with():
    import torch

    code = (
        "if torch.cuda.is_available():\n    DEVICE = 'cuda'\n    print('gpu')\nelse:\n    DEVICE = 'cpu'\n"
        "try:\n    from einops import reduce\nexcept ImportError:\n    reduce = None\n    print('none')\n"
        "with torch.no_grad():\n    W = torch.ones(3)\n"
        "if DEBUG:\n    print(1)\nfor i in (0, 1, 2):\n    X = i\nfor i in [0, 1]:\n    print(i)\n"
    )
    tree, dropped = definitions_only(ast.parse(code))
    namespace = {"torch": torch}
    exec(compile(tree, "<test>", "exec"), namespace)  # noqa: S102 - what the probe child would run
    assert namespace["DEVICE"] == "cpu" and namespace["reduce"] is not None and "W" in namespace
    assert "X" not in namespace and "print" not in ast.unparse(tree)
    # two prints, the `if DEBUG`, the loop that binds a name of its own (an action, whatever it walks: a red-team
    # review's `h = train(...)`) and the loop that only prints
    assert len(dropped) == 5
    # a `try` whose body holds an action is dropped whole: without the action its definitions would always run
    tree, dropped = definitions_only(ast.parse("try:\n    connect()\n    X = None\nexcept OSError:\n    X = 1\n"))
    assert not tree.body and len(dropped) == 1
    # ... and under a `match` (red-team round 10: an honest gelu_new defined in a `case` scored 0)
    code = (
        "match MODE:\n    case 'tanh':\n        def gelu(x):\n            return 'tanh'\n        print('tanh')\n"
        "    case _:\n        raise ValueError(MODE)\n"
    )
    tree, dropped = definitions_only(ast.parse(code))
    namespace = {"MODE": "tanh"}
    exec(compile(tree, "<test>", "exec"), namespace)  # noqa: S102 - what the probe child would run
    assert namespace["gelu"](0) == "tanh" and len(dropped) == 2, dropped  # the print and the raise


def test_definitions_only_keeps_what_an_assignment_binds_however_it_is_written():
    """Red-team round 18's honest variants, each dropped as an action (its exercise then scored 0): a walrus inside
    a print, an assert or an `if` that defines nothing; a name and a table entry bound at once; methods set on the
    notebook's class as a tuple; an annotated class attribute. The action around a walrus is still dropped, and a
    store into something the notebook does not own is still an action."""
    import math

    code = (
        "C = {}\n"
        "print(f'{(GELU_C := math.sqrt(2 / math.pi)):.6f}')\n"
        "assert (K := 3) == 3\n"
        "if (J := K + 1):\n    pass\n"
        "BASE = C['base'] = 10000.0\n"
        "def _f(self):\n    return 'f'\n"
        "LayerNorm.forward, LayerNorm.extra_repr = _f, _f\n"
        "LayerNorm.eps: float = 1e-5\n"
        "other.x = train()\n"
        "print([(q := i) for i in range(3)])\n"
    )
    tree, dropped = definitions_only(ast.parse(code), frozenset({"LayerNorm", "_f"}))
    namespace = {"math": math, "LayerNorm": type("LayerNorm", (), {})}
    exec(compile(tree, "<test>", "exec"), namespace)  # noqa: S102 - what the probe child would run
    assert namespace["GELU_C"] == math.sqrt(2 / math.pi) and (namespace["K"], namespace["J"]) == (3, 4)
    assert namespace["BASE"] == namespace["C"]["base"] == 10000.0
    cls = namespace["LayerNorm"]
    assert cls.forward is cls.extra_repr is namespace["_f"] and cls.eps == 1e-5
    assert "print" not in ast.unparse(tree) and "assert" not in ast.unparse(tree) and "train" not in ast.unparse(tree)
    assert "q" not in namespace  # a comprehension's walrus binds only when the comprehension runs
    # a walrus that may not run where it is is not lifted: `f` would be called where the cell never called it
    code = "print(OK and (k := f()))\nprint((m := f()) if OK else 0)\nprint(0 if (n := 1) else 2)\n"
    lifted, _ = definitions_only(ast.parse(code))
    assert ast.unparse(lifted) == "n = 1", ast.unparse(lifted)
    assert len(dropped) == 5, dropped  # the print, the assert, the if, `other.x = ...` and the second print


def test_the_plan_keeps_an_action_whose_change_a_kept_definition_reads():
    """Red-team round 19's honest variants, each an exercise that scored 0: a call that fills what a kept statement
    or an exercise reads (a registry's `register`, a helper that fills a table, `operator.setitem`, a bound
    `setdefault`), one that names a namespace (`globals()`, `sys.modules`, `__main__`, `vars()`), and a `with` whose
    context publishes what its body put in the object it bound. An action nothing kept reads stays dropped: a print,
    a module's attribute set, a training call, a training loop, even on what the exercise reads."""
    cases = {
        "registry": "class R:\n    def __init__(self):\n        self.d = {}\n    def register(self, k, f):\n"
        "        self.d[k] = f\n    def get(self, k):\n        return self.d[k]\nA = R()\nA.register('gelu_new', _g)\n"
        "gelu_new = A.get('gelu_new')",
        "helper": "T = {}\ndef reg(f):\n    T[f.__name__] = f\n    return f\nreg(_g)\ngelu_new = T['_g']",
        "nested": "class R:\n    def __init__(self):\n        self.d = {}\n    def register(self, k, f):\n"
        "        self.d[k] = f\nA = R()\nif True:\n    def _h(x):\n        return x\n    A.register('gelu_new', _h)\n"
        "gelu_new = A.d['gelu_new']",
        # round 20: callables made from a namespace, and one that writes where no rule looks (the exercise's name
        # still bound by nothing kept: every statement of its cell but a loop runs)
        "closure": "def _publisher(ns):\n    def publish(obj, name):\n        ns[name] = obj\n    return publish\n"
        "publish = _publisher(globals())\nlist(map(publish, [_g], ['gelu_new']))",
        "decorator_call": "class Exporter:\n    def __init__(self, ns):\n        self.ns = ns\n    def __call__(self, name):\n"
        "        return lambda f: self.ns.__setitem__(name, f)\nexport = Exporter(globals())\nexport('gelu_new')(_g)",
        "partial": "import functools, operator\nsetter = functools.partial(operator.setitem, globals())\n"
        "setter('gelu_new', _g)",
        "unseen": "class Registrar:\n    def __call__(self, f, name):\n        import sys\n"
        "        setattr(sys.modules['__main__'], name, f)\n_registrar = Registrar()\n_registrar(_g, 'gelu_new')",
        "operator": "import operator\nT = {}\noperator.setitem(T, 'g', _g)\ngelu_new = T['g']",
        "bound_method": "T = {}\nadd = T.setdefault\nadd('g', _g)\ngelu_new = T['g']",
        "comprehension": "T = {}\n[T.update(g=_g) for _ in range(1)]\ngelu_new = T['g']",
        "installer": "def _install(src, ns):\n    exec(src, ns)\n_install('def gelu_new(x):\\n    return x', globals())",
        "sys_modules": "import sys\nsetattr(sys.modules[__name__], 'gelu_new', _g)",
        "main": "import __main__\n__main__.gelu_new = _g",
        "vars": "vars()['gelu_new'] = _g",
        "context": "import contextlib\n@contextlib.contextmanager\ndef building():\n    ns = {}\n    yield ns\n"
        "    globals().update(ns)\nwith building() as ns:\n    ns['gelu_new'] = _g",
    }
    notebook = "04_mlp_and_block"
    sol = solution(notebook)
    for case, code in cases.items():
        nb = set_source(copy.deepcopy(sol), "gelu_new", "def _g(x):\n    return x\n\n\n" + code)
        step = next(s for s in build_plan(sol, nb, notebook)["steps"] if s.get("exercise") == "gelu_new")
        assert not step["dropped"], (case, step["dropped"])
        namespace = {"__name__": "__main__"}
        sys.modules["__main__"].__dict__.pop("gelu_new", None)
        exec(compile(step["code"], "<plan>", "exec"), namespace)  # noqa: S102 - what the probe child would run
        found = namespace.get("gelu_new") or sys.modules["__main__"].__dict__.pop("gelu_new", None)
        assert found is not None and found(3) == 3, case
    actions = "print(gelu_new(1))\nimport torch\ntorch.allclose = None\nmodel = object()\ntrain(model)\n"
    actions += "for _ in range(3):\n    train(gelu_new)\n"
    # magics become `get_ipython()` calls, which name no namespace: a timed training run stays dropped
    actions += "%timeit train(model)\n!pip install nothing\n"
    nb = set_source(copy.deepcopy(sol), "gelu_new", "def gelu_new(x):\n    return x\n\n\n" + actions)
    step = next(s for s in build_plan(sol, nb, notebook)["steps"] if s.get("exercise") == "gelu_new")
    assert len(step["dropped"]) == 6, step["dropped"]


def test_a_statement_too_deep_to_analyse_is_left_out_alone():
    """One expression nested too deep for the plan's recursive analysis (900 `not`s, which Python runs) made the
    whole cell, and the dataflow of every other cell, give up: a registry beside it, which the exercise reads, was
    dropped, and an honest gelu_new scored 0 (red-team round 47). Only that statement is left out, and said so."""
    notebook = "04_mlp_and_block"
    sol = solution(notebook)
    registry = "_ACT = {'tanh': torch.tanh}\n_deep = " + "not " * 900 + "0\n"
    body = "def gelu_new(x):\n    return 0.5 * x * (1 + _ACT['tanh'](0.7978845608 * (x + 0.044715 * x**3)))\n"
    nb = insert_before(set_source(copy.deepcopy(sol), "gelu_new", body), "gelu_new", registry)
    plan = build_plan(sol, nb, notebook)
    code = "\n".join(s["code"] for s in plan["steps"] if s["kind"] == "learner")
    assert "_ACT = {" in code and "not not" not in code, code[:300]
    assert any("nested too deep to analyse" in n for n in plan["notes"]), plan["notes"]


def test_the_plans_dataflow_reads_each_statement_once(monkeypatch):
    """A chain of statements each needed by the next (`n_i.put(n_i+1)` in reverse order, read by a function through
    `n_0`) with a 250,000-element literal beside them took 204 s to plan while every round re-read every statement;
    planning is serial, so it held the whole batch 60 s a notebook (red-team round 20). Each statement is now read
    once, and the whole chain is kept."""
    from instructor import plan as plan_module

    calls = []
    may_change = plan_module._may_change
    monkeypatch.setattr(plan_module, "_may_change", lambda *a: calls.append(1) or may_change(*a))
    n = 300
    chain = "class Box:\n    def put(self, other):\n        self.other = other\n"
    chain += "".join(f"n_{i} = Box()\n" for i in range(n + 1))
    chain += "".join(f"n_{i}.put(n_{i + 1})\n" for i in reversed(range(n)))
    chain += "def _reads_chain():\n    return n_0\n[" + "0, " * 20_000 + "]\n"
    sol = solution(LN)
    nb = insert_after(copy.deepcopy(sol), "layernorm", chain)
    steps = [s for s in build_plan(sol, nb, LN)["steps"] if s["kind"] == "learner" and s["exercise"] is None]
    assert len(steps) == 1 and len(steps[0]["dropped"]) == 1, steps[0]["dropped"]  # only the literal
    assert len(calls) <= n + 10, len(calls)
    # ... and each name is followed once: 3,000 names each made from the one before, each changed, read through
    # the first (each statement following the whole chain again takes 4.5 million steps, past the budget)
    n = 3000
    chain = "class Box:\n    def put(self, value):\n        self.value = value\n"
    chain += "a_0 = Box()\n" + "".join(f"a_{i} = a_{i - 1}\n" for i in range(1, n + 1))
    chain += "".join(f"a_{i}.put({i})\n" for i in range(n + 1))
    chain += "def _reads_chain():\n    return a_0\n"
    nb = insert_after(copy.deepcopy(sol), "layernorm", chain)
    plan = build_plan(sol, nb, LN)
    steps = [s for s in plan["steps"] if s["kind"] == "learner" and s["exercise"] is None]
    assert not steps[0]["dropped"] and not any("stopped" in note for note in plan["notes"]), plan["notes"]


def test_planning_is_linear_in_a_cells_statements_and_counts_every_rewritten_magic():
    """80,000 plain assignments in one cell took over 75 s to plan while each statement copied the names bound
    before it, and 450 assigned magics (`x = %pwd`), which IPython's transformer rewrites one by one, each reading
    the whole cell again, were not counted as magics: each held the batch 60 s (red-team round 21)."""
    from instructor.plan import MAX_MAGICS, ipython_to_python

    sol = solution(LN)
    n = 40_000
    nb = insert_after(copy.deepcopy(sol), "layernorm", "".join(f"v{i} = {i}\n" for i in range(n)))
    start = time.perf_counter()
    steps = [s for s in build_plan(sol, nb, LN)["steps"] if s["kind"] == "learner" and s["exercise"] is None]
    assert not steps[0]["dropped"] and time.perf_counter() - start < 20  # quadratic, it took over 30 s
    for line in ("_m{} = %pwd", "_m{} = !ls", "/print {}", ",print a{}"):
        cell = "%pwd\n" + "".join(line.format(i) + "\n" for i in range(MAX_MAGICS + 1))
        with pytest.raises(SyntaxError, match="magic or shell lines"):
            ipython_to_python(cell)
    assert ipython_to_python("y = a % b\nx = a != b\ns = 'k = %d' % 3\n") == "y = a % b\nx = a != b\ns = 'k = %d' % 3\n"


def test_plan_finds_the_exercises_and_leaves_the_tests_out():
    sol = solution(LN)
    plan = build_plan(sol, sol, LN)
    kinds = [s["kind"] for s in plan["steps"]]
    assert "learner" in kinds and set(kinds) == {"given", "learner"}  # the judge's child runs no test cell
    assert plan["solutions"]["layernorm"]["found"]


def test_the_probe_process_runs_the_learners_definitions_and_the_given_cells_they_need_only():
    from instructor.template import probe_steps

    sol = solution("07_sampling_and_kv_cache")
    plan = build_plan(sol, sol, "07_sampling_and_kv_cache")
    steps = probe_steps(plan["steps"])
    assert {s["kind"] for s in steps} == {"given", "learner"}
    assert len([s for s in steps if s["kind"] == "learner"]) == len(plan["solutions"])
    given = [s for s in steps if s["kind"] == "given"]
    assert any("Attention" in s["binds"] for s in given)  # KVCacheAttention subclasses it
    assert len(given) < len([s for s in plan["steps"] if s["kind"] == "given"])  # demos and plots are not run


def test_the_plan_leaves_out_the_learners_cells_after_the_last_test():
    """No graded test runs after the notebook's last test cell, and nbgrader's run leaves such cells out: so does
    the plan (60 cells of 99,000 characters there, kept once the analysis's budget ran out, took 27 s of definitions
    in every phase: red-team round 27). A cell of the learner's before a test is still planned, and nothing is
    flagged for a learner's scratch cells."""
    sol = solution(LN)
    learner = copy.deepcopy(sol)
    tests = [
        nbgrader_meta(c)["grade_id"]
        for c in learner["cells"]
        if nbgrader_meta(c).get("grade_id", "").startswith("test_")
    ]
    learner["cells"] += [code_cell(f"_scratch_{i} = ({'0,' * 10})") for i in range(3)]
    insert_before(learner, tests[-1], "HELPER_BEFORE_THE_TEST = 1")
    plan = build_plan(sol, learner, LN)
    code = "\n".join(step.get("code", "") for step in plan["steps"])
    assert "HELPER_BEFORE_THE_TEST" in code and "_scratch_" not in code, code[-500:]
    assert not plan["notes"], plan["notes"]


def test_the_probe_processes_harness_holds_its_plain_parts_and_stands_in_for_the_rest(tmp_path):
    """`probe_harness` writes what the probe template's `harness` is: a package that imports and runs without the
    checks' or the reference's files, whose other public names raise when called."""
    import harness
    from instructor.template import PLAIN_HARNESS, probe_harness

    folder = tmp_path / "harness"
    folder.mkdir()
    for name, text in probe_harness(os.path.dirname(harness.__file__)).items():
        (folder / name).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["__init__.py", *(f"{m}.py" for m in PLAIN_HARNESS)])
    code = (
        "import harness\n"
        "assert harness.Config(d_model=8).d_model == 8 and callable(harness.components)\n"
        "from harness import Config, rand_float_test\n"
        "try:\n    rand_float_test(None, None)\nexcept RuntimeError as err:\n    print(err)\n"
        "try:\n    harness.sampling_checks\nexcept AttributeError as err:\n    print('AttributeError')\n"
    )
    run = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); exec({code!r})"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "harness.rand_float_test is not available while the judge runs your code",
        "AttributeError",
    ], run.stdout


def test_normalise_restores_a_deleted_test_and_fixes_ids():
    release = read_json(REPO_ROOT / "solutions" / f"{LN}.ipynb")  # stands in for the release: same metadata
    learner = as_colab(release)
    del learner["cells"][index_of(learner, "test_layernorm")]
    nb, flags = normalise(learner, release, LN)
    assert any("test_layernorm was missing" in f for f in flags)
    ids = [c["id"] for c in nb["cells"]]
    assert len(set(ids)) == len(ids)
    assert nb["metadata"]["kernelspec"] == release["metadata"]["kernelspec"]
    assert all(c.get("outputs", []) == [] for c in nb["cells"])


# ---------------------------------------------------------------------- the sandbox (issue #14)
@needs_sandbox
@pytest.mark.parametrize("student", sorted(SANDBOX_CHEATS))
def test_cheats_in_the_learners_process_score_zero(graded, student):
    rows = check_expected(graded, student)
    verdicts = json.loads((graded["out"] / "course" / "judge" / student / f"{LN}.judge.json").read_text())
    verdict = verdicts["verdicts"]["test_layernorm"]
    assert verdict["passed"] is False and SANDBOX_CHEATS[student] in verdict["message"], verdict
    if float(rows[0]["nbgrader_score"]) > 0:  # nbgrader's run was fooled: flagged
        assert "the judge outside the sandbox failed it" in rows[0]["flags"], rows


@needs_sandbox
def test_the_judge_alone_refuses_an_exercise_that_computes_in_a_thread(graded):
    """Where an exercise hands a forbidden call to a thread, the judge's probe fails by itself: what the rules forbid
    is out of the child's process for every thread (an honest exercise may compute in a thread: `unusual_honest_4`;
    no process can start there)."""
    verdicts = json.loads((graded["out"] / "course" / "judge" / "thread_forward" / f"{LN}.judge.json").read_text())
    verdict = verdicts["verdicts"]["test_layernorm"]
    assert verdict["passed"] is False and "forbids layer_norm" in verdict["message"], verdict


PROBE_VIEW = """
import json, os, sys
from instructor.template import HIDDEN_PACKAGES, _package_dirs, hide_oracles
KIND, NOTEBOOK = sys.argv[1:3]
folders = {name: _package_dirs(name)[0] for name in ("harness", *HIDDEN_PACKAGES)}
hide_oracles(KIND)
import harness
seen = {name: sorted(set(os.listdir(folder)) - {"__pycache__"}) for name, folder in folders.items()}
try:
    harness.load_reference_gpt2()
except RuntimeError as err:
    seen["load_reference_gpt2"] = str(err)
seen["imported"] = sorted(m for m in ("transformer_lens", "transformers", "harness.checks") if m in sys.modules)
from instructor.template import _ANSWERS, _answers_from
_answers_from(os.path.join(os.getcwd(), "solutions"), before=NOTEBOOK)  # as a probe child for NOTEBOOK does
seen["answers"] = sorted(_ANSWERS)
try:
    harness.components(NOTEBOOK)
except (FileNotFoundError, ValueError) as err:
    seen["own answers"] = str(err)
import torch
import torch._refs
from instructor.template import cover_sources
cover_sources(KIND)  # as the probe template does once it has imported what its children use
functional, refs = torch.nn.functional.__file__, torch._refs.__file__
seen["covered"] = {name: len(open(path).read()) for name, path in (("functional", functional), ("refs", refs))}
seen["covered"]["_decomp"] = os.listdir(os.path.join(os.path.dirname(refs), "..", "_decomp"))
if KIND == "transformer_lens":
    import transformer_lens.patching
    seen["covered"]["patching"] = len(open(transformer_lens.patching.__file__).read())
site = os.path.dirname(os.path.dirname(torch.__file__))
seen["packages"] = {name: len(os.listdir(os.path.join(site, name))) for name in ("ray", "accelerate", "tqdm", "numpy")}
try:
    import ray
    seen["import ray"] = "imported"
except ModuleNotFoundError:  # as if not installed: a library probing for an optional one carries on
    seen["import ray"] = "ModuleNotFoundError"
print(json.dumps(seen))
"""


@needs_sandbox
@pytest.mark.parametrize("kind, notebook", [("plain", "03_attention"), ("transformer_lens", "08_interpretability")])
def test_the_judges_probes_run_where_no_oracle_exists(kind, notebook):
    """What a probe template sees once it has hidden the oracles (in a mount namespace of its own, as it does
    before importing anything of the course): of harness only its plain modules, the reference model's loader a
    stand-in that raises, the answers of earlier notebooks only; TransformerLens's and transformers' folders empty,
    but in the template of notebook 08, whose exercises are to use TransformerLens's model."""
    run = subprocess.run(
        [sys.executable, "-c", PROBE_VIEW, kind, notebook],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    plain = ["__init__.py", "config.py", "course.py", "tokenizer.py"]
    # no library but those learners write exercises with (and what they need) is there: ray's RLlib carries minGPT's
    # attention and GELU, which scored full marks in 03 and 04 while only named libraries were hidden
    assert seen["packages"]["ray"] == 0 and seen["packages"]["tqdm"] and seen["packages"]["numpy"], seen
    assert seen["import ray"] == "ModuleNotFoundError", seen
    assert (seen["packages"]["accelerate"] == 0) == (kind == "plain"), seen  # TransformerLens needs it in 08's
    if kind == "plain":
        assert seen["harness"] == plain, seen
        assert seen["transformer_lens"] == [] and seen["transformers"] == [], seen
    else:
        assert seen["harness"] == sorted([*plain, "interp.py"]), seen
        assert "HookedTransformer.py" in seen["transformer_lens"] and seen["transformers"], seen
    assert "not available while the judge runs your code" in seen["load_reference_gpt2"], seen
    assert seen["imported"] == [], seen
    # the files of code the rules forbid read as empty (their modules, imported before, still run); a folder
    # every probe is refused is empty
    assert seen["covered"] == {
        "functional": 0,
        "refs": 0,
        "_decomp": [],
        **({"patching": 0} if kind != "plain" else {}),
    }
    # a probe child reads the answers of the notebooks before its own, and no other (its own included)
    assert seen["answers"] == [n for n in notebook_names() if n < notebook], seen
    assert f"Unknown notebook '{notebook}'" in seen["own answers"], seen
    assert os.listdir(os.path.join(REPO_ROOT, "harness")) != seen["harness"]  # this process's view is untouched


CHILDREN_TALK = """
import os, socket, time
from instructor.sandbox import Confinement

confinement = Confinement(None, None, [])
read, write = os.pipe()
if os.fork() == 0:  # one child listens on loopback and on an abstract Unix socket
    confinement.enter(confinement.next_slot(), 0, keep=(write,))
    for family, address in ((socket.AF_INET, ("127.0.0.1", 7777)), (socket.AF_UNIX, "\\0tfs-answers")):
        server = socket.socket(family)
        server.bind(address)
        server.listen(1)
        os.write(write, b"listening ")
    time.sleep(3)
    os._exit(0)
time.sleep(1.5)
print(os.read(read, 100).decode())
confinement.enter(confinement.next_slot(), 0)  # another child tries both
for family, address in ((socket.AF_INET, ("127.0.0.1", 7777)), (socket.AF_UNIX, "\\0tfs-answers")):
    try:
        socket.socket(family).connect(address)
        print("CONNECTED", family)
    except OSError as err:
        print("refused", err.errno)
"""


@needs_sandbox
def test_no_child_can_reach_another_over_the_network():
    """Every child has a network namespace of its own, with no interface up: a kernel (which holds the oracles)
    cannot serve answers to a judge's probe over loopback or an abstract Unix socket."""
    run = subprocess.run(
        ["bwrap", "--dev-bind", "/", "/", "--unshare-net", "--unshare-pid", sys.executable, "-c", CHILDREN_TALK],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "listening listening" in run.stdout and "CONNECTED" not in run.stdout, run.stdout
    assert run.stdout.count("refused") == 2, run.stdout


@needs_sandbox
def test_sandbox_hides_the_answers_and_the_outputs_and_the_grader(graded):
    rows = check_expected(graded, "reach_out")
    text = (graded["out"] / "course" / "autograded" / "reach_out" / LN / f"{LN}.ipynb").read_text()
    reach = text[text.index("REACH:") :].split("\\n")[0]
    assert "READABLE" not in reach and "KILLED" not in reach, reach
    shared = (graded["out"] / "course" / "autograded" / "reach_out" / EMB / f"{EMB}.ipynb").read_text()
    assert "SURVIVED" not in shared  # the memory cgroup counts shared memory: the kernel was stopped
    assert all("DeadKernelError" in r["flags"] for r in rows if r["notebook"] == EMB), rows


def test_output_right_only_under_the_harness_fails_the_judge_and_is_flagged(graded):
    """The judge runs the learner's LayerNorm on fresh inputs and weights and compares outside the sandbox."""
    (row,) = check_expected(graded, "harness_aware")
    assert row["nbgrader_score"] == row["max_score"] and row["judge"] == "failed", row  # nbgrader's run fooled
    assert row["judge"] == "failed" and float(row["score"]) == 0, row
    assert "output differs from the course's LayerNorm on fresh inputs" in row["reason"], row
    assert "nbgrader's run passed it but the judge outside the sandbox failed it" in row["flags"], row
    verdicts = json.loads((graded["out"] / "course" / "judge" / "harness_aware" / f"{LN}.judge.json").read_text())
    assert verdicts["verdicts"]["test_layernorm"]["passed"] is False


def _output_of(graded, student, marker):
    text = (graded["out"] / "course" / "autograded" / student / LN / f"{LN}.ipynb").read_text()
    assert marker in text, text[-2000:]
    return text[text.index(marker) :].split("\\n")[0]


@needs_sandbox
def test_students_share_no_writable_place(graded):
    """Nothing one kernel writes is seen by another: no start-up script runs elsewhere, no file is found."""
    for student in ("zz_planter", "zz_seeker", "zz_filler", "zz_forker"):
        check_expected(graded, student)
    assert "planted" in _output_of(graded, "zz_planter", "planted")
    assert _output_of(graded, "zz_seeker", "SEEN: [") == "SEEN: []"  # its printed line, not the code
    for path in (graded["out"] / "course" / "autograded").glob("*/*/*.ipynb"):
        assert "PLANTED" not in path.read_text(), path


@needs_sandbox
def test_one_student_cannot_fill_the_disk_or_the_process_table(graded):
    """A kernel's sockets' folder is a tmpfs of its nbgrader process's, memory charged to the writer (16 MB and
    4,096 inodes); a child's processes are capped (pids cgroup) and it has a cpu cgroup of its own (a fair share of the CPU)."""
    text = (graded["out"] / "course" / "autograded" / "zz_filler" / LN / f"{LN}.ipynb").read_text()
    filled = re.search(r"FILLED (\d+) MiB", text)
    assert filled is None or int(filled.group(1)) < 2048, text[-2000:]  # no line: the kernel was stopped
    # its own sockets' folder is a small tmpfs of its own: its inodes run out there, nowhere the grader or another
    # kernel writes (every other student here was graded as expected)
    made = re.search(r"INODES (\d+)", text)
    assert made is not None and int(made.group(1)) < 5000, text[-2000:]
    from instructor.sandbox import CHILD_PIDS

    forked = _output_of(graded, "zz_forker", "FORKED").split()
    assert 0 < int(forked[1]) < CHILD_PIDS and forked[2] == "REFUSED", forked  # the pids cgroup refused the rest
    cgroups = _output_of(graded, "zz_forker", "CGROUPS")
    assert re.search(r"pids:\S*/c\d+", cgroups) and re.search(r"cpu\S*:\S*/c\d+", cgroups), cgroups


@pytest.mark.parametrize("student", sorted(NOT_DATA))
def test_submissions_are_read_as_data_never_through_links(graded, student):
    """A link to the solutions or to another student, a FIFO, an oversized file: not read, scored 0, said why."""
    assert not [r for r in graded["rows"] if r["student"] == student]  # nothing of it was graded
    rows = [r for r in graded["summary"] if r["student"] == student]
    assert rows and all(float(r["score"]) == 0 for r in rows), rows
    assert NOT_DATA_REASON[student] in " ".join(r["flags"] for r in rows), rows


def test_unusual_honest_code_gets_full_marks(graded):
    rows = check_expected(graded, "unusual_honest")
    assert {r["grade_id"] for r in rows} == {"test_layernorm", "test_embed", "test_pos_embed", "test_sinusoidal"}
    assert not any(r["flags"] for r in rows), [r["flags"] for r in rows]
    # its class's method set in a later cell, `import sys`, `inspect`, helpers made through exec and globals()
    rows = check_expected(graded, "late_method")
    assert not any(r["flags"] for r in rows), [r["flags"] for r in rows]
    # a %%writefile helper module, torch.testing.assert_close, torch.vmap
    rows = check_expected(graded, "unusual_honest_2")
    assert [r["grade_id"] for r in rows] == ["test_layernorm"] and not rows[0]["flags"], rows
    # a singledispatch's `register`, a table bound in an added cell and filled in the exercise, `%run` of a helper
    rows = check_expected(graded, "unusual_honest_3")
    assert [r["grade_id"] for r in rows] == ["test_layernorm"] and rows[0]["judge"] == "passed", rows
    # helper modules written with open and Path.write_text and put in sys.modules, a class a function defines, rich
    rows = check_expected(graded, "unusual_honest_4")
    assert [r["grade_id"] for r in rows] == ["test_layernorm"] and rows[0]["judge"] == "passed", rows


def test_text_that_cannot_be_encoded_never_stops_the_csvs(graded):
    """A learner's exception text with lone surrogates, from the student whose rows sort first: the batch writes
    both CSVs whole, the text escaped (`course.encodable`, where the grader reads what learner code produced)."""
    rows = check_expected(graded, "0_surrogate")
    assert "\\udcff" in rows[0]["reason"], rows[0]
    with open(graded["out"] / "summary.csv", newline="", encoding="utf-8") as f:
        students = {row["student"] for row in csv.DictReader(f)}
    assert {"0_surrogate", "solved", "zz_seeker"} <= students, students


def test_colliding_folders_are_both_graded_and_flagged(graded):
    rows = check_expected(graded, "solved-2")
    assert "map to the same id" in rows[0]["flags"], rows[0]["flags"]
    assert "rows flagged" in graded["log"]
    for name in LONG_NAMES:  # graded under ids a file name can hold, apart, and flagged
        rows = check_expected(graded, _student_id(name))
        assert rows and f"graded as {_student_id(name)!r}" in rows[0]["flags"], rows


def test_a_student_id_is_never_read_as_a_formula_or_an_option():
    """A folder named `-1-1`, `=cmd|' /C calc'!A0` or `@SUM(A1)` gives an id that the CSVs need not quote (so it
    is the gradebook's id as it is) and a command line reads as no option (`-rf`)."""
    from instructor.grade import MAX_ID, _student_id

    for folder in ("-1-1", "=cmd|' /C calc'!A0", "@SUM(A1)", "+1", "--rf", ".hidden", "-", "a.b-c@d"):
        student = _student_id(folder)
        assert student and student[0] not in "=+-@.\t\r", (folder, student)
        assert re.fullmatch(r"[A-Za-z0-9_.@-]+", student), (folder, student)
    assert _student_id("a.b-c@d") == "a.b-c@d" and _student_id("-") == "student"
    # a folder name may take 255 bytes, and the grader adds to the id: two such names stopped the batch (round 18)
    long_ids = {_student_id("M" * 254 + end) for end in "!?"}
    assert len(long_ids) == 2 and all(len(i) <= MAX_ID and i.startswith("M" * 40) for i in long_ids), long_ids


def test_probes_far_slower_than_the_notebook_are_flagged():
    """The judge's child runs the definitions again, where there is no `/proc` and no network: a `time.sleep` only
    there held a probe slot 251 s with honest marks (red-team round 14). The instructor sees it on the row, as a
    notebook that held its nbgrader worker long."""
    from pathlib import Path
    from types import SimpleNamespace

    from instructor.grade import SLOW_NOTEBOOK, SLOW_PROBES, Grader, Item

    grader = SimpleNamespace(job_student="s")  # a job's grader: scored by its coordinator, nothing else to do
    flags = []
    for probes, nbgrader in ((251.0, 1.9), (SLOW_PROBES - 1, 1.0), (200.0, 60.0)):
        item = Item("s", LN, Path("x"), autograde={}, probed={}, timings={"probes": probes, "nbgrader": nbgrader})
        assert Grader._maybe_finish(grader, item, {}) == 1
        flags.append(item.flags)
    assert flags[1:] == [[], []], flags
    said = f"the judge's probes took 251 s, where nbgrader's run of the whole notebook took 2 s (see course/judge/s/{LN}.log)"
    assert flags[0] == [said], flags
    # ... and a notebook that held its nbgrader worker long, whatever held it (round 18: the grader's own analysis)
    item = Item("s", LN, Path("x"), autograde={}, probed={}, timings={"probes": 1.6, "nbgrader": 171.1})
    Grader._maybe_finish(grader, item, {})
    assert item.flags == [
        f"nbgrader's run of this notebook took 171 s (the course's own notebooks take well under {SLOW_NOTEBOOK:.0f} s)"
    ]


def test_one_students_notebooks_hold_the_batch_a_bounded_time(tmp_path, monkeypatch):
    """Planning runs for one notebook after another before any grading starts: two notebooks that each took their
    whole minute held a batch 123 s (red-team round 20). All of one student's notebooks together get
    STUDENT_PREPARE_SECONDS; past it, the rest are not planned, and say why; another student's are."""
    from types import SimpleNamespace

    from instructor import grade

    def slow_plan(source, nb, name):
        time.sleep(0.4)
        return {"notes": [], "steps": []}

    monkeypatch.setattr(grade, "build_plan", slow_plan)
    monkeypatch.setattr(grade, "STUDENT_PREPARE_SECONDS", 1.0)
    path = tmp_path / f"{LN}.ipynb"
    path.write_text(json.dumps(solution(LN)))
    items = [grade.Item("slow", LN, path) for _ in range(5)] + [grade.Item("other", LN, path)]
    grader = SimpleNamespace(course=tmp_path / "course", args=SimpleNamespace(solutions=str(REPO_ROOT / "solutions")))
    grader.items = items
    start = time.perf_counter()
    grade.Grader.write_plans(grader)
    # each plan takes 0.4 s or its time-out, whichever is less: by the fourth the student's second is spent, however
    # busy the machine (the second and third may be planned or cut off)
    assert time.perf_counter() - start < 10
    assert not items[0].flags and not items[5].flags, (items[0].flags, items[5].flags)
    assert all("planning allows" in item.flags[0] for item in items[3:5]), [i.flags for i in items]


def test_tags_are_single_words_and_text_is_always_encodable():
    """A cell tag "x hidden" became bootstrap's `hidden` class on the page (its test cells hidden, a banner pinned
    over the header: red-team round 17): tags are kept one word each. `encodable` makes any JSON value writable as
    UTF-8, a lone surrogate written as its escape."""
    from instructor.course import encodable

    release = read_json(REPO_ROOT / "notebooks" / f"{LN}.ipynb")
    learner = copy.deepcopy(release)
    learner["cells"][2]["metadata"]["tags"] = ["raises-exception", "x hidden", "y navbar-fixed-top", "ok_1"]
    nb, _ = normalise(learner, release, LN)
    assert nb["cells"][2]["metadata"]["tags"] == ["raises-exception", "ok_1"]
    value = encodable({"k\udcff": ["count \udcff\ud800 mismatch", 3, None, "plain é"]})
    assert value == {"k\\udcff": ["count \\udcff\\ud800 mismatch", 3, None, "plain é"]}
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # writable


def test_what_a_learner_puts_in_a_cells_metadata_is_bounded_and_the_notebook_stays_valid():
    """3.6 million copies of one tag (an 18 MB notebook) made the normalised notebook invalid (tags are unique in
    nbformat's schema), and nbformat's slow validator, run at every read and write of nbgrader's, held a worker 181 s
    (red-team round 23). Tags are now unique and at most MAX_TAGS a cell, pasted images at most MAX_ATTACHMENTS a
    cell with MAX_IMAGE_TYPES types each; and the normaliser refuses a notebook that is still not valid, so nbgrader
    only ever reads valid ones."""
    from instructor.collect import MAX_ATTACHMENTS, MAX_IMAGE_TYPES, MAX_TAGS, _valid

    release = read_json(REPO_ROOT / "notebooks" / f"{LN}.ipynb")
    learner = copy.deepcopy(release)
    markdown = next(i for i, c in enumerate(learner["cells"]) if c["cell_type"] == "markdown")
    learner["cells"][2]["metadata"]["tags"] = ["a"] * 200_000 + [f"t{i}" for i in range(100)]
    png = base64.b64encode(b"png").decode()
    learner["cells"][markdown]["attachments"] = {
        f"i{i}.png": {f"image/x{k}": png for k in range(10)} for i in range(100)
    }
    start = time.perf_counter()
    nb, _ = normalise(learner, release, LN)
    assert time.perf_counter() - start < 5
    assert nb["cells"][2]["metadata"]["tags"] == ["a", *(f"t{i}" for i in range(MAX_TAGS - 1))]
    images = nb["cells"][markdown]["attachments"]
    assert len(images) == MAX_ATTACHMENTS and all(len(bundle) == MAX_IMAGE_TYPES for bundle in images.values())
    nb["cells"][2]["metadata"]["tags"] = ["a", "a"]  # what the normaliser no longer makes: refused if it did
    with pytest.raises(ValueError, match="not a valid notebook once normalised"):
        _valid(nb)


@pytest.mark.parametrize("first", ["alice", "alice.stderr.log"])
def test_one_students_results_on_ray_never_end_the_batch(tmp_path, first):
    """The Ray coordinator wrote a job's log to `logs/jobs/<id>.stderr.log` beside the folder `logs/jobs/<id>/`, so
    the ids `alice` and `alice.stderr.log` made one's file the other's folder, and whichever came second raised out
    of the coordinator: no CSVs (red-team round 25). Each student's files now live in its own folder, and whatever
    goes wrong taking one student's results is recorded on that student's rows."""
    import functools
    from types import SimpleNamespace

    from instructor import grade
    from instructor.engine import RayBatch, pack

    out = tmp_path / "out"
    items = {s: grade.Item(s, LN, tmp_path / "nb.ipynb") for s in ("alice", "alice.stderr.log")}
    coordinator = SimpleNamespace(
        g=SimpleNamespace(out=out, course=tmp_path / "course", items=list(items.values())),
        args=SimpleNamespace(solutions=str(REPO_ROOT / "solutions")),
    )
    coordinator.fail = lambda item, reason: RayBatch.fail(coordinator, item, reason)
    for student in (first, *(s for s in items if s != first)):
        job = tmp_path / "built" / student
        (job / "logs").mkdir(parents=True)
        (job / "logs" / "grade.log").write_text(f"{student}'s job")
        (job / "result.json").write_text(json.dumps({"items": [], "not_graded": "nothing returned"}))
        reply = {"tar": pack(job), "log": f"{student}'s task", "host": "h"}
        take = functools.partial(RayBatch.take, coordinator)
        RayBatch.guarded(coordinator, take, student, [items[student]], reply, tmp_path / "jobs" / student, {})
    for student, item in items.items():
        assert (out / "logs" / "jobs" / student / "task.stderr.log").read_text() == f"{student}'s task"
        assert (out / "logs" / "jobs" / student / "job" / "grade.log").read_text() == f"{student}'s job"
        assert item.status == "failed" and "nothing returned" in item.flags[0], item.flags
    # and a take that fails is that student's rows, not the batch's end
    broken = grade.Item("bob", LN, tmp_path / "nb.ipynb")
    coordinator.g.items.append(broken)
    RayBatch.guarded(coordinator, lambda student, *args: 1 / 0, "bob")
    assert broken.status == "failed" and "ZeroDivisionError" in broken.flags[0] and broken.rows, broken.flags


def test_a_stand_in_feedback_page_is_flagged_by_the_ray_coordinator_too(tmp_path):
    """A worker writes a page that says why where nbgrader could not make one (round 16); on Ray the job returns it
    with its note, and the coordinator flags the row as the local batch does."""
    import io
    import tarfile
    from types import SimpleNamespace

    from instructor.engine import RayBatch

    pages = tmp_path / "pages"
    (pages / "s").mkdir(parents=True)
    (pages / "s" / f"{LN}.html").write_text("<p>stand-in</p>")
    (pages / "s" / f"{LN}.note").write_text("the feedback page was not made: nbgrader's feedback failed")
    (pages / "s" / f"{EMB}.html").write_text("<p>page</p>")
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        tar.add(pages / "s", arcname="s")
    coordinator = SimpleNamespace(g=SimpleNamespace(out=tmp_path / "out", course=tmp_path / "course"))
    items = [SimpleNamespace(notebook=name, status="graded", flags=[]) for name in (LN, EMB)]
    RayBatch.take_feedback(coordinator, "s", {"tar": packed.getvalue()}, items)
    assert items[0].flags == ["the feedback page was not made: nbgrader's feedback failed"] and items[1].flags == []
    assert (tmp_path / "out" / "feedback" / "s" / f"{LN}.html").read_text() == "<p>stand-in</p>"


def test_refuses_to_grade_without_the_sandbox(tmp_path):
    (tmp_path / "subs").mkdir()
    env = dict(os.environ, PATH="/nonexistent")
    run = subprocess.run(
        [sys.executable, "-m", "instructor.grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out")],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode != 0 and "--no-sandbox" in run.stderr, run.stderr[-2000:]


def test_plan_survives_an_expression_too_deep_for_the_parser():
    sol = solution(LN)
    nb = copy.deepcopy(sol)
    nb["cells"].insert(1, code_cell("x = " + "-" * 100000 + "1"))
    plan = build_plan(sol, nb, LN)
    assert any("could not be parsed" in (s.get("error") or "") for s in plan["steps"])


def test_no_submission_holds_the_batch_while_it_is_prepared():
    """Red-team round 11: one added cell of 499 `%time` lines made IPython's transformer quadratic in the grader's own
    process, and every student's grading waited two minutes for it. A cell of more than `MAX_MAGICS` magics is read
    as one the parser cannot take (the rest is planned, in milliseconds), and whatever this process does with a
    submission's content runs in a child that is killed past its time (`grade.bounded`)."""
    sol = solution(LN)
    nb = copy.deepcopy(sol)
    nb["cells"].insert(1, code_cell("%time pass\n" * 499 + "_z = 1\n" * 2500))
    plan = bounded(build_plan, sol, nb, LN, timeout=20)  # it took 120 s
    assert any("more than 64 magic" in (s.get("error") or "") for s in plan["steps"]), plan["steps"][:3]
    assert any("class LayerNorm" in s["code"] for s in plan["steps"])  # the exercise is still planned
    with pytest.raises(TimeoutError):
        bounded(time.sleep, 30, timeout=0.5)
    with pytest.raises(ChildFailed, match="ZeroDivisionError"):
        bounded(divmod, 1, 0)


def test_a_notebook_of_too_many_cells_is_not_read(tmp_path):
    """nbgrader's run and the feedback page take a few ms a cell: 120,000 empty markdown cells held a worker five
    minutes (red-team round 13), 300,000 would have held it some twenty. A notebook of more than `MAX_CELLS` cells
    is not read, and says so; one of the course's size is."""
    from instructor.collect import MAX_CELLS, Unreadable, read_submission

    nb = solution(LN)
    path = tmp_path / f"{LN}.ipynb"
    path.write_text(json.dumps(nb))
    assert len(read_submission(path)["cells"]) == len(nb["cells"]) < MAX_CELLS // 10
    nb["cells"] += [{"cell_type": "markdown", "metadata": {}, "source": ""}] * MAX_CELLS
    path.write_text(json.dumps(nb))
    with pytest.raises(Unreadable, match="cells; the limit is 2,000"):
        read_submission(path)


def test_an_old_format_notebook_is_held_to_the_limits_once_converted(tmp_path):
    """nbformat's upgrade from version 3 writes a heading cell of level L as L '#': 300 cells of level 10^6 (22 kB)
    made 300 MB (red-team round 45). What the conversion makes is held to the size limit; an ordinary version 3
    notebook still reads."""
    from instructor.collect import MAX_NOTEBOOK_BYTES, Unreadable, read_submission

    def v3(level: int, cells: int) -> dict:
        heading = {"cell_type": "heading", "level": level, "metadata": {}, "source": "x"}
        return {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": [{"cells": [heading] * cells}]}

    path = tmp_path / f"{LN}.ipynb"
    path.write_text(json.dumps(v3(2, 3)))
    assert [c["source"] for c in read_submission(path)["cells"]] == ["## x"] * 3
    path.write_text(json.dumps(v3(10**6, 1 + MAX_NOTEBOOK_BYTES // 10**6)))
    with pytest.raises(Unreadable, match="converts to"):
        read_submission(path)


def test_a_bounded_step_cannot_take_the_graders_memory():
    """Each step the grader runs on a submission's content runs in a child limited to the memory the grader holds
    plus `bounded.MEMORY`: past it, a MemoryError there, and the grader's process goes on."""
    with pytest.raises(ChildFailed, match="MemoryError"):
        bounded(bytearray, 3 << 30)
    assert bounded(len, "the grader goes on") == 18


def test_the_grading_order_names_real_notebooks():
    """A renamed notebook would silently lose its place at the front of a batch."""
    from instructor.grade import NOTEBOOK_SECONDS, Grader

    assert set(NOTEBOOK_SECONDS) <= set(notebook_names()), set(NOTEBOOK_SECONDS) - set(notebook_names())
    order = sorted(notebook_names(), key=lambda name: -Grader._weight(name))
    assert order[0] == max(NOTEBOOK_SECONDS, key=NOTEBOOK_SECONDS.get)


def test_a_test_without_the_judges_verdict_scores_zero():
    """Points need the judge: where it gave no verdict (no probe for the test, say), nbgrader's pass is not
    enough."""
    from types import SimpleNamespace

    from instructor.grade import Grader, Item

    def row(judged: dict) -> dict:
        item = Item(student="s", notebook="01_layernorm", path=REPO_ROOT / "notebooks" / "01_layernorm.ipynb")
        item.autograde = {"success": True, "grades": {"test_layernorm": {"auto_score": 2.0}}, "errors": {}}
        item.judged = judged
        Grader._score(SimpleNamespace(args=SimpleNamespace(solutions=str(REPO_ROOT / "solutions"))), item)
        (only,) = item.rows
        return only

    assert row({"test_layernorm": {"passed": True, "message": None}})["score"] == 2.0
    missing = row({})
    assert missing["score"] == 0.0 and missing["judge"] == "failed", missing
    assert "no probe for this test" in missing["reason"], missing


def test_csv_cells_a_spreadsheet_would_run_are_written_as_text():
    """Learner code chooses the text of its errors, which reach the CSVs' flags and reasons: none may start a formula."""
    from instructor.grade import _data_row

    row = _data_row({"reason": '=HYPERLINK("http://example.invalid", "x")', "flags": "@SUM(1)", "score": -1.0})
    assert row == {"reason": '\'=HYPERLINK("http://example.invalid", "x")', "flags": "'@SUM(1)", "score": -1.0}
    assert _data_row({"reason": "failed: =x"}) == {"reason": "failed: =x"}
    # ... nor draw on a terminal: an escape that moved up, erased the line and printed a green "agreed" reached
    # grades.csv (red-team round 36); control and bidirectional characters are written as their escapes
    forged = "raised \x1b[1A\x1b[2K\r\x1b[32mjudge: agreed\x1b[0m \u202eright-to-left"
    shown = _data_row({"reason": forged})["reason"]
    assert shown == "raised \\x1b[1A\\x1b[2K\\x0d\\x1b[32mjudge: agreed\\x1b[0m \\u202eright-to-left", shown
    assert _data_row({"reason": "\x1b=x"})["reason"] == "\\x1b=x"
    # ... nor break a row where an editor or `splitlines` would: line and paragraph separators (round 38)
    assert _data_row({"reason": "a\u2028b\u2029c\u00a0d e"})["reason"] == "a\\u2028b\\u2029c\\xa0d e"


@pytest.mark.parametrize(("auto", "score"), [(1e9, 2.0), (-5.0, 0.0), (float("nan"), 0.0), (0.5, 0.5)])
def test_a_partial_credit_value_the_notebook_chose_stays_within_the_tests_points(auto, score):
    """nbgrader reads partial credit from a test cell's value, which a notebook can make any number: the score stays
    between 0 and the test's points, whatever the judge says."""
    from types import SimpleNamespace

    from instructor.grade import Grader, Item

    item = Item(student="s", notebook="01_layernorm", path=REPO_ROOT / "notebooks" / "01_layernorm.ipynb")
    item.autograde = {"success": True, "grades": {"test_layernorm": {"auto_score": auto}}, "errors": {}}
    item.judged = {"test_layernorm": {"passed": True, "message": None}}
    Grader._score(SimpleNamespace(args=SimpleNamespace(solutions=str(REPO_ROOT / "solutions"))), item)
    assert item.rows[0]["score"] == score, item.rows


def test_a_method_added_to_the_learners_own_class_after_it_is_kept():
    """`Cls.forward = forward` and `setattr(Cls, ...)` on a class the notebook defines complete its definition (an
    honest way to write a method in a later cell); on anything else they stay actions, dropped."""
    own = frozenset({"LayerNorm", "helper"})
    code = (
        "def _forward(self, x):\n    return x\n"
        "LayerNorm.forward = _forward\n"
        "setattr(LayerNorm, 'extra_repr', lambda self: 'mine')\n"
        "helper.__doc__ = 'a helper'\n"
        "torch.allclose = None\n"
        "setattr(torch, 'equal', None)\n"
        "LayerNorm.forward(None, 1)\n"
    )
    tree, dropped = definitions_only(ast.parse(code), own)
    kept = ast.unparse(tree)
    assert "LayerNorm.forward = _forward" in kept and "setattr(LayerNorm" in kept and "helper.__doc__" in kept
    assert "torch" not in kept and "LayerNorm.forward(None, 1)" not in kept and len(dropped) == 3
    # names bound through the namespace itself are definitions too (an honest helper made by exec lost 04's points)
    code = "exec(HELPER, globals())\nglobals()['C0'] = 0.044715\nglobals().update(C1=1.0)\nprint(C0)\n"
    tree, dropped = definitions_only(ast.parse(code))
    assert "print" not in ast.unparse(tree) and len(tree.body) == 3 and len(dropped) == 1


def test_a_verdict_quoting_the_learners_text_is_shown_as_text_in_the_feedback():
    """A red-team review raised, in the judge only, an exception whose text held HTML and a Markdown link: the
    feedback page rendered them live."""
    from nbconvert.filters.markdown import markdown2html

    from instructor.grade import as_code

    said = "judge: raised ValueError: <script>alert(1)</script> [x](javascript:alert(1)) `code`\n<img src=x>"
    page = markdown2html(f"it differs: {as_code(said)}")
    assert "<script>" not in page and "<img" not in page and "href=" not in page, page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, page


def test_a_learners_tree_of_any_depth_is_removed(tmp_path):
    """A kernel's folder 3,000 levels deep made the removal (shutil.rmtree, recursive) raise RecursionError and
    stopped a whole batch before its CSVs; a sibling: a tree just as deep under a file-system path, not a socket's."""
    from instructor.sandbox import remove_tree

    top = tmp_path / "deep"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    remove_tree(top)
    assert not top.exists()


def test_a_tests_own_flag_shows_on_its_row_alone():
    """A flag about one test (nbgrader passed it, the judge did not) marks that test's row, and the notebook in
    summary.csv; the notebook's other rows keep only the notebook's own flags (red-team round 44: the one test's
    flag on all 17 rows of a notebook was noise for the instructor)."""
    from pathlib import Path

    from instructor.grade import Item

    item = Item("s", "07_sampling_and_kv_cache", Path("x"), ["notes.txt ignored"])
    own = "test_generate: nbgrader's run passed it but the judge outside the sandbox failed it: judge: ..."
    item.flags.append(own)
    item.test_flags["test_generate"] = [own]
    assert item.row_flags("test_generate") == ["notes.txt ignored", own]
    assert item.row_flags("test_left_pad") == ["notes.txt ignored"]


def test_a_folder_named_as_an_id_keeps_it_whatever_others_are_called():
    """Ids are given to names that are already ids first: a folder `-blank` (whose id would be `blank`) never takes
    the id of a student's folder `blank`, nor does a link `honest.` put a row under `honest` (red-team round 45)."""
    from instructor.grade import student_ids

    ids = student_ids(["-blank", "blank", "honest.", "honest", "Solved", "solved", "solved-2", "x!", "x-2"])
    assert ids["blank"] == ("blank", None) and ids["honest"] == ("honest", None)
    assert ids["-blank"] == ("blank-2", "blank") and ids["honest."] == ("honest-2", "honest")
    # names that differ by case: neither keeps the bare id by how it sorts, and no suffix takes a folder's own id
    # (`Alice` kept `alice`'s id and pushed `alice-2` to `alice-2-2`: round 46)
    assert ids["solved-2"] == ("solved-2", None) and ids["x-2"] == ("x-2", None) and ids["x!"] == ("x_", None)
    assert ids["Solved"][1] == "solved" and ids["solved"][1] == "Solved"
    given = [student.lower() for student, _ in ids.values()]
    assert len(set(given)) == len(given) and not {"solved", "solved-2"} & {
        ids["Solved"][0].lower(),
        ids["solved"][0].lower(),
    }


def test_a_folder_of_many_files_is_listed_only_as_far_as_the_limit(tmp_path, monkeypatch):
    """A student's folder is listed at most to `MAX_ENTRIES` entries, not whole and then cut: a folder of 200,000
    files held the grader's own process 0.5 s and 66 MB while it was sorted whole (red-team round 46)."""
    from instructor import collect

    monkeypatch.setattr(collect, "MAX_ENTRIES", 50)
    for i in range(200):
        (tmp_path / f"f{i:03}.txt").write_text("")
    listed = []
    real = collect.os.scandir

    def counting(path):
        listing = real(path)

        class Counted:
            def __enter__(self):
                listing.__enter__()
                return self

            def __exit__(self, *exc):
                return listing.__exit__(*exc)

            def __iter__(self):
                for entry in listing:
                    listed.append(entry.name)
                    yield entry

        return Counted()

    monkeypatch.setattr(collect.os, "scandir", counting)
    found, notes = collect.find_notebooks(tmp_path, [LN])
    assert not found and any("only the first 50" in n for n in notes), notes
    assert len(listed) <= 51, len(listed)
