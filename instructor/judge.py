"""The judge: verdicts made outside the sandbox, on fresh inputs, by comparing plain tensors.

The in-sandbox re-check runs the harness's checks in the same process as the learner's code, so that code could in
principle reach into the comparison (read the expected tensor off the caller's frame, or behave well only when a
check is on the stack). The judge holds the course's own implementation and the expected outputs here, in the
grader's process, and never imports or runs learner code:

1. `prepare` (before the re-check starts): draws a secret seed, builds the course's component
   (`harness.course.components`) with every parameter set at random from that seed, draws random inputs, computes
   the expected outputs and keeps them; it writes only the inputs and the weights (safetensors) and a JSON list of
   the probes into the job's folder, which the sandboxed re-check child reads (`instructor.probe_runner`);
2. the child, once its plan has run, builds each learner class with the probe's `Config`, loads the weights
   strictly, runs it on the inputs and writes the outputs (safetensors) into `out/`, the one folder it may write;
3. `verdicts` (after the child has exited and the sandbox has reaped everything it started): reads those outputs
   as safetensors only (never pickle; not a symlink, nothing but a regular file of bounded size), checks dtype,
   shape and finiteness, and compares them with the expected outputs at the tolerances of the harness's
   `load_gpt2_test`. One verdict per graded test in `PROBES`, with a short reason.

Nothing the learner's code does inside can change the inputs it is given before it runs, the expected outputs, or
how they are compared; the most it can do is return wrong tensors, which fail.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from instructor.probe_runner import ERRORS, OUT_DIR, OUTPUTS, REQUEST

# A small GPT-2 shape (every size different, so a transposed or mixed-up dimension shows), cheap to run.
SMALL = {
    "d_model": 40,
    "n_heads": 4,
    "d_head": 10,
    "d_mlp": 88,
    "n_layers": 2,
    "n_ctx": 12,
    "d_vocab": 101,
    "layer_norm_eps": 1e-5,
    "init_range": 0.02,
}
MAX_OUTPUT_BYTES = 16 << 20  # the outputs of every probe together are a few kB


@dataclass(frozen=True)
class Probe:
    """One graded test's probe: `target` (a class taking a Config, or a function) run on `args`, each a shape of
    dimension names ("batch", "pos" or a Config field) and a kind ("float" or "tokens")."""

    grade_id: str
    target: str
    args: tuple[tuple[str, tuple[str, ...]], ...]
    module: bool = True


BATCH_POS_MODEL = (("float", ("batch", "pos", "d_model")),)
TOKENS = (("tokens", ("batch", "pos")),)
PROBES: dict[str, tuple[Probe, ...]] = {
    "01_layernorm": (Probe("test_layernorm", "LayerNorm", BATCH_POS_MODEL),),
    "02_embeddings": (Probe("test_embed", "Embed", TOKENS), Probe("test_pos_embed", "PosEmbed", TOKENS)),
    "03_attention": (
        Probe(
            "test_attention_scores",
            "attention_scores",
            (("float", ("batch", "pos", "n_heads", "d_head")),) * 2,
            module=False,
        ),
        Probe(
            "test_attention_pattern",
            "attention_pattern",
            (("float", ("batch", "n_heads", "pos", "pos")),),
            module=False,
        ),
        Probe(
            "test_weighted_values",
            "weighted_values",
            (("softmax", ("batch", "n_heads", "pos", "pos")), ("float", ("batch", "pos", "n_heads", "d_head"))),
            module=False,
        ),
        Probe(
            "test_project_heads",
            "project_heads",
            (
                ("float", ("batch", "pos", "n_heads", "d_head")),
                ("float", ("n_heads", "d_head", "d_model")),
                ("float", ("d_model",)),
            ),
            module=False,
        ),
        Probe("test_attention", "Attention", BATCH_POS_MODEL),
    ),
    "04_mlp_and_block": (
        Probe("test_gelu_new", "gelu_new", BATCH_POS_MODEL, module=False),
        Probe("test_mlp", "MLP", BATCH_POS_MODEL),
        Probe("test_block", "TransformerBlock", BATCH_POS_MODEL),
    ),
    "05_full_gpt2": (
        Probe("test_unembed", "Unembed", BATCH_POS_MODEL),
        Probe("test_demo_transformer", "DemoTransformer", TOKENS),
        Probe(
            "test_cross_entropy_loss",
            "cross_entropy_loss",
            (("float", ("batch", "pos", "d_vocab")), ("tokens", ("batch", "pos"))),
            module=False,
        ),
    ),
}


def judged_tests() -> dict[str, list[str]]:
    """notebook -> the grade_ids the judge gives a verdict on."""
    return {notebook: [p.grade_id for p in probes] for notebook, probes in PROBES.items()}


@dataclass
class Prepared:
    """A job's probes as written for the sandbox; the expected outputs stay here."""

    folder: Path
    notebook: str
    seed: int
    probes: dict[str, Probe]  # probe name ("p0", ...) -> probe
    expected: dict = field(repr=False, default_factory=dict)  # probe name -> tensor


def _random_parameters(module, gen) -> None:
    """Every parameter drawn afresh (not the init defaults, which a learner could rely on): matrices scaled by
    their input size so activations stay of order 1, vectors around 0 with unit spread."""
    import torch

    with torch.no_grad():
        for param in module.parameters():
            values = torch.randn(param.shape, generator=gen)
            if param.dim() >= 2:
                values /= param.shape[-2] ** 0.5
            param.copy_(values)


def _random_input(kind: str, shape: tuple[int, ...], cfg: dict, gen):
    import torch

    if kind == "tokens":
        return torch.randint(0, cfg["d_vocab"], shape, generator=gen)
    values = torch.randn(shape, generator=gen)
    if kind == "softmax":
        return values.softmax(dim=-1)
    # an offset and a spread per feature: a LayerNorm that does not centre or scale shows at once
    return values * (0.5 + 2 * torch.rand(shape[-1:], generator=gen)) + torch.randn(shape[-1:], generator=gen)


def prepare(notebook: str, folder: Path) -> Prepared | None:
    """Write a fresh probe request for `notebook` into `folder` (None when the judge covers none of its tests)."""
    if notebook not in PROBES:
        return None
    import torch
    from safetensors.torch import save_file

    from harness.config import Config
    from harness.course import components

    torch.set_num_threads(1)  # tiny tensors: threads would only compete with the nbgrader workers
    course = components(notebook)
    seed = secrets.randbits(63)
    gen = torch.Generator().manual_seed(seed)
    pos = 3 + secrets.randbelow(SMALL["n_ctx"] - 3)  # the sequence length changes too
    dims = {"batch": 2, "pos": pos, **SMALL}
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o711)  # the child's uid may go through it to its out/, not list or read it
    prepared = Prepared(folder, notebook, seed, {})
    tensors, entries = {}, []
    for i, probe in enumerate(PROBES[notebook]):
        name = f"p{i}"
        inputs = [_random_input(kind, tuple(dims[d] for d in shape), SMALL, gen) for kind, shape in probe.args]
        entry = {
            "name": name,
            "grade_id": probe.grade_id,
            "target": probe.target,
            "kind": "module" if probe.module else "function",
            "inputs": [],
        }
        with torch.no_grad():
            if probe.module:
                reference = getattr(course, probe.target)(Config(**SMALL))
                _random_parameters(reference, gen)
                for key, value in reference.state_dict().items():
                    tensors[f"{name}.w.{key}"] = value.detach().clone().contiguous()
                entry.update(config=dict(SMALL), weight_prefix=f"{name}.w.")
                expected = reference(*inputs)
            else:
                expected = getattr(course, probe.target)(*[x.clone() for x in inputs])
        for j, x in enumerate(inputs):
            tensors[f"{name}.in{j}"] = x
            entry["inputs"].append(f"{name}.in{j}")
        prepared.probes[name] = probe
        prepared.expected[name] = expected.detach().clone()
        entries.append(entry)
    save_file(tensors, str(folder / "probes.safetensors"))
    (folder / REQUEST).write_text(json.dumps({"files": ["probes.safetensors"], "probes": entries}, indent=1))
    for path in folder.iterdir():
        os.chmod(path, 0o600)  # the child reads them as root, before it gives root up
    return prepared


def read_regular_file(path: Path, limit: int) -> bytes | None:
    """The file's bytes, only if it is a regular file (not a symlink, FIFO or device) of at most `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"cannot be opened safely ({err.strerror})") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("is not a regular file")
        if info.st_size > limit:
            raise ValueError(f"is {info.st_size} bytes, more than {limit}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


def _load_outputs(out: Path) -> tuple[dict, dict, str | None]:
    """(outputs, errors, a problem with the files as a whole)."""
    from safetensors.torch import load

    errors: dict = {}
    try:
        raw = read_regular_file(out / ERRORS, 1 << 20)
        if raw is not None:
            loaded = json.loads(raw)
            errors = {str(k): str(v)[:400] for k, v in loaded.items()} if isinstance(loaded, dict) else {}
    except ValueError:  # a garbled errors file: the outputs still count
        errors = {}
    try:
        data = read_regular_file(out / OUTPUTS, MAX_OUTPUT_BYTES)
    except ValueError as err:
        return {}, errors, f"the outputs file {err}"
    if data is None:
        return {}, errors, None
    try:
        return load(data), errors, None  # parses a JSON header and raw buffers: no code can run
    except Exception as err:  # noqa: BLE001 - pickle, garbage, a truncated file ...
        return {}, errors, f"the outputs are not a safetensors file ({type(err).__name__}), refused unread"


def compare(probe: Probe, got, expected) -> str | None:
    """Why `got` is not the course's output (None when it is)."""
    import torch

    from harness._assertions import mismatch_summary

    if not isinstance(got, torch.Tensor):
        return "no tensor returned"
    if got.dtype != expected.dtype:
        return f"output has dtype {got.dtype}, expected {expected.dtype}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"output has shape {list(got.shape)}, expected {list(expected.shape)}"
    if got.is_floating_point() and not torch.isfinite(got).all():
        return f"output has {int(got.isnan().sum())} NaN and {int(got.isinf().sum())} infinite values"
    atol = 1e-4 * max(1.0, expected.abs().float().mean().item())  # as the harness's load_gpt2_test
    summary = mismatch_summary(got, expected, atol, 1e-4)
    if summary is not None:
        return f"output differs from the course's {probe.target} on fresh inputs: {summary}"
    return None


def verdicts(prepared: Prepared) -> dict[str, dict]:
    """grade_id -> {"passed", "message"}: the child's outputs against the expected ones. Call only once the
    child and everything it started are gone; removes the job's folder."""
    try:
        outputs, errors, problem = _load_outputs(prepared.folder / OUT_DIR)
    finally:
        shutil.rmtree(prepared.folder, ignore_errors=True)
    result: dict[str, dict] = {}
    for name, probe in prepared.probes.items():
        if problem:
            why = problem
        elif name in outputs:
            why = compare(probe, outputs[name], prepared.expected[name])
        elif name in errors:
            why = errors[name]
        else:
            why = "no output returned" + (f" ({next(iter(errors.values()))})" if errors else "")
        old = result.get(probe.grade_id)
        if old is None or old["passed"]:
            result[probe.grade_id] = {"passed": why is None, "message": None if why is None else f"judge: {why}"}
    return result


def no_result(notebook: str, why: str) -> dict[str, dict]:
    """Every judged test of `notebook` failed, for `why` (the re-check never ran or never reported)."""
    return {grade_id: {"passed": False, "message": f"judge: {why}"} for grade_id in judged_tests().get(notebook, [])}
