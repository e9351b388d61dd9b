"""Inside the sandbox: run the judge's probes on the learner's definitions and write back plain tensors.

The judge (`instructor.judge`, outside the sandbox) writes a probe request into a folder of its own: `request.json`
(for each probe: the name to look up in the learner's namespace, its arguments: tensor keys, numbers, a
`Config`, a dataclass of the learner's to build; a module's config and weight keys; the kind of output) and
safetensors files with the inputs and weights. In the sandbox the probe child forks a feeder before any learner
code runs, which alone reads them (as root) and hands each probe its entry and inputs when the runner asks for
that probe, once (`serve_request`, `feeder_client`); elsewhere the child reads them while it is still root
(`load_request`). Once its plan has run, the child builds each learner class, loads the weights, runs it on the
inputs and writes the outputs (`run_probes`) to `out/outputs.safetensors`, and every failure to `out/errors.json`.
No expected output is ever in here: the comparison is made outside, after this process is gone.

Safetensors only from the judge and back to it: a file of raw tensors and a JSON header, which loading cannot turn
into code (pickle, and so `torch.save`/`torch.load`, can). The feeder, root's own process started from the same
code, pickles plain rows of bytes to the child.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import resource
import signal
import sys
import time

REQUEST = "request.json"
OUT_DIR = "out"
OUTPUTS = "outputs.safetensors"
ERRORS = "errors.json"
SERVED = "served.json"  # the feeder's counts of the calls to the stand-ins it served, written by the runner alone
SERVED_KINDS = ("table_seq2seq", "kv_prefix_lm")  # the judge's arguments that are stand-ins the feeder serves


class ProbeError(Exception):
    """A probe that cannot run as asked (its message is reported as it is)."""


class ProbeTimeout(BaseException):
    """A probe ran past its time limit (a BaseException, so the learner's `except Exception` won't eat it)."""


class Alarm:
    """A time limit on one call: `exception` raised by SIGALRM after `start(seconds)`, then again every second
    while the call goes on (learner code that catches the first gets another), never once `stop()` has run. A repeat
    that landed while the first was being handled, after the call, escaped the probe it was for and ended its whole
    phase: every later probe of the notebook had no output (an honest, slow `generate` scored 0 of 35: red-team round
    49). `ring` is the SIGALRM handler."""

    def __init__(self, exception: type[BaseException]):
        self.exception, self.armed = exception, False

    def ring(self, signum, frame):
        if self.armed:
            raise self.exception()

    def start(self, seconds: float) -> None:
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)

    def stop(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def load_request(folder: str) -> dict:
    """The probes with their tensors, read into memory (the child does this as root, before learner code)."""
    from safetensors.torch import load

    with open(os.path.join(folder, REQUEST), encoding="utf-8") as f:
        request = json.load(f)
    tensors = {}
    for name in request["files"]:
        with open(os.path.join(folder, os.path.basename(name)), "rb") as f:
            tensors.update(load(f.read()))  # into memory (not mapped): the files may go once the child drops root
    return {"folder": folder, "probes": request["probes"], "tensors": tensors}


# ---------------------------------------------------------------------- the feeder
# In the sandbox, the probe child never holds the judge's inputs before a probe asks for them: a process forked
# from it before any learner code (`template._fed_probes`), root, which never runs learner code, reads the request
# and serves each probe's entry and tensors once, when the runner asks for that probe. Code run while the
# definitions load, or in an earlier probe's call, finds no input to compute an answer from with an operator that
# is still there; and an input asked for out of turn (through the socket, say) is not served again: the probe it
# belonged to, and every later one, then fails. The runner's side reads through C functions bound before any
# learner code (os.read and os.write among them), so no module attribute a learner rebinds (json's,
# safetensors', os's) runs while it reads.
_FEED_LIMIT = 1 << 30  # one message: a probe's tensors are a few MB at most


def _feed(fd: int, data: bytes, write=os.write) -> None:
    """One message: its length, then its bytes (`os.write` bound when this module loads, before learner code)."""
    message = len(data).to_bytes(8, "big") + data
    while message:
        message = message[write(fd, message) :]


def _fed(fd: int, read=os.read, limit: int = _FEED_LIMIT) -> bytes:
    """One message `_feed` sent, of at most `limit` bytes."""

    def exactly(n: int) -> bytes:
        parts, left = [], n
        while left:
            part = read(fd, min(left, 1 << 20))
            if not part:
                raise EOFError("the judge's feeder closed")
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    size = int.from_bytes(exactly(8), "big")
    if size > limit:
        raise EOFError("a message larger than the feeder sends")
    return exactly(size)


_CALL_LIMIT = 1 << 20  # one model call's tensors: a few kB for the course's stand-ins
_CALLS = 20_000  # the model calls a job's feeder answers (the course's decoders make a few dozen)


def _served_call(model, op: str, specs, raw: bytes):
    """One call of a served stand-in model, its tensors read from the child's bytes: only the ops and dtypes the
    stand-in's `served_ops` allows, of at most 4 dimensions of 4,096 each, filling `raw` exactly."""
    import torch

    dtypes = model.served_ops.get(op) if isinstance(op, str) else None
    if dtypes is None or not isinstance(specs, list) or len(specs) != len(dtypes):
        raise ValueError("an unknown call")
    tensors, offset = [], 0
    for spec, dtype in zip(specs, dtypes):
        shape = spec if isinstance(spec, list) else None
        if shape is None or len(shape) > 4 or not all(type(n) is int and 0 <= n <= 4096 for n in shape):
            raise ValueError("a tensor of an unknown shape")
        kind = getattr(torch, dtype)
        size = kind.itemsize * int(torch.Size(shape).numel())
        if offset + size > len(raw):
            raise ValueError("fewer bytes than the shapes say")
        flat = (
            torch.frombuffer(bytearray(raw[offset : offset + size]), dtype=kind) if size else torch.empty(0, dtype=kind)
        )
        tensors.append(flat.reshape(shape))
        offset += size
    if offset != len(raw):
        raise ValueError("more bytes than the shapes say")
    try:
        with torch.no_grad():
            out = getattr(model, op)(*tensors)
    except Exception as err:  # noqa: BLE001 - the stand-in's own refusal (past n_ctx), not an unreadable call
        raise StandInRaised(f"{type(err).__name__}: {str(err)[:200]}") from None
    return out if isinstance(out, tuple) else (out,)


class StandInRaised(Exception):
    """What a served stand-in model raised on a call it could read (`_served_call`)."""


def _served_model(spec: dict, tensors: dict):
    """The stand-in a probe argument names, built in the feeder (None where the argument is no stand-in)."""
    if "table_seq2seq" in spec:
        return _table_seq2seq_of(spec, tensors), spec["table_seq2seq"]
    if "kv_prefix_lm" in spec:
        key = spec["kv_prefix_lm"]
        return kv_prefix_lm(tensors[key].clone(), int(spec["n_ctx"]), bool(spec["padded"])), key
    return None, None


def serve_request(folder: str, fd: int, report: int | None = None, names: list | None = None) -> None:
    """The feeder: the probes without their arguments first, then, for each probe name asked for (b"N" + name), its
    entry and tensors (as (key, dtype, shape, bytes) rows), once; a name asked for twice, or unknown, ends the
    serving. `names`: one phase's probes, the only ones served, and in that order (the runner starts a feeder of
    its own for each phase: nothing one phase leaves in a feeder, an unread reply or a count, reaches the next).
    A probe's stand-in model stays here: its table is never sent, its entry names it as served, and each call the
    child makes (b"C" + a JSON header + the tensors' bytes) is answered here and counted, out of the learner's
    reach, for the probe being served only. The counts go to `report` (the runner's pipe) when the serving ends."""
    import json
    import pickle

    import torch

    request = load_request(folder)
    chosen = [p for p in request["probes"] if names is None or p["name"] in names]
    if names is not None:
        chosen.sort(key=lambda probe: list(names).index(probe["name"]))
    entries = {probe["name"]: probe for probe in chosen}
    _feed(fd, pickle.dumps([{k: v for k, v in probe.items() if k != "args"} for probe in chosen]))
    order = [probe["name"] for probe in chosen] if names is not None else None
    served: set[str] = set()
    current = None  # the probe being served: its stand-in alone answers calls
    models: dict[str, object] = {}  # probe -> its stand-in, once the probe's turn came
    counts: dict[str, dict] = {}
    try:
        while True:
            try:
                message = _fed(fd, limit=_CALL_LIMIT)  # bounded: a 1 GiB name grew this root process past the cap
            except (OSError, EOFError):
                return
            if message[:1] == b"C":
                try:
                    size = int.from_bytes(message[1:5], "big")
                    header = json.loads(message[5 : 5 + size].decode())
                    name, op = header["probe"], header["op"]
                    if name not in models or (order is not None and name != current):
                        raise ValueError("no stand-in is served for this probe now")
                    if sum(sum(n for n in ops.values() if isinstance(n, int)) for ops in counts.values()) >= _CALLS:
                        raise ValueError(f"more than {_CALLS} model calls in one job")
                    if op in models[name].served_ops:  # counted before anything else: a call that fails still ran
                        counts[name][op] = counts[name].get(op, 0) + 1
                    outs = _served_call(models[name], op, header["shapes"], message[5 + size :])
                    rows = [(str(t.dtype).removeprefix("torch."), tuple(t.shape), t.numpy().tobytes()) for t in outs]
                    reply = ("ok", rows)
                except StandInRaised as err:  # raised in the child as the stand-in raised it (a ValueError)
                    reply = ("raised", str(err))
                except Exception as err:  # noqa: BLE001 - the child's call is wrong: said to it, serving goes on
                    reply = ("error", f"{type(err).__name__}: {str(err)[:200]}")
                _feed(fd, pickle.dumps(reply))
                continue
            try:
                name = message[1:].decode() if message[:1] == b"N" and len(message) <= 65 else None
            except UnicodeDecodeError:
                name = None
            due = order[len(served)] if order is not None and len(served) < len(order) else name
            if name is None or name in served or name not in entries or name != due:
                _feed(fd, pickle.dumps(None))
                return
            served.add(name)
            current = name
            entry, withheld = dict(entries[name]), set()
            entry["args"] = list(entry.get("args", []))
            for j, spec in enumerate(entry["args"]):
                model, key = _served_model(spec, request["tensors"]) if isinstance(spec, dict) else (None, None)
                if model is not None:
                    models[name], counts[name] = model, {}
                    entry["args"][j] = {k: v for k, v in spec.items() if k not in SERVED_KINDS}
                    entry["args"][j]["served"] = name
                    withheld.add(key)
            rows = [
                (
                    key,
                    str(t.dtype).removeprefix("torch."),
                    tuple(t.shape),
                    t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(),
                )
                for key, t in request["tensors"].items()
                if key.startswith(f"{name}.") and key not in withheld
            ]
            _feed(fd, pickle.dumps((entry, rows)))
    finally:
        for name, model in models.items():  # what a stand-in records itself: the positions of each forward
            counts[name]["positions"] = list(getattr(model, "positions", []))[:MAX_DICT_ENTRIES]
        if report is not None:
            try:
                _feed(report, json.dumps(counts).encode())
            finally:
                os.close(report)


def feeder_client(folder: str, sock, report: int | None = None) -> dict:
    """The probe child's request as the feeder gives it: the probes without their arguments; `fetch(name)`, which
    asks the feeder for one probe's entry and tensors (`run_probes`), a stand-in it serves built as a proxy
    (`served_seq2seq`); and `finish()`, for the runner once every phase has ended: the feeder's counts of the
    served calls, read from `report` (the JSON text, or None)."""
    import _pickle
    import json
    import select
    import socket

    import torch

    # bound here, before any learner code: the runner's reads go through nothing a learner can rebind
    loads, frombuffer, empty, feed, fed = _pickle.loads, torch.frombuffer, torch.empty, _feed, _fed
    dumps, poll, shut, partial, proxy = json.dumps, select.select, socket.SHUT_RDWR, functools.partial, served_proxy
    names = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
    dtypes = {name: getattr(torch, name) for name in names}
    fd = sock.fileno()
    probes = loads(fed(fd))

    def tensor(dtype: str, shape, raw: bytes):
        flat = frombuffer(bytearray(raw), dtype=dtypes[dtype]) if raw else empty(0, dtype=dtypes[dtype])
        return flat.reshape(shape).clone()

    def call(probe: str, op: str, *tensors):
        """One call of the stand-in the feeder serves for `probe`: its answer, computed and counted there."""
        header = dumps({"probe": probe, "op": op, "shapes": [list(t.shape) for t in tensors]}).encode()
        raw = b"".join(t.detach().contiguous().cpu().numpy().tobytes() for t in tensors)
        try:
            feed(fd, b"C" + len(header).to_bytes(4, "big") + header + raw)
            status, value = loads(fed(fd))
        except (OSError, EOFError) as err:
            raise ProbeError(f"the judge's feeder could not answer a model call ({type(err).__name__})") from None
        if status == "raised" and value.startswith("ValueError: "):  # the stand-in's refusal (past n_ctx)
            raise ValueError(value.removeprefix("ValueError: "))
        if status != "ok":
            raise ProbeError(f"the judge's stand-in model refused a call of {op}: {value}")
        outs = tuple(tensor(*row) for row in value)
        return outs if len(outs) > 1 else outs[0]

    def fetch(name: str, keep=sock) -> tuple[dict, dict]:
        try:
            feed(fd, b"N" + name.encode())
            got = loads(fed(fd))
        except (OSError, EOFError) as err:
            raise ProbeError(
                f"the judge's inputs could not be read ({type(err).__name__}): its feeder stops serving once "
                "inputs are asked for out of turn"
            ) from None
        if got is None:
            raise ProbeError(
                "the judge's inputs for this probe were asked for out of turn (before it ran, or twice): the "
                "judge serves each probe's inputs once, so none are served any more"
            )
        entry, rows = got
        if entry.get("name") != name:  # a reply left in the socket for another request
            raise ProbeError("the judge's feeder answered for another probe: its inputs were asked for out of turn")
        tensors = {key: tensor(dtype, shape, raw) for key, dtype, shape, raw in rows}
        for spec in entry.get("args", []):
            if isinstance(spec, dict) and "served" in spec:
                tensors[f"served:{name}"] = proxy(partial(call, name), spec)
        return entry, tensors

    def finish(keep=sock) -> str | None:
        if report is None:
            return None
        try:
            keep.shutdown(shut)  # the feeder's read or write ends: it reports its counts and exits
        except OSError:
            pass
        parts = []
        while poll([report], [], [], 10.0)[0]:
            part = os.read(report, 1 << 16)
            if not part:
                break
            parts.append(part)
        os.close(report)
        keep.close()
        data = b"".join(parts)
        return data[8:].decode() if len(data) >= 8 and int.from_bytes(data[:8], "big") == len(data) - 8 else None

    return {"folder": folder, "probes": probes, "tensors": {}, "fetch": fetch, "feeder_fd": fd, "finish": finish}


def prepare_output(folder: str, uid: int | None) -> None:
    """The one folder the child may write to, owned by the child's uid (made by the child while still root)."""
    path = os.path.join(folder, OUT_DIR)
    os.makedirs(path, mode=0o700, exist_ok=True)
    if uid is not None:
        os.chown(path, uid, uid)


MAX_PROBE_BYTES = 4 << 20  # one probe's outputs; the course's are a few hundred kB at most
MAX_DICT_ENTRIES = 1000


def _stand_in_getattr(offers: str):
    """A stand-in model's `__getattr__`: a part it lacks is named as the stand-in's, not as a fault of the notebook's
    model (a greedy_decode that reached `model.embed`, which the notebook's EncoderDecoder has, read "'TableSeq2Seq'
    object has no attribute 'embed'": mutation sweep 3)."""

    def __getattr__(self, name):
        import torch

        try:
            return torch.nn.Module.__getattr__(self, name)
        except AttributeError:
            raise AttributeError(
                f"model.{name}: the judge runs this exercise on a stand-in model that offers {offers} only (what the "
                "exercise is to use of the model); call those"
            ) from None

    return __getattr__


def table_lm(table, n_ctx: int = 1024):
    """A bigram language model for the probes of generation functions: the logits after a token are its row of
    `table` ([d_vocab, d_vocab]), so `model(tokens)` is `table[tokens]` ([batch pos d_vocab]); more than `n_ctx`
    positions are refused, as a Transformer's positional embedding refuses them. Deterministic, and the same in the
    judge's process and in the child's."""
    import torch

    from harness.config import Config

    class TableLM(torch.nn.Module):
        __getattr__ = _stand_in_getattr("cfg and forward(tokens)")

        def __init__(self):
            super().__init__()
            vocab = table.shape[0]
            self.cfg = Config(d_model=8, n_heads=2, d_head=4, d_mlp=16, n_layers=1, n_ctx=n_ctx, d_vocab=vocab)
            self.table = torch.nn.Parameter(table, requires_grad=False)

        def forward(self, tokens):
            if tokens.dtype not in (torch.int64, torch.int32) or tokens.ndim != 2:
                raise TypeError(f"the model takes int64 tokens [batch pos], got {tokens.dtype} {list(tokens.shape)}")
            if tokens.shape[1] > self.cfg.n_ctx:
                raise ValueError(f"{tokens.shape[1]} positions, more than the model's n_ctx = {self.cfg.n_ctx}")
            return self.table[tokens]

    return TableLM().eval()


def prefix_rows(tokens, index, rows: int):
    """The row of a stand-in's table at each position: a hash of the tokens up to it (`tokens` [batch pos]) and of
    its index there (`index`, [pos] or [batch pos]), so that another prefix or another place picks another row."""
    return (7 * tokens.long().cumsum(dim=1) + 3 * index + 1) % rows


def prefix_lm(table, n_ctx: int = 1024):
    """A language model for the probes of generation functions whose logits at a position depend on every token up to
    it and on its index: the row of `table` ([rows, d_vocab]) at a hash of the prefix, so that a generation that
    feeds the model the last token only, or a window shorter than the sequence, picks other tokens; more than
    `n_ctx` positions are refused, as `table_lm` refuses them. Deterministic, the same in the judge's process and in
    the child's."""
    import torch

    from harness.config import Config

    class PrefixLM(torch.nn.Module):
        __getattr__ = _stand_in_getattr("cfg and forward(tokens)")

        def __init__(self):
            super().__init__()
            vocab = table.shape[1]
            self.cfg = Config(d_model=8, n_heads=2, d_head=4, d_mlp=16, n_layers=1, n_ctx=n_ctx, d_vocab=vocab)
            self.table = torch.nn.Parameter(table, requires_grad=False)

        def forward(self, tokens):
            if tokens.dtype not in (torch.int64, torch.int32) or tokens.ndim != 2:
                raise TypeError(f"the model takes int64 tokens [batch pos], got {tokens.dtype} {list(tokens.shape)}")
            if tokens.shape[1] > self.cfg.n_ctx:
                raise ValueError(f"{tokens.shape[1]} positions, more than the model's n_ctx = {self.cfg.n_ctx}")
            index = torch.arange(tokens.shape[1], device=tokens.device)
            return self.table[prefix_rows(tokens, index, self.table.shape[0])]

    return PrefixLM().eval()


def kv_prefix_lm(table, n_ctx: int, padded: bool = False):
    """A stand-in for 07's KVCacheTransformer (`padded`: its PaddedTransformer) in the probes of the generation
    functions that must use its cache: `model(tokens, past_kvs)` (`model(tokens, mask, past_kvs)`) returns the
    logits of the new positions and a cache of one layer whose keys and values ([batch pos 1 1]) hold the tokens so
    far. Each position's logits are `prefix_lm`'s: a row of `table` at a hash of the (unmasked) prefix and its index
    among the real tokens, so left padding changes nothing and a wrong prefix picks other tokens. More than `n_ctx`
    positions raise a ValueError naming n_ctx. It records the cache's length and the new positions of every forward
    (`positions`): a cache used feeds every position once. In the sandbox the feeder serves it (`served_kv_lm`), so
    that record is kept out of the learner's reach."""
    import torch

    from harness.config import Config

    class KVPrefixLM(torch.nn.Module):
        __getattr__ = _stand_in_getattr("cfg and forward(tokens, [attention_mask,] past_kvs)")

        def __init__(self):
            super().__init__()
            self.served_ops = {"step": ("int64", "bool", "float32")}  # tokens [batch new], mask [batch pos], past
            vocab = table.shape[0]
            self.cfg = Config(d_model=8, n_heads=1, d_head=1, d_mlp=16, n_layers=1, n_ctx=n_ctx, d_vocab=vocab)
            self.table = torch.nn.Parameter(table, requires_grad=False)
            self.positions: list[int] = []

        def step(self, tokens, mask, past):
            """The logits of `tokens`' positions after `past`'s, and the cache that holds them all."""
            if tokens.ndim != 2 or past.ndim != 4 or past.shape[0] != tokens.shape[0] or past.shape[2:] != (1, 1):
                raise TypeError(f"tokens [batch new] and a cache [batch pos 1 1] are due, got {list(tokens.shape)}")
            self.positions.append([int(past.shape[1]), int(tokens.shape[1])])  # the cache's length, the new ones
            if tokens.numel() + past.numel() > _STAND_IN_ROWS:
                raise ValueError(f"at most {_STAND_IN_ROWS} positions in all, got {list(tokens.shape)}")
            full = torch.cat([past[:, :, 0, 0].long(), tokens.long()], dim=1)  # [batch pos]
            if full.shape[1] > self.cfg.n_ctx:
                raise ValueError(f"{full.shape[1]} positions, more than the model's n_ctx = {self.cfg.n_ctx}")
            if mask.shape != full.shape:
                raise ValueError(f"a mask of shape {list(mask.shape)} for {list(full.shape)} positions so far")
            index = (mask.long().cumsum(dim=1) - 1).clamp(min=0)  # each real token's place among the real ones
            hashed = prefix_rows(full * mask, index, self.cfg.d_vocab)
            logits = self.table[hashed[:, -tokens.shape[1] :]]  # [batch new d_vocab]
            return logits, full.float()[:, :, None, None]

        def forward(self, tokens, *args, **kwargs):
            return _kv_forward(self.step, tokens, args, kwargs, padded)

    return KVPrefixLM().eval()


def _kv_forward(step, tokens, args: tuple, kwargs: dict, padded: bool):
    """A KV stand-in's forward, called as KVCacheTransformer's `forward(tokens, past_kvs=None)` is (PaddedTransformer's
    `forward(tokens, attention_mask, past_kvs=None)`): the past's tokens read from its cache, the new ones' logits
    and the longer cache returned."""
    import inspect

    import torch

    def kv(tokens, past_kvs=None):
        return None, past_kvs

    def padded_kv(tokens, attention_mask, past_kvs=None):
        return attention_mask, past_kvs

    try:
        mask, past_kvs = (padded_kv if padded else kv)(tokens, *args, **kwargs)
    except TypeError as err:
        wanted = inspect.signature(padded_kv if padded else kv)
        raise TypeError(f"the model is called as forward{wanted}: {err}") from None

    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32) or tokens.ndim != 2:
        raise TypeError("the model takes int64 tokens [batch pos]")
    if past_kvs is None:
        past = torch.zeros((tokens.shape[0], 0, 1, 1))
    else:
        past = torch.as_tensor(past_kvs[0][0], dtype=torch.float32)
    if not padded:
        mask = torch.ones((tokens.shape[0], past.shape[1] + tokens.shape[1]), dtype=torch.bool)
    elif mask is None:
        raise TypeError("the model takes a mask [batch pos] with the tokens")
    logits, cache = step(tokens.long(), torch.as_tensor(mask, dtype=torch.bool), past)
    return logits, [(cache, cache.clone())]


_STAND_IN_ROWS = 1 << 14  # the most ids a stand-in's call takes: the course's probes send a few dozen


def _table_seq2seq_of(spec: dict, tensors: dict):
    memory = tensors[spec["memory"]].clone() if "memory" in spec else None
    return table_seq2seq(tensors[spec["table_seq2seq"]].clone(), spec["fields"], memory)


def table_seq2seq(table, fields: dict, memory_table=None):
    """A stand-in encoder-decoder for the probes of decoding functions: `encode(src)` is `table[src]` (or
    `memory_table[src]`, where given), and `decode(tgt, memory, src)` at a position is the row of `table` at a hash of
    the target up to it (as `prefix_lm`'s) plus the mean of the source's rows (padding left out), so every step
    depends on the source, its padding and every token so far (a decode fed the last token alone passed while a
    position's row was its token's: a mutation sweep). Deterministic, the same in the judge's process and the child's."""
    import torch

    from harness import EncoderDecoderConfig

    class TableSeq2Seq(torch.nn.Module):
        __getattr__ = _stand_in_getattr("cfg, encode(src), decode(tgt, memory, src) and forward(src, tgt)")

        def __init__(self):
            super().__init__()
            self.served_ops = {"encode": ("int64",), "decode": ("int64", "float32", "int64")}  # the feeder's
            self.cfg = EncoderDecoderConfig(**fields)
            self.table = torch.nn.Parameter(table, requires_grad=False)
            memory = table if memory_table is None else memory_table
            self.memory_table = torch.nn.Parameter(memory, requires_grad=False)
            self.encode_calls = 0  # what `decode_once` reads

        def encode(self, src):
            self.encode_calls += 1
            if src.ndim != 2 or src.numel() > _STAND_IN_ROWS:
                raise ValueError(f"encode takes src [batch src] (at most {_STAND_IN_ROWS} ids), got {list(src.shape)}")
            return self.memory_table[src]  # [batch src d_vocab]

        def decode(self, tgt_in, memory, src):  # the names of the course's EncoderDecoder, keywords alike
            tgt = tgt_in
            # shapes checked before any is broadcast: a call shaped to broadcast to 9 GB killed the feeder
            batch, vocab = src.shape[0] if src.ndim == 2 else -1, self.table.shape[0]
            if (
                tgt.ndim != 2
                or src.ndim != 2
                or tuple(memory.shape) != (batch, src.shape[1], vocab)
                or tgt.shape[0] != batch
                or tgt.numel() > _STAND_IN_ROWS
                or src.numel() > _STAND_IN_ROWS
            ):
                raise ValueError(
                    f"decode takes tgt [batch tgt], memory [batch src {vocab}] and src [batch src] (at most "
                    f"{_STAND_IN_ROWS} ids each), got {list(tgt.shape)}, {list(memory.shape)}, {list(src.shape)}"
                )
            keep = (src != self.cfg.pad_id)[..., None]  # [batch src 1]
            context = (memory * keep).sum(1, keepdim=True) / keep.sum(1, keepdim=True).clamp(min=1)
            index = torch.arange(tgt.shape[1], device=tgt.device)
            return self.table[prefix_rows(tgt, index, vocab)] + context  # [batch tgt d_vocab]

        def forward(self, src, tgt_in):
            return self.decode(tgt_in, self.encode(src), src)

    return TableSeq2Seq().eval()


def served_proxy(call, spec: dict):
    """The probe child's proxy for the stand-in the feeder serves for an argument (`spec`, the feeder's entry)."""
    if "fields" in spec:
        return served_seq2seq(call, spec["fields"])
    return served_kv_lm(call, int(spec["n_ctx"]), int(spec["d_vocab"]), bool(spec["padded"]))


def served_seq2seq(call, fields: dict):
    """The probe child's side of a stand-in encoder-decoder the feeder serves (`serve_request`): `encode` and
    `decode` are answered by the feeder, which holds the table and counts the calls out of the learner's reach
    (a counter on this object, which the learner holds, was set back to 1 by a decoder that re-encoded every step).
    It counts here too (`decode_once` reads it, as in the unsandboxed child)."""
    import torch

    from harness import EncoderDecoderConfig

    class ServedSeq2Seq(torch.nn.Module):
        __getattr__ = _stand_in_getattr("cfg, encode(src), decode(tgt, memory, src) and forward(src, tgt)")

        def __init__(self):
            super().__init__()
            self.cfg = EncoderDecoderConfig(**fields)
            self.anchor = torch.nn.Parameter(torch.zeros(0), requires_grad=False)  # a device and dtype to read
            self.encode_calls = 0

        def encode(self, src):
            self.encode_calls += 1
            return call("encode", torch.as_tensor(src, dtype=torch.int64))  # [batch src d_vocab]

        def decode(self, tgt_in, memory, src):  # the names of the course's EncoderDecoder, keywords alike
            tgt, src = torch.as_tensor(tgt_in, dtype=torch.int64), torch.as_tensor(src, dtype=torch.int64)
            return call("decode", tgt, torch.as_tensor(memory, dtype=torch.float32), src)  # [batch tgt d_vocab]

        def forward(self, src, tgt_in):
            return self.decode(tgt_in, self.encode(src), src)

    return ServedSeq2Seq().eval()


def served_kv_lm(call, n_ctx: int, d_vocab: int, padded: bool):
    """The probe child's side of a `kv_prefix_lm` the feeder serves: each forward is answered and its positions
    recorded there; a ValueError of the stand-in's (past n_ctx) is raised here as one."""
    import torch

    from harness.config import Config

    class ServedKVLM(torch.nn.Module):
        __getattr__ = _stand_in_getattr("cfg and forward(tokens, [attention_mask,] past_kvs)")

        def __init__(self):
            super().__init__()
            self.cfg = Config(d_model=8, n_heads=1, d_head=1, d_mlp=16, n_layers=1, n_ctx=n_ctx, d_vocab=d_vocab)
            self.anchor = torch.nn.Parameter(torch.zeros(0), requires_grad=False)  # a device and dtype to read

        def step(self, tokens, mask, past):
            return call("step", tokens, mask, past)

        def forward(self, tokens, *args, **kwargs):
            return _kv_forward(self.step, tokens, args, kwargs, padded)

    return ServedKVLM().eval()


def logit_diff_metric(first: int, second: int):
    """A patching metric: the batch's mean of logit[first] - logit[second] at the last position."""

    def metric(logits):
        return (logits[:, -1, first] - logits[:, -1, second]).mean()

    return metric


def seeded_generator(seed: int, advance: int = 0):
    """A generator seeded with `seed`, then `advance` draws on: in another state than a fresh one of the same seed,
    with the same `initial_seed()` (a sampler that seeds a generator of its own from that number, not drawing with
    the one given, draws the same from both)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    if advance:
        torch.rand(advance, generator=generator)
    return generator


def _argument(spec: dict, namespace: dict, tensors: dict):
    """One argument of a probe, from its JSON entry (the judge's `_draw`)."""
    if "tensor" in spec:
        value = tensors[spec["tensor"]]
        if "repeat" in spec:
            return value.expand(int(spec["repeat"]), *value.shape[1:]).clone()
        if "tile" in spec:  # the rows in turn, row i being row i % len(rows), to `tile` rows
            rows = int(spec["tile"])
            return value.repeat(-(-rows // value.shape[0]), *([1] * (value.dim() - 1)))[:rows]
        if spec.get("strided") and value.dim() >= 3:  # the same values laid out with dimensions 1 and 2 swapped,
            return value.transpose(1, 2).contiguous().transpose(1, 2)  # as an einsum's output may be: not contiguous
        return value.clone()  # a fresh copy: the call may write into its input
    if "value" in spec:
        value = spec["value"]
        if (
            value is not None
            and not isinstance(value, (bool, int, float))
            and not (isinstance(value, str) and len(value) <= 40)
        ):
            raise ProbeError(f"the judge sent an argument of type {type(value).__name__}")
        return value
    if "ints" in spec:
        rows = spec["ints"]
        if not all(isinstance(row, list) and all(type(x) is int for x in row) for row in rows):
            raise ProbeError("the judge sent a list that is not of lists of ints")
        return [list(row) for row in rows]
    if "int_list" in spec:
        values = spec["int_list"]
        if not (isinstance(values, list) and all(type(x) is int for x in values)):
            raise ProbeError("the judge sent a list that is not of ints")
        return list(values)
    if "generator" in spec:
        return seeded_generator(int(spec["generator"]), int(spec.get("advance", 0)))
    if "logit_diff" in spec:
        first, second = spec["logit_diff"]
        if type(first) is not int or type(second) is not int:
            raise ProbeError("the judge sent a metric that is not of two token ids")
        return logit_diff_metric(first, second)
    if "table_seq2seq" in spec:
        return _table_seq2seq_of(spec, tensors)
    if "served" in spec:  # the feeder's proxy, made by `fetch`
        return tensors[f"served:{spec['served']}"]
    if "kv_prefix_lm" in spec:
        return kv_prefix_lm(tensors[spec["kv_prefix_lm"]].clone(), int(spec["n_ctx"]), bool(spec["padded"]))
    if "module" in spec:  # the learner's class, with the judge's weights
        return build_module(spec["module"], namespace.get(spec["module"]), spec, tensors)
    if "course_model" in spec:  # an earlier notebook's model, the course's own (its parameters' names are what count)
        import harness
        from harness.course import components

        model = getattr(components(spec["notebook"]), spec["course_model"])(harness.Config(**spec["config"]))
        if "weight_prefix" in spec:  # the judge's weights, every one of them
            prefix = spec["weight_prefix"]
            state = {k[len(prefix) :]: t.clone() for k, t in tensors.items() if k.startswith(prefix)}
            model.load_state_dict(state, strict=True)
            model.eval()
        if spec.get("hooked"):
            from harness.interp import to_hooked_transformer

            model = to_hooked_transformer(model)
        return model
    if "tensors" in spec:
        prefix = spec["tensors"]
        return {key[len(prefix) :]: t.clone() for key, t in tensors.items() if key.startswith(prefix)}
    if "table_lm" in spec:
        return table_lm(tensors[spec["table_lm"]].clone(), int(spec.get("n_ctx", 1024)))
    if "prefix_lm" in spec:
        return prefix_lm(tensors[spec["prefix_lm"]].clone(), int(spec.get("n_ctx", 1024)))
    if "config" in spec:
        import harness

        return getattr(harness, spec["config"])(**spec["fields"])
    if "dataclass" in spec:
        cls = namespace.get(spec["dataclass"])
        if not isinstance(cls, type):
            raise ProbeError(f"{spec['dataclass']} is not a class defined in the notebook")
        try:
            return cls(**spec["fields"])
        except Exception as err:  # noqa: BLE001 - a dataclass without the fields the check uses
            fields = ", ".join(f"{k}=..." for k in spec["fields"])
            raise ProbeError(f"{spec['dataclass']}({fields}) raised {type(err).__name__}: {err}") from None
    raise ProbeError(f"the judge sent an argument it cannot describe: {sorted(spec)}")


def _plain(t, what: str):
    import torch

    if not isinstance(t, torch.Tensor):
        raise ProbeError(f"{what} is a {type(t).__name__}, not a tensor")
    # a plain, contiguous CPU tensor of its own: what safetensors can write, and nothing of a subclass's
    return t.detach().cpu().as_subclass(torch.Tensor).clone().contiguous()


_SAFETENSORS_DTYPES = {
    "torch.float32": "F32",
    "torch.float64": "F64",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.bool": "BOOL",
}


def _frozen(result: dict) -> dict:
    """Each plain tensor of `result` as (safetensors dtype, shape, its bytes, little-endian as the format is)."""
    import torch

    frozen = {}
    for name, t in result.items():
        dtype = _SAFETENSORS_DTYPES.get(str(t.dtype))
        if dtype is None:
            raise ProbeError(f"an output of dtype {t.dtype}, which the judge does not read")
        flat = t.reshape(-1)
        if flat.numel() and flat.stride(0) != 1:  # a view of one element may keep any stride (a row of a batch of one)
            flat = flat.new_empty(flat.shape).copy_(flat)
        data = bytes(flat.view(torch.uint8).numpy()) if t.numel() else b""
        frozen[name] = (dtype, tuple(int(d) for d in t.shape), data)
    return frozen


def _mode_stacks():
    """The functions that read and pop torch's function- and dispatch-mode stacks, bound before any learner code."""
    import torch
    from torch.utils._device import DeviceContext

    c = torch._C
    return (
        (c._len_torch_function_stack, c._get_function_stack_at, c._pop_torch_function_stack),
        (c._len_torch_dispatch_stack, c._get_dispatch_stack_at, c._pop_torch_dispatch_stack),
        DeviceContext,
    )


def _learner_modes() -> int:
    """How many modes are on torch's stacks that are not torch's own default device (`torch.set_default_device`
    leaves a DeviceContext on the stack, whose code is torch's): the runner itself enters none."""
    stacks, device = _MODES[:2], _MODES[2]
    count = 0
    for length, at, _ in stacks:
        count += sum(1 for i in range(length()) if type(at(i)) is not device)
    return count


def _drop_learner_modes() -> None:
    """Every mode on torch's stacks off them, but torch's default device (`_learner_modes`), which is put back."""
    stacks, device = _MODES[:2], _MODES[2]
    for length, at, pop in stacks:
        if not any(type(at(i)) is not device for i in range(length())):
            continue
        kept = []
        while length():
            mode = pop()
            if type(mode) is device:
                kept.append(mode)
        for mode in reversed(kept):
            mode.__enter__()


def _outputs(probe: dict, out) -> dict:
    """The probe's output as named plain tensors: `name`, or `name.out.<key>` for each entry of a dict."""
    import math
    import numbers
    from collections.abc import Mapping

    import torch

    name, target = probe["name"], probe["target"]
    kind = probe.get("output", "tensor")
    if kind == "tuple":
        if not isinstance(out, tuple) or not out:
            raise ProbeError(f"{target} returned {type(out).__name__}, not a tuple of tensors")
        out, kind = {str(i): value for i, value in enumerate(out)}, "dict"
    if kind == "dict":
        if not isinstance(out, Mapping):
            raise ProbeError(f"{target} returned {type(out).__name__}, not a dict")
        if not out:
            raise ProbeError(f"{target} returned an empty dict")
        if len(out) > MAX_DICT_ENTRIES:
            raise ProbeError(f"{target} returned a dict of {len(out)} entries")
        result = {}
        for key, value in out.items():
            if not isinstance(key, str):
                raise ProbeError(f"{target} returned a dict with a key of type {type(key).__name__}")
            result[f"{name}.out.{key}"] = _plain(value, f"{target}(...)[{key[:80]!r}]")
    elif kind == "int":  # a count: a Python int (NumPy's integers too), as the check requires
        if not isinstance(out, numbers.Integral) or isinstance(out, bool):
            kind_name = f"{type(out).__module__}.{type(out).__name__}".removeprefix("builtins.")
            hint = " (count with integer arithmetic: * and +, or // rather than /)" if isinstance(out, float) else ""
            if kind_name.startswith("torch."):
                hint = " (.item() turns a one-element tensor into a number)"
            raise ProbeError(f"{target} returned {kind_name} {str(out)[:40]}, not a Python int{hint}")
        result = {name: torch.tensor(int(out), dtype=torch.int64)}
    elif kind in ("scalar", "loss"):
        if kind == "loss" and not (isinstance(out, torch.Tensor) and out.dim() == 0 and out.is_floating_point()):
            got = f"a tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ProbeError(
                f"{target} returned {got}, not a 0-d floating-point tensor: return the loss as a tensor (not "
                ".item()), so that backward() can run through it"
            )
        if isinstance(out, torch.Tensor) and out.numel() == 1 and out.dtype != torch.bool:
            value = float(out.detach().cpu().reshape(()).double().item())
        elif isinstance(out, (int, float)) and not isinstance(out, bool):
            value = float(out)
        else:
            raise ProbeError(f"{target} returned {type(out).__name__}, not a number")
        if not math.isfinite(value):
            raise ProbeError(f"{target} returned {value}")
        result = {name: torch.tensor(value, dtype=torch.float64)}
    else:
        if isinstance(out, tuple) and out:  # as the harness's checks take it
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise ProbeError(f"{target} returned {type(out).__name__}, not a tensor")
        result = {name: _plain(out, f"{target}'s output")}
    size = sum(t.numel() * t.element_size() for t in result.values())
    if size > MAX_PROBE_BYTES:
        raise ProbeError(f"{target} returned {size} bytes of tensors, more than {MAX_PROBE_BYTES}")
    return result


def _learners(spec: dict) -> bool:
    """Whether an argument is made by the learner's code (its class or dataclass), not the judge's."""
    return "module" in spec or "dataclass" in spec


_STAND_INS = ("served", "table_lm", "prefix_lm", "table_seq2seq", "kv_prefix_lm")  # the judge's stand-in models


def _posing_as_annotated(model, target, at: int, namespace: dict):
    """A stand-in model, made an instance of the module class the learner's function annotates its `at`-th parameter
    with (`model: KVCacheTransformer`, also `Optional[...]`, `... | None` or a string of either) where there is one:
    an honest function checked at run time (`@jaxtyped(typechecker=beartype)`) would refuse the stand-in otherwise.
    The stand-in's own methods come first; the learner's class is never instantiated. Called where the record
    watches (`_run_one`'s `call`): resolving a string annotation, or a metaclass, runs learner code."""
    import inspect
    import typing

    import torch

    try:
        parameters = list(inspect.signature(target).parameters.values())
        annotation = parameters[at].annotation if at < len(parameters) else None
        if isinstance(annotation, str):
            hints = typing.get_type_hints(inspect.unwrap(target), globalns=namespace)
            annotation = hints.get(parameters[at].name)
    except Exception:  # noqa: BLE001 - no annotation to read: the stand-in as it is
        return model
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, torch.nn.Module):
            if isinstance(model, candidate):
                return model
            try:
                model.__class__ = type(candidate.__name__, (type(model), candidate), {})
            except TypeError:  # a class whose layout differs (slots): the stand-in as it is
                pass
            return model
    return model


_TRAINS_ITS_MODEL = frozenset({"trained_weights", "train_batches", "addition_run"})  # training changes its model


def _run_one(probe: dict, namespace: dict, tensors: dict) -> dict:
    calls = probe.get("chunks")
    if calls:
        if not (isinstance(calls, list) and all(type(rows) is int and rows > 0 for rows in calls)):
            raise ProbeError("the judge sent calls that are not counts of rows")  # the judge's own mistake
        parts = []
        for group in _record_groups(calls):
            made = [_call_of(_chunk(probe, c, calls[c]), namespace, tensors) for c in group]
            # a default, not functools.partial: learner code may have rebound a module's names, not this lambda's
            results = _call_watching(probe["target"], lambda made=made: _each(made), _rules(probe))
            parts += [_read(probe, result) for result in results]
        return _joined(probe["target"], parts, calls)
    return _read(probe, _call_watching(probe["target"], _call_of(probe, namespace, tensors), _rules(probe)))


def _each(calls: list) -> list:
    return [call() for call in calls]


def _record_groups(calls: list[int]) -> list[list[int]]:
    """The calls (their indices) that one record watches together: consecutive ones, as many as make no more rows
    than the largest call alone. A record costs about 5 ms to start and end whatever it holds, and 07's calls of one
    row were 1,700 records of under 3,000 events (8 s of the notebook's probes, measured); a record over the largest
    call's rows would hold more than one call ever makes (`_chunk`)."""
    budget, groups, rows = max(calls), [], 0
    for c, n in enumerate(calls):
        if groups and rows + n <= budget:
            groups[-1].append(c)
            rows += n
        else:
            groups.append([c])
            rows = n
    return groups


def _rules(probe: dict) -> tuple:
    return tuple(probe.get("forbidden_ops", ()))


def _read(probe: dict, result) -> dict:
    if type(result) is not dict or any(type(value) is not tuple for value in result.values()):
        raise ProbeError(f"{probe['target']}'s outputs were not read as plain tensors")
    return result


def _chunk(probe: dict, c: int, rows: int) -> dict:
    """Call `c` of a sampling probe cut in calls (`judge.SAMPLE_CALLS`): `rows` of its rows, its generator seeded
    apart for each call, so that the calls' draws are independent. No record watches more rows than one call has
    (`_record_groups`): the record keeps every operator it sees, and an honest sampler that loops over 8,000 rows in
    Python ran millions of them in one call, past the child's memory (red-team rounds 22 and 27). Some calls are of a few rows, as in practice (a
    sampler greedy on fewer than 64 rows passed while every call was of 500: red-team round 29)."""
    args = []
    for spec in probe["args"]:
        spec = dict(spec)
        for kind in ("tile", "repeat"):
            if kind in spec:
                spec[kind] = rows
        if "generator" in spec:
            spec["generator"] = (int(spec["generator"]) + c * 0x9E3779B97F4A7C15) % (1 << 63)
        args.append(spec)
    return dict(probe, args=args, chunks=None)


def _joined(target: str, parts: list[dict], calls: list[int]) -> dict:
    """The calls' frozen outputs (`_frozen`) as one, row after row: each call's as many rows as it was given."""
    joined = {}
    for name, (dtype, shape, _) in parts[0].items():
        pieces = [part.get(name) for part in parts]
        if not shape or any(
            p is None or p[0] != dtype or p[1][1:] != shape[1:] or p[1][0] != rows
            for p, rows in zip(pieces, calls, strict=True)
        ):
            raise ProbeError(
                f"{target}'s output {name!r} does not have a row for each of its input's rows (the judge calls it on "
                "a few of them at a time, from 2 to a few hundred, and puts the outputs together)"
            )
        joined[name] = (dtype, (sum(p[1][0] for p in pieces), *shape[1:]), b"".join(p[2] for p in pieces))
    return joined


def _call_of(probe: dict, namespace: dict, tensors: dict):
    """The probe's call, to be made inside the record (`_call_watching`): the learner's code run on the judge's
    arguments, made here, and its outputs read down to frozen plain tensors (`_frozen`)."""
    import torch

    target = namespace.get(probe["target"])
    if target is None:
        raise ProbeError(f"{probe['target']} is not defined in the notebook")
    if probe["kind"] != "module" and not callable(target):
        raise ProbeError(f"{probe['target']} is not a function")
    specs = probe["args"]
    # The judge's own arguments (the course's models and their caches, tensors, numbers) are made here. Whatever
    # runs the learner's code, making its classes and dataclasses, the call, and reading what it returned down to
    # plain tensors, runs inside the record (`_call_watching`): once a probe has begun, no learner code runs where
    # the record does not look (a result whose `__getitem__` computed the answer after the record had ended, with
    # an operator the exercise forbids, passed before).
    args = [None if "run_cache" in spec or _learners(spec) else _argument(spec, namespace, tensors) for spec in specs]
    for j, spec in enumerate(specs):
        if "run_cache" in spec:  # a HookedTransformer's cache on the probe's tokens, made before the learner's call
            model_at, tokens_at = spec["run_cache"]
            tokens = args[tokens_at] if tokens_at is not None else _argument(spec["tokens"], namespace, tensors)
            with torch.no_grad():
                args[j] = args[model_at].run_with_cache(tokens)[1]
    names = list(probe.get("keywords", []))
    script = probe.get("script")

    def call() -> dict:
        modes_before = _learner_modes()
        full = [_argument(spec, namespace, tensors) if _learners(spec) else arg for spec, arg in zip(specs, args)]
        for j, spec in enumerate(specs):
            if any(key in spec for key in _STAND_INS):
                full[j] = _posing_as_annotated(full[j], target, j, namespace)
        # The judge's tensors as given: the checks refuse an exercise that changes its input in place, so the
        # judge does too (a filter that writes -inf into the logits it was given and returns them passed it)
        given = [
            (j, value.clone()) for j, value in enumerate(full) if "tensor" in specs[j] and type(value) is torch.Tensor
        ]
        given_dicts = [  # a state dict the judge made: its entries kept, unchanged
            (j, {key: t.clone() for key, t in value.items()})
            for j, value in enumerate(full)
            if "tensors" in specs[j] and type(value) is dict
        ]
        # ... and the models and lists it gave, but to a training loop (red-team round 10: a recompute_pattern that
        # folded 1/sqrt(d_head) into the module's W_Q once, and a make_batch that appended EOS to the caller's
        # lists, returned right answers and broke what they were given, with full marks)
        given_models = [
            (j, {key: t.detach().clone() for key, t in _STATE_DICT(value).items()})
            for j, value in enumerate(full)
            if isinstance(value, torch.nn.Module) and script not in _TRAINS_ITS_MODEL
        ]
        given_lists = [(j, copy.deepcopy(value)) for j, value in enumerate(full) if "ints" in specs[j]]
        keywords = dict(zip(names, full[len(full) - len(names) :], strict=True))
        positional = full[: len(full) - len(names)]
        fn = build_module(probe["target"], target, probe, tensors) if probe["kind"] == "module" else target
        if script is not None:
            fn = functools.partial(SCRIPTS[script], fn)
            if getattr(SCRIPTS[script], "wants_namespace", False):
                fn = functools.partial(fn, namespace=namespace)
        with torch.no_grad():
            out = fn(*positional, **keywords)
        if probe.get("output") == "param_groups":
            out = param_group_decay(out, positional[0])
        result = _outputs(probe, out)
        for j, before in given_dicts:
            now = full[j]
            if set(now) != set(before) or any(not _EQUAL(now[key], t) for key, t in before.items()):
                raise ProbeError(
                    f"{probe['target']} changed the state dict it was given (argument {j + 1}): read it, build a "
                    "new one (no pop, no del, no in-place change)"
                )
        for j, before in given_models:  # what it had: a buffer it adds (a cached mask) is its own business
            now = {key: t.detach() for key, t in _STATE_DICT(full[j]).items()}
            changed = [key for key, t in before.items() if key not in now or not _EQUAL(now[key], t)]
            if changed:
                raise ProbeError(
                    f"{probe['target']} changed the model it was given (argument {j + 1}) in place, e.g. its "
                    f"{changed[0]}: leave its weights as they are and compute into new tensors"
                )
        for j, before in given_lists:
            if full[j] != before:
                raise ProbeError(
                    f"{probe['target']} changed the lists it was given (argument {j + 1}) in place: build new ones "
                    "(list + [x], not .append or .insert on the caller's)"
                )
        for j, spec in enumerate(specs):  # a HookedTransformer the judge made: no hook left on it
            if spec.get("hooked"):
                left = [point.name for point in full[j].hook_dict.values() if point.fwd_hooks or point.bwd_hooks]
                if left:
                    raise ProbeError(
                        f"{probe['target']} left {len(left)} hook(s) on the model (e.g. on {left[0]}): "
                        "run_with_hooks removes its hooks itself; add_hook needs reset_hooks() afterwards"
                    )
        for j, before in given:
            if not _EQUAL(full[j], before):
                which = f"`{names[j - len(positional)]}`" if j >= len(positional) else f"argument {j + 1}"
                raise ProbeError(
                    f"{probe['target']} changed its input ({which}) in place: compute into a new tensor "
                    "(x = x - mean, x.masked_fill(...); not x -= mean, x.masked_fill_(...) or x[...] = ...)"
                )
        if _learner_modes() > modes_before:
            _drop_learner_modes()
            raise ProbeError(
                f"{probe['target']} left a torch function or dispatch mode active when it returned: its code would "
                "run in the judge's runner after the call, where nothing records it"
            )
        # Frozen here, inside the record: immutable bytes, which nothing run later can change (a mode left active
        # rewrote a returned tensor in place with torch's own layer norm while safetensors wrote it, after the
        # record had ended, and scored full marks)
        return _frozen(result)

    return call


def build_module(name: str, target, spec: dict, tensors: dict):
    """The learner's class `target` built with the spec's config and loaded strictly with the judge's weights."""
    import torch

    import harness

    if not (isinstance(target, type) and issubclass(target, torch.nn.Module)):
        raise ProbeError(f"{name} is not an nn.Module class")
    module = target(getattr(harness, spec.get("config_class", "Config"))(**spec["config"]))
    prefix = spec["weight_prefix"]
    weights = {key[len(prefix) :]: tensors[key].clone() for key in tensors if key.startswith(prefix)}
    # Strict on parameters: the same names and shapes as the course's. A buffer of the learner's own (a
    # constant, say) may stay as __init__ made it.
    own = dict(module.named_parameters())
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(module.state_dict()))
    if missing or unexpected:
        problems = []
        if unexpected:
            problems.append(f"{name} has no parameter {', '.join(map(repr, unexpected))}")
        if missing:
            problems.append(f"{', '.join(map(repr, missing))} of {name} not in the course's weights")
        raise ProbeError("could not load the judge's weights strictly: " + "; ".join(problems))
    try:
        module.load_state_dict(weights, strict=False)
    except RuntimeError as err:  # a parameter of another shape
        raise ProbeError(f"could not load the judge's weights: {str(err).strip()}") from None
    return module.eval()


def _made_up(past, seed: int, length: int):
    """A cache of `length` positions shaped as the model's own `past` (its containers, layout and dtypes: positions
    on dimension 1, as the course's) with random keys and values drawn from `seed`: no tokens lead to it, so only a
    model that reads the cache it is given gets a call after it right."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def like(t):
        if not isinstance(t, torch.Tensor) or t.dim() < 2:
            return t
        shape = (t.shape[0], length, *t.shape[2:])
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(t.dtype)

    def rebuilt(container, items):
        try:
            return container(*items) if hasattr(container, "_fields") else container(items)  # a namedtuple's too
        except TypeError:
            return tuple(items)

    return rebuilt(type(past), [rebuilt(type(layer), [like(t) for t in layer]) for layer in past])


def _after_made_up(call):
    """The logits of a call after a made-up cache, or no logits where it raised (a cache laid out otherwise than the
    course's fails on the cached keys first, and says so)."""
    import torch

    try:
        return _plain(call(), "the logits")
    except Exception:  # noqa: BLE001 - compared as no logits: the message names the made-up cache
        return torch.empty(0)


def kv_steps(model, tokens, start: int, n_ctx: int) -> dict:
    """A KV-cached model run as generation runs it, and at the context's edge: `tokens[:, :start]` in one call, then
    each later token alone with the cache (every position's logits, "one_at_a_time"); the keys and values cached at
    layer 0 after them; the last two tokens after a cache of random keys and values shaped as the model's
    ("after_a_made_up_cache", `_made_up`: a model that recomputes from tokens it kept gets it wrong); every token
    after the first in one call after the first is cached ("at_once_after_cache"); the context filled to `n_ctx`
    exactly ("fills_n_ctx") and whether one token more raised a ValueError naming
    n_ctx ("past_n_ctx_refused": 1 or 0)."""
    import torch

    logits, past = model(tokens[:, :start])
    outs = [logits]
    for i in range(start, tokens.shape[1]):
        logits, past = model(tokens[:, i : i + 1], past)
        outs.append(logits)
    out = {"one_at_a_time": torch.cat(outs, dim=1), "layer0_keys": past[0][0], "layer0_values": past[0][1]}
    out["after_a_made_up_cache"] = _after_made_up(
        lambda: model(tokens[:, -2:], _made_up(past, int(tokens.sum()), max(1, tokens.shape[1] - 2)))[0]
    )
    _, first = model(tokens[:, :1])
    out["at_once_after_cache"] = model(tokens[:, 1:], first)[0]
    fill = tokens.repeat(1, n_ctx // tokens.shape[1] + 1)[:, : n_ctx - tokens.shape[1]]
    if fill.shape[1]:
        out["fills_n_ctx"], past = model(fill, past)
    try:
        model(tokens[:, :1], past)
        refused = 0
    except ValueError as err:
        refused = int("n_ctx" in str(err))
    except Exception:  # noqa: BLE001 - any other failure is not the refusal asked for
        refused = 0
    out["past_n_ctx_refused"] = torch.tensor(refused)
    return out


def _positions(model):
    """(the cache's length, the new positions) of every forward a `kv_prefix_lm` ran, as a tensor [forwards 2] (empty
    for the feeder's proxy: the feeder keeps that record, and the judge reads it there)."""
    import torch

    try:  # whatever a learner set on the proxy: the judge reads the feeder's record there, not this one
        pairs = list(getattr(model, "positions", []))[:MAX_DICT_ENTRIES]
        return torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2)
    except (TypeError, ValueError, RuntimeError):
        return torch.zeros((0, 2), dtype=torch.int64)


def cached_steps(cached_generate, model, tokens, other, new_tokens: int) -> dict:
    """`cached_generate` run twice on one stand-in (`kv_prefix_lm`), on two prompts: each call's tokens ("tokens",
    "again"); then on the first prompt with as many new tokens as bring it to n_ctx + 1 positions ("edge": the last
    new token needs no forward of its own, so the model never sees more than n_ctx; "edge_raised", what it raised,
    where it did); and the new positions of every forward ("positions"): what tells a generation that uses its
    cache."""
    import torch

    getattr(model, "positions", []).clear()
    first = cached_generate(model, tokens, new_tokens)
    try:
        again = cached_generate(model, other, new_tokens)
    except Exception as err:  # noqa: BLE001 - what the second call raised is what the judge reports
        raise ProbeError(
            f"cached_generate worked on a first call and raised on a second call with another prompt on the same "
            f"model: {type(err).__name__}: {err}"
        ) from None
    out = {"tokens": first, "again": again}
    fits = model.cfg.n_ctx + 1 - tokens.shape[1]
    try:
        out["edge"] = cached_generate(model, tokens, fits)
    except Exception as err:  # noqa: BLE001 - reported as what it is, once the positions fed have been judged
        said = (
            f"cached_generate raised {type(err).__name__} ({str(err)[:120]}) with {fits} new tokens, which bring the "
            f"prompt to n_ctx + 1 = {model.cfg.n_ctx + 1} positions: the last new token needs no forward of its own"
        )
        out["edge_raised"] = torch.tensor(list(said.encode()), dtype=torch.uint8)
    return {**out, "positions": _positions(model)}


# One `beam_cases` probe's searches: a mistake that changes 1 in 30 shows in all but about 1 job in a million
# (measured over 30 seeds: a stopping rule off under early_stopping="never" changed 13.7 of 400 on average; a bound
# read from a second live beam raises where one beam is drawn, 1 case in 8)
BEAM_CASES = 400


def beam_cases(beam_search, seed: int, _nudge: tuple[int, float] | None = None) -> dict:
    """`beam_search` on BEAM_CASES small random searches drawn from `seed` (the judge's, secret): a model over six
    tokens, the last <|endoftext|>, a prompt of 1 to 3 tokens, 2 or 3 beams, 2 to 6 new tokens, and every
    setting the search takes (length penalties of either sign, each early_stopping, n-gram bans of 0 to 4) in every
    combination. Chosen cases left searches whose stopping rule was off under early_stopping="never", or that never
    banned single tokens, with full marks (a mutation sweep); among this many, such a mistake shows. Each case's
    tokens are an output named by its settings. `_nudge` (the judge's, outside): (seed, scale) of a random change to
    every table, the same cases otherwise (`judge._beam_cases`)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    nudges = None if _nudge is None else torch.Generator().manual_seed(_nudge[0])

    def pick(options):
        return options[int(torch.randint(len(options), (), generator=gen))]

    out = {}
    for k in range(BEAM_CASES):
        # a model whose logits depend on the whole prefix (`prefix_lm`, 61 rows): under a bigram model, sequences of
        # the same steps in another order tie exactly, and rounding chose between them (a right search written in
        # float64 lost its point)
        table = torch.randn(61, 6, generator=gen) * 1.5
        # <|endoftext|> likelier in most: hypotheses finish at many lengths, and the finished set fills early, where
        # the stopping rules decide (long searches, positive penalties and "never" more often than the rest)
        table[:, 5] += pick([0.0, 1.0, 2.0, 2.0])
        if nudges is not None:
            table = table + _nudge[1] * torch.randn(table.shape, generator=nudges)
        tokens = torch.randint(0, 5, (1, pick([1, 2, 3])), generator=gen)
        # 1 to 8 beams (4 at most drawn, a search capped at 4 beams passed: red-team round 33; 5 is a common choice)
        beams, new, ngram = pick([1, 2, 2, 3, 3, 4, 5, 8]), pick([2, 3, 4, 5, 6, 6]), pick([0, 1, 2, 3, 4])
        penalty, stop = pick([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 2.0, 3.0]), pick([False, True, "never", "never"])
        found = beam_search(prefix_lm(table), tokens, beams, new, ngram, 5, length_penalty=penalty, early_stopping=stop)
        settings = f"num_beams={beams}, max_new_tokens={new}, no_repeat_ngram_size={ngram}, length_penalty={penalty}"
        out[f"case {k} ({settings}, early_stopping={stop!r}, prompt {tokens[0].tolist()})"] = _plain(
            found, "the tokens"
        )
    return out


def beam_widths(select_beams, seed: int) -> dict:
    """`select_beams` at every width from 1 to 8 beams, on scores drawn from `seed` (the judge's, secret): plain
    scores, scores where every live beam's <|endoftext|> ranks above all else (as many candidates finish as there are
    beams, and exactly num_beams others must go on), the last step, and rows with one finite score each (fewer
    candidates than 2 * num_beams). Each output is named by its width and scores (a select_beams that kept
    `num_beams + min(num_beams, 3)` candidates, right at the 2 and 3 beams drawn before, had full marks: red-team
    round 35)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for beams in range(1, 9):
        d_vocab = 12 + int(torch.randint(20, (), generator=gen))
        eos = int(torch.randint(d_vocab, (), generator=gen))
        for design in ("plain", "ends_first", "last_step", "banned", "one_token"):
            scores = torch.randn(beams, d_vocab, generator=gen) - 4
            if design == "one_token":  # a vocabulary of one: fewer candidates than 2 * num_beams (a topk of
                # 2 * num_beams raised there: mutation sweep 9)
                scores = scores[:, :1]
            if design == "ends_first":
                scores[:, eos] = scores.max() + 1 + torch.rand(beams, generator=gen)
            if design == "banned":
                keep = torch.randint(d_vocab, (beams,), generator=gen)
                kept = scores[torch.arange(beams), keep]
                scores = torch.full_like(scores, float("-inf"))
                scores[torch.arange(beams), keep] = kept
            go_on, done = select_beams(scores, beams, eos, last_step=design == "last_step")
            out[f"num_beams={beams} ({design}) go_on"] = _plain(go_on, "the live candidates")
            out[f"num_beams={beams} ({design}) done"] = _plain(done, "the finished candidates")
    return out


def decode_once(decode, model, src, max_len: int):
    """`decode`'s tokens, refused if it encoded the source other than once (the source does not change while it
    decodes: the checks count the encoder's calls)."""
    model.encode_calls = 0
    out = decode(model, src, max_len)
    if model.encode_calls != 1:
        raise ProbeError(
            f"greedy_decode called model.encode {model.encode_calls} times: encode the source once, before the "
            "loop, and pass the same memory to model.decode at every step"
        )
    return out


def padded_generate_steps(padded_generate, model, prompts, new_tokens: int, eos: int, pad: int, n_ctx: int) -> dict:
    """`padded_generate` on a padded stand-in (`kv_prefix_lm`) and `prompts` ("tokens"), then with as many new tokens
    as bring the longest prompt to n_ctx + 1 positions ("edge"): the last new token needs no forward of its own, so
    the model never sees more than n_ctx; and the new positions of every forward of both calls ("positions")."""
    getattr(model, "positions", []).clear()
    first = padded_generate(model, [list(p) for p in prompts], new_tokens, eos, pad)
    fits = n_ctx + 1 - max(len(p) for p in prompts)
    try:
        edge = padded_generate(model, [list(p) for p in prompts], fits, eos, pad)
    except Exception as err:  # noqa: BLE001 - reported as what it is
        raise ProbeError(
            f"padded_generate raised {type(err).__name__} ({str(err)[:120]}) with {fits} new tokens, which bring the "
            f"longest prompt to n_ctx + 1 = {n_ctx + 1} positions: the last new token needs no forward of its own"
        ) from None
    return {"tokens": first, "edge": edge, "positions": _positions(model)}


def _same_output(a, b) -> bool:
    """Whether two outputs (tensors, or tuples of them) are equal, entry for entry."""
    import torch

    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same_output(x, y) for x, y in zip(a, b))
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def same_seed_twice(sample, *args, **kwargs):
    """`sample`'s output, made twice from generators in the same state (the `generator` argument, by keyword or the
    last positional one): it must be the same twice, as the checks require, so that a seed reproduces a run."""
    import torch

    if isinstance(kwargs.get("generator"), torch.Generator):
        generator = kwargs["generator"]

        def again(other):
            return sample(*args, **{**kwargs, "generator": other})

    else:
        at = [i for i, arg in enumerate(args) if isinstance(arg, torch.Generator)]
        if not at:
            raise ProbeError("the judge passed no generator")  # the judge's own mistake: no learner's
        generator = args[at[-1]]

        def again(other):
            return sample(*args[: at[-1]], other, *args[at[-1] + 1 :], **kwargs)

    state = generator.get_state()
    first = sample(*args, **kwargs)
    copy = torch.Generator()
    copy.set_state(state)
    if not _same_output(first, again(copy)):
        raise ProbeError(
            "two calls with generators in the same state drew differently: draw with the `generator` given "
            "(torch.multinomial(..., generator=generator), torch.randint(..., generator=generator)), so that a "
            "seed reproduces a run"
        )
    return first


def unseeded_twice(sample, *args, **kwargs):
    """`sample`'s output, called with no generator (its default: torch's global one), and called again: the two
    must differ, as two draws of a random process do (a default of `torch.Generator().manual_seed(0)` drew the same
    every call, and passed while every probe gave a generator: red-team round 49). For outputs of many random
    entries only (08's segments: tens of rows of tens of tokens), which two right calls never draw alike; a sampler's
    calls are judged outside, against each other (`judge._compare_samples`)."""
    first = sample(*args, **kwargs)
    if _same_output(first, sample(*args, **kwargs)):
        raise ProbeError(
            "two calls without a generator drew the same: with none given, draw from torch's global generator (no "
            "generator= argument, or generator=None), never from one seeded afresh at each call"
        )
    return first


def last_new_tokens(generate, *args, **kwargs):
    """The last column of `generate`'s tokens (one new token per row), made twice from generators in the same state
    (`same_seed_twice`): the draws the judge compares with the distribution they must come from."""
    return _plain(same_seed_twice(generate, *args, **kwargs), "the tokens")[:, -1]


def new_tokens(generate, tokens_model, tokens, *args, **kwargs):
    """The new columns of `generate`'s tokens, made twice from generators in the same state (`same_seed_twice`)."""
    return _plain(same_seed_twice(generate, tokens_model, tokens, *args, **kwargs), "the tokens")[:, tokens.shape[1] :]


def after_a_first_call(sample, *args, **kwargs):
    """`same_seed_twice`'s output from the generator given, once a first call has drawn with it: a call must leave
    its generator further on, as drawing with it does (a sampler that drew from a copy of the generator's state left
    it as it was, and drew the same numbers at every step of a generation)."""
    sample(*args, **kwargs)
    return same_seed_twice(sample, *args, **kwargs)


# The key bias adds the same number to every score of a query, which softmax ignores: its gradient is 0 in exact
# arithmetic and rounding noise in floats, which AdamW scales up to steps the size of the learning rate. So its
# trained value tells nothing about a loop, and two right loops that round differently (a gradient clip written by
# hand) disagree on it by more than any tolerance; the trained weights the judge compares leave it out.
def _informative(name: str) -> bool:
    return not name.endswith("b_K")


def trained_weights(train, model, train_windows, val_windows, args) -> dict:
    """`train` run on `model` (its log kept quiet), then the model's weights: what the judge compares."""
    import torch

    with torch.enable_grad():
        train(model, train_windows, val_windows, args, log=lambda *_: None)
    return {name: p.detach() for name, p in model.named_parameters() if _informative(name)}


def addition_problems(key: int, n: int, n_digits: int, seed: int):
    """The judge's stand-in for `addition_data(n, n_digits, seed)`: `n` token rows "digits + digits = digits" with the
    answer's mask, drawn from a generator seeded by the judge's `key` and `seed` together. A function of the seed
    asked for, made the same way in the child and in the judge: the weights a loop trains are then a record of the
    seeds it asked for, which the judge replays outside (`addition_run`)."""
    import hashlib

    import torch

    mixed = hashlib.blake2b(f"{key}:{seed}".encode(), digest_size=8).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(mixed, "big") >> 1)
    tokens = torch.randint(10, (n, 3 * n_digits + 3), generator=gen)  # [n seq]
    tokens[:, n_digits], tokens[:, 2 * n_digits + 1] = 10, 11  # PLUS, EQUALS
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, -(n_digits + 1) :] = True
    return tokens, mask


def addition_run(train_addition, model, args, n_digits: int, key: int, *, namespace: dict, claimed=None) -> dict:
    """The learner's addition loop run on copies of `model`: with `args`, with `args.seed + 1`, and with `args`
    again (a seed reproduces a run: the same calls and weights as the first). While it
    runs, the notebook's `addition_data` answers each call with the judge's problems for the seed asked for
    (`addition_problems`), and records the call. Returns each run's calls as (n, n_digits, seed) rows
    ("calls.<run>"), losses ("losses.<run>") and trained weights ("w<run>.<name>").

    The record is the learner's to forge, the weights are not: the judge replays the course's loop outside with
    `claimed` (the calls the child reported), each run's k-th call then answered with the problems of the k-th
    claimed one, and compares the weights and losses. A loop that asked for one seed and reported others trained on
    problems its record does not show."""
    import contextlib
    import copy
    import inspect
    import io
    import numbers
    import types

    import torch

    calls: list[list[int]] = []
    run = 0

    def addition_data(n, n_digits, seed=0):
        whole = (numbers.Integral, torch.Tensor)  # a numpy integer is one; a tensor of one element too
        if not all(isinstance(x, whole) and not isinstance(x, bool) for x in (n, n_digits, seed)) or any(
            isinstance(x, torch.Tensor) and (x.numel() != 1 or x.is_floating_point()) for x in (n, n_digits, seed)
        ):
            raise ProbeError("addition_data was called with arguments that are not integers")
        asked = [int(n), int(n_digits), int(seed)]
        if not all(-(2**63) <= x < 2**63 for x in asked):
            raise ProbeError(f"addition_data was called with {asked}: integers of 64 bits are due")
        calls.append(asked)
        if claimed is not None:
            if len(calls) > len(claimed[run]):
                raise ProbeError("the course's loop asked for more batches than the learner's record holds")
            asked = [int(x) for x in claimed[run][len(calls) - 1]]
        return addition_problems(key, *asked)

    # The name the loop looks up: in the notebook's namespace, and in its function's globals where they differ; and
    # the notebook's function itself, its code made a call of the stand-in's, wherever the loop holds it (a default
    # argument, an alias bound before: two honest loops asked the real one for their problems)
    scopes = {id(namespace): namespace}
    function_globals = getattr(inspect.unwrap(train_addition), "__globals__", None)
    if isinstance(function_globals, dict):
        scopes[id(function_globals)] = function_globals
    originals = {ident: scope.get("addition_data") for ident, scope in scopes.items()}
    given = [f for f in originals.values() if isinstance(f, types.FunctionType) and f.__closure__ is None]
    codes = {id(f): (f, f.__code__) for f in given}
    second_args = copy.copy(args)
    second_args.seed = args.seed + 1
    # each step's gradient norm is recorded ("grad_norm.<run>", `_step_norms`): the first run's clip, 0.05 to 0.3,
    # binds at every step (a clip of another size or none shows), the second run's never does (a loss of another
    # scale shows)
    second_args.grad_clip = NEVER_CLIPS
    runs = (args, second_args) if claimed is not None and len(claimed) == 2 else (args, second_args, args)
    nets = [copy.deepcopy(model) for _ in runs]
    out = {}
    norms: list[float] = []
    watches = [_step_norms(net, norms) for net in nets]
    hooks = [hook(step) for watch in watches for hook, step in zip(_step_hooks(), watch[:2], strict=True)]
    hooks += [types.SimpleNamespace(remove=watch[2]) for watch in watches]
    try:
        for scope in scopes.values():
            scope["addition_data"] = addition_data
        for function, _ in codes.values():
            function.__globals__[_STAND_IN_NAME] = addition_data
            function.__code__ = _calls_the_stand_in.__code__
        for run, (net, run_args) in enumerate(zip(nets, runs)):
            calls.clear()
            norms.clear()
            with torch.enable_grad(), contextlib.redirect_stderr(io.StringIO()):  # the loop's progress bar
                losses = train_addition(net, run_args, n_digits)
            if not isinstance(losses, (list, tuple)) or not all(isinstance(x, (int, float)) for x in losses):
                raise ProbeError("train_addition did not return a list of floats (the loss of every step)")
            out[f"grad_norm.{run}"] = torch.tensor(norms, dtype=torch.float64)
            out[f"calls.{run}"] = torch.tensor(calls, dtype=torch.int64).reshape(-1, 3)
            out[f"losses.{run}"] = torch.tensor([float(x) for x in losses], dtype=torch.float64)
            out |= {f"w{run}.{name}": p.detach().clone() for name, p in net.named_parameters() if _informative(name)}
    finally:
        for hook in hooks:
            hook.remove()
        for ident, scope in scopes.items():
            scope["addition_data"] = originals[ident]
        for function, code in codes.values():
            function.__code__ = code
            function.__globals__.pop(_STAND_IN_NAME, None)
    return out


_STAND_IN_NAME = "__judges_addition_data__"


def _calls_the_stand_in(*args, **kwargs):
    """The code the notebook's `addition_data` runs while `addition_run` runs: a call of the judge's stand-in, looked
    up in that function's own globals."""
    return globals()["__judges_addition_data__"](*args, **kwargs)  # a literal: no name of this module there


addition_run.wants_namespace = True


def padded_steps(model, prompts: list[list[int]], new_tokens, pad: int, n_ctx: int) -> dict:
    """A model that takes an attention mask, run as padded generation runs it: the prompts padded on the left with
    `pad` in one call, then each column of `new_tokens` with the cache and a mask one column longer ("padded_steps":
    the logits of every position, [batch longest+new d_vocab], the pads' set to 0: nothing reads them, and any
    value is right); one more column after a cache of random keys and values shaped as the model's
    ("after_a_made_up_cache", `_made_up`); then the context's edge, as `kv_steps`: filled to `n_ctx` exactly
    ("fills_n_ctx"), and whether one token more raised a ValueError naming n_ctx ("past_n_ctx_refused")."""
    import torch

    longest = max(len(prompt) for prompt in prompts)
    tokens = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        tokens[row, longest - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, longest - len(prompt) :] = True
    logits, past = model(tokens, mask.clone())
    outs = [_plain(logits, "the logits").masked_fill(~mask[..., None], 0.0)]
    for i in range(new_tokens.shape[1]):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits, past = model(new_tokens[:, i : i + 1], mask.clone(), past)
        outs.append(_plain(logits, "the logits"))
    out = {"padded_steps": torch.cat(outs, dim=1)}
    out["after_a_made_up_cache"] = _after_made_up(  # the mask's last column is the new token's
        lambda: model(new_tokens[:, :1], mask.clone(), _made_up(past, int(new_tokens.sum()), mask.shape[1] - 1))[0]
    )
    fill = new_tokens.repeat(1, n_ctx)[:, : n_ctx - mask.shape[1]]
    if fill.shape[1]:
        mask = torch.cat([mask, torch.ones_like(fill, dtype=torch.bool)], dim=1)
        out["fills_n_ctx"], past = model(fill, mask.clone(), past)
    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    try:
        model(new_tokens[:, :1], mask.clone(), past)
        refused = 0
    except ValueError as err:
        refused = int("n_ctx" in str(err))
    except Exception:  # noqa: BLE001 - any other failure is not the refusal asked for
        refused = 0
    out["past_n_ctx_refused"] = torch.tensor(refused)
    return out


def model_lengths(generate, model, tokens, n_new: int) -> dict:
    """`generate(model, tokens, n_new)` ("tokens") and the lengths of the sequences the model was run on ("lengths"):
    what tells a model fed the last token only, or a window, from one fed the whole sequence."""
    import torch

    lengths: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args: lengths.append(int(args[0].shape[-1])))
    try:
        out = generate(model, tokens, n_new)
    finally:
        handle.remove()
    return {"tokens": out, "lengths": torch.tensor(lengths[:MAX_DICT_ENTRIES], dtype=torch.int64)}


def _hooks_on(model) -> list[str]:
    """The modules of `model` that hold a hook, and torch's global module hooks: what a forward would still run."""
    import torch

    left = [
        f"{name or 'the model'} ({n})"
        for name, module in model.named_modules()
        if (n := len(module._forward_hooks) + len(module._forward_pre_hooks) + len(module._backward_hooks))
    ]
    modules = torch.nn.modules.module
    n_global = sum(
        len(getattr(modules, name, {}))
        for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks")
    )
    return left + [f"every module ({n_global} global hooks)"] * bool(n_global)


def detached_cache(cache_activations, model, tokens) -> dict:
    """`cache_activations(model, tokens)` with gradients on (so that a tensor kept in the graph shows: it requires
    grad), refused if it left a hook on the model or stored a tensor that requires grad, as the check refuses it."""
    from collections.abc import Mapping

    import torch

    with torch.enable_grad():
        out = cache_activations(model, tokens)
    left = _hooks_on(model)
    if left:
        raise ProbeError(
            f"cache_activations left hooks on {', '.join(left[:3])}{' ...' if len(left) > 3 else ''}: every later "
            "forward would still run them. Keep the handles register_forward_hook returns and call handle.remove() "
            "in a `finally:` block"
        )
    if isinstance(out, Mapping):
        attached = [str(key) for key, value in out.items() if isinstance(value, torch.Tensor) and value.requires_grad]
        if attached:
            raise ProbeError(
                f"cache_activations stored tensors that still require grad ({', '.join(attached[:3])}): detach them "
                "(a cache must not keep the graph alive)"
            )
    return out


def train_batches(train, model, train_windows, val_windows, args, again: bool = True) -> dict:
    """`train` run on `model`, the batches the model was trained on: each token batch its embedding saw while the
    model was in training mode ("batch.<i>"; `evaluate` puts the model in eval mode), and its trained weights
    ("w.<name>"). The record is the learner's to forge, the weights are not: the judge replays the course's loop on
    the recorded batches outside (`ReplayedWindows`) and compares the weights, so a loop that showed the record
    other batches than it trained on fails. `again`: then from the same start with the same arguments ("again.<i>",
    "wa.<name>": a seed reproduces a run) and with `args.seed + 1` ("other.<i>", "wo.<name>": the seed is used)."""
    import copy

    start = copy.deepcopy(model)
    batches, weights, norms = _recorded_training(train, model, train_windows, val_windows, args)
    out = {f"batch.{i}": batch for i, batch in enumerate(batches)} | {f"w.{k}": w for k, w in weights.items()}
    out["grad_norm.w"] = norms
    if again:
        other_args = copy.copy(args)
        other_args.seed = args.seed + 1
        other_args.grad_clip = NEVER_CLIPS  # its gradients' scale shows (`addition_run`)
        for tag, run_args in (("again", args), ("other", other_args)):
            batches, weights, norms = _recorded_training(
                train, copy.deepcopy(start), train_windows, val_windows, run_args
            )
            out |= {f"{tag}.{i}": batch for i, batch in enumerate(batches)}
            out |= {f"w{tag[0]}.{k}": w for k, w in weights.items()}
            out[f"grad_norm.w{tag[0]}"] = norms
    return out


def _step_hooks() -> tuple:
    """torch's registrations of a step's hooks for every optimizer, in `_step_norms`' order (before, after)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    return register_optimizer_step_pre_hook, register_optimizer_step_post_hook


NEVER_CLIPS = 1e6  # a clip no gradient of the judge's models reaches (their norms are about 2 to 6)


_USED_GRADIENTS: list = []  # listeners of `_step_norms`, told each gradient Adam's step takes


def _hear_used_gradients() -> None:
    """Adam's (and so AdamW's) `_init_group`, which gathers the gradients a step uses, wrapped once per process to
    tell `_USED_GRADIENTS` what it gathered: read where the step takes them, after every hook of the step has run."""
    import torch

    original = torch.optim.Adam.__dict__.get("_init_group")
    if original is None or getattr(original, "judged", False):
        return

    def _init_group(self, group, params_with_grad, grads, *rest, **kwargs):
        out = original(self, group, params_with_grad, grads, *rest, **kwargs)
        for listener in _USED_GRADIENTS:
            listener(params_with_grad, grads)
        return out

    _init_group.judged = True
    torch.optim.Adam._init_group = _init_group


def _step_norms(model, norms: list) -> tuple:
    """Optimizer-step hooks (before, after) that append the norm of the gradient each step of an optimizer of
    `model`'s parameters used: AdamW's step is blind to a gradient's scale, so a clip of another size, none, or a
    loss of another scale (summed over rows, parts of a batch not divided) trains the course's weights; the gradient
    it stepped with does not (mutation sweep 11: all five passed, their weights the course's). For Adam and AdamW,
    the gradients their step gathers (`_hear_used_gradients`), whatever the step's own hooks did to them before (a
    post-hook that rescaled them after the step, red-team round 41; a clip in a pre-hook, honest, and one undone
    there, round 42); for another optimizer, `.grad` before the step (after it, for a step given a closure). The
    third value removes the listener."""
    import torch

    _hear_used_gradients()
    mine = {id(p) for p in model.parameters()}
    step = {"squares": 0.0, "heard": False, "norm": None}

    def ours(optimizer) -> bool:
        return any(id(p) in mine for group in optimizer.param_groups for p in group["params"])

    def norm() -> float:
        grads = [p.grad.detach().double().norm() for p in model.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0

    def heard(params, grads) -> None:
        for p, g in zip(params, grads):
            if id(p) in mine:
                step["squares"] += float(g.detach().double().pow(2).sum())
                step["heard"] = True

    def before(optimizer, args=(), kwargs=None):
        if ours(optimizer):
            given = args[1:] if args and args[0] is optimizer else args
            closure = (given and callable(given[0])) or callable((kwargs or {}).get("closure"))
            step.update(squares=0.0, heard=False, norm=None if closure else norm())

    def after(optimizer, *_):
        if ours(optimizer):
            norms.append(
                step["squares"] ** 0.5 if step["heard"] else step["norm"] if step["norm"] is not None else norm()
            )

    _USED_GRADIENTS.append(heard)
    return before, after, lambda: _USED_GRADIENTS.remove(heard) if heard in _USED_GRADIENTS else None


def _recorded_training(train, model, train_windows, val_windows, args) -> tuple[list, dict, object]:
    """`train` run on `model` (its log kept quiet): the batch of each optimizer step, and the trained weights. A
    step's batch is what the model's embedding saw in training mode with gradients on since the step before, all of
    it where those rows make one batch of args.batch_size (gradients accumulated over parts of a batch are the
    batch's: red-team round 39), else the last of it (a forward run twice, once for the log). Where no optimizer of
    the model's parameters steps, each forward counts as a step's batch."""
    import types

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    seen: list = []
    steps: list = []
    norms: list = []
    params = {id(p) for p in model.parameters()}

    def record(module, inputs):
        if module.training and torch.is_grad_enabled() and len(seen) < MAX_DICT_ENTRIES // 4:
            seen.append(inputs[0].detach().clone())

    def stepped(optimizer, *_):
        if any(id(p) in params for group in optimizer.param_groups for p in group["params"]):
            steps.append(len(seen))

    embed = getattr(model, "embed", None)
    if not isinstance(embed, torch.nn.Module):
        raise ProbeError("the model has no `embed` module")  # the judge's own model: no learner's mistake
    watch = _step_norms(model, norms)
    handles = (
        embed.register_forward_pre_hook(record),
        register_optimizer_step_post_hook(stepped),
        *(hook(step) for hook, step in zip(_step_hooks(), watch[:2], strict=True)),
        types.SimpleNamespace(remove=watch[2]),
    )
    try:
        with torch.enable_grad():
            train(model, train_windows, val_windows, args, log=lambda *_: None)
    finally:
        for handle in handles:
            handle.remove()
    batches = seen
    if steps:
        parts = [seen[start:end] for start, end in zip([0, *steps[:-1]], steps) if end > start]
        whole = [torch.cat(part) if _one_batch(part, args.batch_size) else part[-1] for part in parts]
        batches = whole + seen[steps[-1] :]  # forwards after the last step: shown, and a count the judge rules on
    if not batches:
        raise ProbeError("train never ran the model in training mode with gradients on a batch")
    weights = {name: p.detach().clone() for name, p in model.named_parameters() if _informative(name)}
    return batches, weights, torch.tensor(norms, dtype=torch.float64)


def _one_batch(parts: list, rows: int) -> bool:
    """Do the forwards of one step make one batch of `rows` rows between them (parts of one batch)?"""
    return (
        len(parts) > 1
        and all(p.dim() == 2 and p.shape[1:] == parts[0].shape[1:] for p in parts)
        and sum(len(p) for p in parts) == rows
    )


class ReplayedWindows:
    """What the judge hands the course's `train` to replay a learner's batches: as long as the real training windows,
    indexed by any rows, it gives the recorded batches in order."""

    def __init__(self, batches: list, n_windows: int):
        self.batches, self.n_windows, self.given = batches, n_windows, 0

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, rows):
        if self.given >= len(self.batches):
            raise ProbeError("the course's loop asked for more batches than the learner's record holds")
        self.given += 1
        return self.batches[self.given - 1].clone()


def initial_stats(cls, cfg) -> dict:
    """The mean and standard deviation of every parameter of `cls(cfg)` as its __init__ leaves it."""
    import torch

    module = cls(cfg)
    if not isinstance(module, torch.nn.Module):
        raise ProbeError(f"{getattr(cls, '__name__', cls)}(cfg) is not an nn.Module")
    out = {}
    for name, param in module.named_parameters():
        values = param.detach().double().flatten()
        out[f"{name}.mean"], out[f"{name}.std"] = (
            values.mean(),
            values.std() if values.numel() > 1 else values.new_zeros(()),
        )
    if not out:
        raise ProbeError(f"{getattr(cls, '__name__', cls)}(cfg) has no parameters")
    return out


def embed_and_unembed(model, tokens, x) -> dict:
    """A tied embedding's two directions: `model(tokens)` ("forward") and `model.unembed(x)` ("unembed")."""
    unembed = getattr(model, "unembed", None)
    if not callable(unembed):
        raise ProbeError("the module has no method `unembed`: keep the one given in the notebook")
    return {"forward": model(tokens), "unembed": unembed(x)}


def unembed_gradient(model, x) -> dict:
    """`parameter_gradient` through a tied embedding's output layer, `model.unembed(x)`: training runs backward
    through it as through the forward (an unembed detached from W_E passed while only the forward's gradient was
    judged: mutation sweep 11)."""
    unembed = getattr(model, "unembed", None)
    if not callable(unembed):
        raise ProbeError("the module has no method `unembed`: keep the one given in the notebook")
    return parameter_gradient(model, x, _forward=unembed)


def _differentiable(args: tuple) -> tuple[list, dict]:
    """The arguments, each plain floating-point tensor among them a fresh leaf that requires a gradient, and those
    leaves by position."""
    args = [a.detach().clone().requires_grad_(True) if _is_float_tensor(a) else a for a in args]
    return args, {j: a for j, a in enumerate(args) if _is_float_tensor(a)}


def _is_float_tensor(value) -> bool:
    import torch

    return type(value) is torch.Tensor and value.is_floating_point()


def parameter_gradient(model, *args, _forward=None, **kwargs) -> dict:
    """A module's output ("output") and the gradients of its parameters ("grad.<name>") and of its floating-point
    inputs ("grad.input.<j>") for a fixed random cotangent of the output's shape (zeros where none reaches): what
    training needs from a module besides its values. The parameters alone let a LayerNorm whose statistics were
    detached, or computed in NumPy, through: its `w` and `b` act after them (red-team round 25). In training mode, as
    training calls it (every other probe is in eval mode: a LayerNorm that skipped its normalisation, and an MLP that
    detached its input, under `if self.training:`, had full marks: red-team round 36); the course's modules have no
    dropout, so both modes give the same. `_forward`: what is called in the module's stead (one of its methods)."""
    import torch

    args, inputs = _differentiable(args)
    model.train()
    with torch.enable_grad():
        out = (model if _forward is None else _forward)(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            raise ProbeError("the module's output is not a floating-point tensor")
        params = dict(model.named_parameters())
        # drawn in float32 whatever the output's type: the judge's float64 run of the course's module, which
        # measures its rounding (`judge._rounding_noise`), gets the same numbers
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(2026), dtype=torch.float32).to(
            out.dtype
        )
        if not out.requires_grad:
            raise ProbeError(
                "no gradient reaches the module's parameters from its output: compute it with torch operations on "
                "its parameters (no NumPy, .item(), .detach() or a tensor rebuilt from numbers)"
            )
        trained = {name: p for name, p in params.items() if p.requires_grad}  # a frozen one gets no gradient
        wrt = [*trained.values(), *inputs.values()]
        grads = torch.autograd.grad((out * cotangent).sum(), wrt, allow_unused=True)
    got = dict(zip([*trained, *(f"input.{j}" for j in inputs)], grads, strict=True))
    result = {"output": out.detach()}
    for name, value in [*params.items(), *((f"input.{j}", x) for j, x in inputs.items())]:
        result[f"grad.{name}"] = torch.zeros_like(value) if got.get(name) is None else got[name]
    return result


def input_gradient(fn, *args, _causal: bool = False, **kwargs) -> dict:
    """The gradient of a function's output with respect to each of its floating-point tensor arguments
    ("grad.input.<j>", zeros where none reaches), for a fixed random cotangent of the output's shape: a model's
    parts are trained through, so values alone are not the exercise (a GELU in NumPy, an attention pattern through
    a NumPy mask, head scores by `np.einsum`: right values, no gradient, full marks; red-team round 25).
    `_causal`: the cotangent is zero wherever a key comes after its query (`causal_input_gradient`)."""
    import torch

    args, inputs = _differentiable(args)
    with torch.enable_grad():
        out = fn(*args, **kwargs)
        if not _is_float_tensor(out):
            raise ProbeError("its output is not a floating-point tensor")
        if not out.requires_grad:
            raise ProbeError(
                "no gradient reaches its inputs from its output: compute it with torch operations on them (no "
                "NumPy, .item(), .detach() or a tensor rebuilt from numbers), so that a model built on it trains"
            )
        # drawn in float32 whatever the output's type: a float64 mask's cotangent is then the same numbers
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(2026), dtype=torch.float32).to(
            out.dtype
        )
        if _causal:
            cotangent = cotangent.tril()
        grads = torch.autograd.grad((out * cotangent).sum(), list(inputs.values()), allow_unused=True)
    return {
        f"grad.input.{j}": torch.zeros_like(x) if grad is None else grad
        for (j, x), grad in zip(inputs.items(), grads, strict=True)
    }


def causal_input_gradient(fn, *args, **kwargs) -> dict:
    """`input_gradient` of a causal mask, through the scores it keeps only: what reaches a masked score is the
    writer's choice (masked_fill stops it, adding -inf lets it through) and the softmax after it ignores it, but
    the scores it keeps must take their gradient back (a mask built in NumPy kept its point; red-team round 25)."""
    return input_gradient(fn, *args, _causal=True, **kwargs)


SMALL_WARMUPS = SMALL_SPANS = range(4)
SMALL_STEPS = range(9)


def small_schedules(lr_at, args):
    """`lr_at` at steps 0 to 8 of every schedule with a warm-up of 0 to 3 steps and a decay of 0 to 3 (`args`'s
    rate and floor) [16 9]: the edges of the schedule's domain, each one, where a special case or a bound off by
    one shows (a warm-up of none returning the peak rate, `step < warmup_steps - 1`, a decay over `max(2, ...)`
    steps had full marks while every warm-up drawn was of 2 or more and every decay of 2 or more: mutation sweep
    6)."""
    import dataclasses

    import torch

    rows = []
    for warmup in SMALL_WARMUPS:
        for span in SMALL_SPANS:
            schedule = dataclasses.replace(args, warmup_steps=warmup, max_steps=warmup + span)
            rows.append([float(lr_at(step, schedule)) for step in SMALL_STEPS])
    return torch.tensor(rows, dtype=torch.float64)


LAYOUTS = (
    "its input is not contiguous",
    "its input is a view at a storage offset",
    "its token ids are int32",
    "it runs under torch.inference_mode()",
    "it runs with gradients on",
)


def layouts(fn, *args, **kwargs) -> dict:
    """`fn`'s output ("output"), and its outputs on the same values stored or called another way (LAYOUTS): each
    tensor argument not contiguous, or a view at a storage offset, token ids as int32, the call under
    `torch.inference_mode()` or with gradients on (every other probe calls in one layout and mode: a LayerNorm that
    skipped its centring on a non-contiguous input, an `apply_temperature` that did nothing to `logits[:, -1]`, and
    an `Embed` that returned zeros for int32 ids had full marks: red-team round 37). A call that raises, or returns
    no tensor, leaves its entry out (an honest `.view` cannot take a non-contiguous input); the judge compares each
    entry with "output" (`judge._compare_layouts`)."""
    import contextlib

    import torch

    def strided(t):  # the same values in a storage of another order: not contiguous, from two dimensions on
        if t.dim() == 0:
            return None
        if t.dim() == 1:
            out = torch.empty(2 * t.shape[0], dtype=t.dtype)[::2]
        else:
            out = torch.empty(t.shape[::-1], dtype=t.dtype).permute(*reversed(range(t.dim())))
        return out.copy_(t)

    def offset(t):
        out = torch.empty(t.numel() + 7, dtype=t.dtype)[7:].view(t.shape)
        return out.copy_(t)

    def int32(t):
        return t.to(torch.int32) if t.dtype == torch.int64 else None

    def copies(change):
        changed = False

        def one(value):
            nonlocal changed
            if not isinstance(value, torch.Tensor):
                return value
            new = change(value) if change is not None else None
            changed |= new is not None
            return value.clone() if new is None else new

        return [one(a) for a in args], {k: one(v) for k, v in kwargs.items()}, changed

    out = {"output": _plain(fn(*args, **kwargs), "the output")}
    calls = [(strided, contextlib.nullcontext), (offset, contextlib.nullcontext), (int32, contextlib.nullcontext)]
    calls += [(None, torch.inference_mode), (None, torch.enable_grad)]
    for name, (change, mode) in zip(LAYOUTS, calls, strict=True):
        new_args, new_kwargs, changed = copies(change)
        if change is not None and not changed:
            continue
        try:
            with mode():
                value = fn(*new_args, **new_kwargs)
                value = value.detach().clone() if isinstance(value, torch.Tensor) else value
            out[name] = _plain(value, name)
        except Exception:  # noqa: BLE001, S112 - a layout the code cannot take is not judged, only one it answers wrong
            continue
    return out


def signature_defaults(fn) -> dict:
    """Each parameter of `fn` and the default a call that leaves it out gets, as [kind, value] (float64): kind 0
    required, 1 None, 2 a plain number (an int or a float, not a subclass), 5 a bool, 3 anything else; "**" = [4, 0] where
    `fn` takes keywords it does not name, or is a wrapper whose defaults cannot be read. Read from what a call uses
    (a function's `__defaults__` and `__kwdefaults__`, or its class's `__call__`'s), never from `__signature__` or
    `__wrapped__`, which anything may set. The judge compares the plain numbers and None with the notebook's
    signature (`judge._compare_defaults`): a default that differs changes the notebook's own calls that leave the
    argument out, which no probe that passes it sees (label smoothing 0.1, or no end-of-text id, as defaults had full
    marks: red-team round 35). What it cannot read (a None standing for the notebook's default, a tensor, a wrapper)
    is left to the probes that leave the arguments out."""
    import inspect
    import math
    import types

    import torch

    def encoded(default) -> list[float]:
        if default is inspect.Parameter.empty:
            return [0.0, 0.0]
        if default is None:
            return [1.0, 0.0]
        if type(default) is bool:
            return [5.0, float(default)]
        if type(default) in (int, float) and math.isfinite(default):
            return [2.0, float(default)]
        return [3.0, 0.0]

    params: dict[str, list[float]] = {}
    function = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if isinstance(fn, type):  # a module's class: its forward, as calling a module runs it (`self` is read too)
        function = inspect.getattr_static(fn, "forward", None)
    elif type(function) is not types.FunctionType:  # a callable object: its class's __call__, as a call runs it
        function = inspect.getattr_static(type(fn), "__call__", None)
    if type(function) is types.FunctionType:
        code = function.__code__
        positional = code.co_varnames[: code.co_argcount]
        keyword_only = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
        defaults = function.__defaults__ or ()
        kwdefaults = function.__kwdefaults__ or {}
        first_default = len(positional) - len(defaults)
        for j, name in enumerate(positional):
            params[name] = encoded(defaults[j - first_default] if j >= first_default else inspect.Parameter.empty)
        for name in keyword_only:
            params[name] = encoded(kwdefaults.get(name, inspect.Parameter.empty))
        if code.co_flags & inspect.CO_VARKEYWORDS:
            params["**"] = [4.0, 0.0]
    else:  # a partial, a cache, a builtin: nothing a call uses can be read here
        params["**"] = [4.0, 0.0]
    named = {k: v for k, v in params.items() if k == "**" or (k.isascii() and k.isidentifier())}
    out = {k: torch.tensor(v, dtype=torch.float64) for k, v in list(named.items())[:60]}
    out["**"] = torch.tensor(params.get("**", [0.0, 0.0]), dtype=torch.float64)
    return out


def loss_gradient(loss, logits, *args, **kwargs) -> dict:
    """A loss ("loss") and its gradient with respect to the logits ("grad"): the value alone let a loss computed
    in NumPy, or rebuilt from `.item()`, through, which `backward()` cannot run through (red-team round 10)."""
    import torch

    x = logits.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        value = loss(x, *args, **kwargs)
        if not isinstance(value, torch.Tensor) or not value.requires_grad or value.dim() != 0:
            raise ProbeError(
                "the loss is not a 0-d tensor that backward() can run through to the logits: compute it with torch "
                "operations on the logits (no .item(), NumPy or a new tensor built from numbers)"
            )
        (grad,) = torch.autograd.grad(value, x, allow_unused=True)
    if grad is None:
        raise ProbeError("the loss does not depend on the logits: backward() gives them no gradient")
    return {"loss": value.detach(), "grad": grad}


def encode_decode(model, src, tgt) -> dict:
    """An encoder-decoder's two halves called as greedy decoding calls them: `model.encode(src)` ("memory") and
    `model.decode(tgt, memory, src)` ("logits"). Judging `forward` alone let an encode that skipped the encoder's
    layers and a decode that ignored the memory through, with `forward` computed apart (red-team round 10)."""
    for name in ("encode", "decode"):
        if not callable(getattr(model, name, None)):
            raise ProbeError(f"the model has no method `{name}`: keep the one the notebook asks for")
    memory = model.encode(src)
    logits = model.decode(tgt, memory, src)
    padding = (src == model.cfg.pad_id)[..., None]  # what an encoder leaves at padding is its own: never attended to
    memory = _plain(memory, "the memory")
    return {"memory": memory.masked_fill(padding, 0.0) if memory.shape[:2] == src.shape else memory, "logits": logits}


def padding_appended(model, src, tgt, pad: int) -> dict:
    """An encoder-decoder on right-padded `src` and `tgt` ("logits"), then with two more padding columns on each
    ("more_padding", at the first tgt positions): padding that is masked out changes nothing."""
    import torch

    logits = model(src, tgt)
    more = model(
        torch.cat([src, torch.full_like(src[:, :2], pad)], dim=1), torch.cat([tgt, torch.full_like(tgt[:, :2], pad)], 1)
    )
    return {"logits": logits, "more_padding": _plain(more, "the logits")[:, : tgt.shape[1]]}


SCRIPTS = {
    "kv_steps": kv_steps,
    "cached_steps": cached_steps,
    "same_seed_twice": same_seed_twice,
    "unseeded_twice": unseeded_twice,
    "after_a_first_call": after_a_first_call,
    "last_new_tokens": last_new_tokens,
    "new_tokens": new_tokens,
    "padded_generate_steps": padded_generate_steps,
    "decode_once": decode_once,
    "padded_steps": padded_steps,
    "trained_weights": trained_weights,
    "addition_run": addition_run,
    "model_lengths": model_lengths,
    "detached_cache": detached_cache,
    "train_batches": train_batches,
    "initial_stats": initial_stats,
    "embed_and_unembed": embed_and_unembed,
    "padding_appended": padding_appended,
    "encode_decode": encode_decode,
    "loss_gradient": loss_gradient,
    "parameter_gradient": parameter_gradient,
    "unembed_gradient": unembed_gradient,
    "input_gradient": input_gradient,
    "beam_cases": beam_cases,
    "causal_input_gradient": causal_input_gradient,
    "signature_defaults": signature_defaults,
    "small_schedules": small_schedules,
    "beam_widths": beam_widths,
    "layouts": layouts,
}


def param_group_decay(groups, model):
    """Optimizer parameter groups as one number per parameter of `model` (in `named_parameters` order): the weight
    decay its group gives it (AdamW's default, 0.01, where a group names none); 0 for a frozen parameter, which is
    never stepped and may sit in either group or in none (nanoGPT's configure_optimizers leaves such ones out), and
    for an attention bias, in either group."""
    import torch

    named = list(model.named_parameters())
    index = {id(param): i for i, (_, param) in enumerate(named)}
    decay = torch.full((len(named),), float("nan"), dtype=torch.float64)
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) and "params" in g for g in groups):
        raise ProbeError("did not return a list of dicts with 'params'")
    for group in groups:
        rate = float(group.get("weight_decay", 0.01))
        for param in list(group["params"]):
            i = index.get(id(param))
            if i is None:
                raise ProbeError("a group holds a tensor that is not one of the model's parameters")
            if not torch.isnan(decay[i]):
                raise ProbeError(f"{named[i][0]} is in two groups")
            decay[i] = rate
    for i, (name, param) in enumerate(named):
        # a frozen parameter, and the attention biases b_Q, b_K, b_V ([n_heads, d_head]: a bias by name, a matrix by
        # its dimensions, and the notebook accepts either rule), count as undecayed wherever they sit
        if not param.requires_grad or name.rsplit(".", 1)[-1] in ("b_Q", "b_K", "b_V"):
            decay[i] = 0.0
    left = [named[i][0] for i in torch.isnan(decay).nonzero().flatten().tolist()]
    if left:
        raise ProbeError(f"{len(left)} parameters are in no group ({', '.join(left[:3])})")
    return decay


def _under(path: str, filename: str) -> bool:
    """Whether `filename` (absolute, or as the profiler shows it: `torch/nn/functional.py`) is the file `path` or
    lies in it, from a whole folder name on: `functorch/` is not `torch/_functorch/`."""
    return filename.startswith(path) or f"/{path}" in filename


_PYTHON_PATHS: frozenset = frozenset()  # every `py:` rule's path (`learn_rule_files`)
_FILE_PATHS: dict = {}  # a loaded function's file -> the `py:` rules' paths it lies under (`learn_rule_files`)
_UNDER: dict = {}  # a `py:` rule's path -> (function, its file, its name) of every loaded function under it


def learn_rule_files() -> int:
    """In a probe template, once it has imported what its children use and before it forks: every loaded function
    under a `py:` rule's path (`instructor.rules`), read here, out of any audit hook; then the template's objects
    are frozen out of the garbage collector's view (`gc.freeze`: the children's collections no longer touch, and
    copy, their pages). A child's withdrawal (`withdraw_python`) takes these and looks only at the objects made
    since (0.3 to 1 s a phase before, scanning the 60,000 functions the template holds). Returns how many files."""
    import gc
    import types

    from instructor.rules import all_python_paths

    global _PYTHON_PATHS
    paths = _PYTHON_PATHS = all_python_paths()
    for obj in gc.get_objects():
        if type(obj) is types.FunctionType:
            filename = obj.__code__.co_filename
            if filename not in _FILE_PATHS:
                _FILE_PATHS[filename] = frozenset(path for path in paths if _under(path, filename))
            for path in _FILE_PATHS[filename]:
                _UNDER.setdefault(path, []).append((obj, filename, obj.__code__.co_name))
    gc.collect()
    gc.freeze()
    return len(_FILE_PATHS)


def _forbids(rule: str, event: str) -> bool:
    """Whether a profiler event (`aten::native_layer_norm`, or `torch/nn/functional.py(6637): multi_head_...` for
    a Python function) falls under a rule: an operator name, a pattern with `*` anywhere, or `py:FILE[:FUNCTION]`."""
    if rule.startswith("py:"):
        where, sep, function = event.partition("): ")
        path, _, name = rule[3:].partition(":")
        return bool(sep) and _under(path, where) and (not name or function == name)
    if rule.startswith("!"):  # every operator outside these namespaces
        namespace, sep, _ = event.partition("::")
        return bool(sep) and namespace not in rule[1:].split(",")
    if "*" in rule:
        parts = rule.split("*")
        if not (event.startswith(parts[0]) and event.endswith(parts[-1])) or len(event) < len(rule) - len(parts) + 1:
            return False
        at = len(parts[0])
        for part in parts[1:-1]:
            at = event.find(part, at)
            if at < 0:
                return False
            at += len(part)
        return at <= len(event) - len(parts[-1])
    return event == rule


def _profiler():
    """What the record is made with, bound once, when this module is first imported: the child imports it before
    any learner code runs, so a name the learner's code rebinds later (`torch.profiler.profile = ...`) does not
    reach the record. It records the operators of every thread, not only the caller's (`no_new_tasks`)."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    return profile, ProfilerActivity.CPU, _ExperimentalConfig(profile_all_threads=True)


_PROFILE, _CPU, _ALL_THREADS = _profiler()


class RecordUnreadable(Exception):
    """The profiler's events could not be read: the probe is run again (`run_probes`)."""


def _record(call, python: bool = True):
    """`call()`'s result and the names of everything the profiler recorded while it ran: operators in every thread,
    and with `python`, Python functions in this one (a thread's are withdrawn for it as for this one:
    `withdraw_python`). Code of the learner's that replaces the profiler's Python tracer (`cProfile` around a loop)
    is not refused: the record is a second line."""
    out, ran, unreadable = _record_all(call, python)
    if unreadable:
        raise RecordUnreadable(unreadable)
    return out, ran


def _record_all(call, python: bool):
    """`call()`'s result, the names of what the profiler recorded that could be read, and why one could not ("" if
    every one could)."""
    with _PROFILE(activities=[_CPU], with_stack=python, experimental_config=_ALL_THREADS) as record:
        out = call()
    ran, unreadable = set(), ""
    # the raw events' names: torch's `record.events()` builds a tree of Python objects from them first, 2.9 s for a
    # 6-step training probe's 32,000 events where this takes 0.07 s (measured)
    for event in record.profiler.kineto_results.events():
        try:
            ran.add(str(event.name()))
        except UnicodeDecodeError as err:
            # Measured in fresh probe processes: a function name in the profiler's events is sometimes garbage (code
            # compiled and freed while it recorded, the first time something runs)
            unreadable = str(err)
    return out, ran, unreadable


def _is_event_of(rule: str, event: str) -> bool:
    """Whether a profiler event falls under a rule: an operator rule only on an operator's name (a label of the
    learner's own, `record_function("mlp::gelu_new")`, is no operator), a `py:` rule on a Python function."""
    if rule.startswith("py:"):
        return _forbids(rule, event)
    return _forbids(rule, event) and _is_operator(event)


_LATE: dict = {}  # an event's name -> whether it is an operator registered since this module was imported, not the learner's


def _is_operator(event: str) -> bool:
    """An operator registered when the child started, or since by torch's own code: torch's Python libraries
    register theirs when first used (`torch_nn::_linear_cross_entropy_batch_chunked`, a cross-entropy: full marks in
    05 while only the operators registered at the start counted, red-team round 14). Not one the learner's code
    registered (`torch.library.custom_op("course::gelu_new", ...)` in the notebook), whose body is the learner's
    code, recorded as such."""
    if event in _OPERATORS:
        return True
    if "::" not in event or " " in event:
        return False
    if event not in _LATE:
        registered = {name.split(".")[0] for name in _DISPATCH[1]()}
        _LATE[event] = event in registered and not _learners_operator(event)
    return _LATE[event]


def _learners_operator(name: str) -> bool:
    """Whether the learner's code registered operator `name`: a Python custom operator whose function was not
    compiled from a file of torch's, or one in a namespace that no operator had when the child started."""
    definition = _CUSTOM_OPS.get(name)
    function = getattr(definition, "_init_fn", None)
    filename = getattr(getattr(function, "__code__", None), "co_filename", None)
    if filename is not None:
        return not filename.startswith(_TORCH_DIRS)
    return name.partition("::")[0] not in _NAMESPACES


def _custom_ops() -> tuple[dict, tuple[str, str]]:
    import torch
    from torch._library.custom_ops import OPDEFS

    folder = os.path.dirname(torch.__file__)
    return OPDEFS, (folder + os.sep, os.path.realpath(folder) + os.sep)  # as imported, and where it lies


_VERDICTS: dict = {}  # rules -> {event name -> whether a rule forbids it}
# The `py:` rules whose functions `withdraw_python` has withdrawn from this process for good (one set, which the
# sealed runner shares: a phase withdraws its rules after the runner was sealed)
_PY_WITHDRAWN: set = set()


def _hit(event: str, forbidden: tuple[str, ...], seen: dict) -> bool:
    hit = seen.get(event)
    if hit is None:
        hit = seen[event] = any(_is_event_of(rule, event) for rule in forbidden)
    return hit


def _call_watching(target: str, call, forbidden: tuple[str, ...]):
    """`call()`'s result, refused if an operator the exercise forbids ran in it, whatever name reached it
    (`F.layer_norm`, `torch.native_layer_norm`, `torch.ops.aten...`, a module that wraps it): the profiler records
    every operator at PyTorch's dispatcher, the composite ones and what they turn into alike, and every Python
    function with its file. `forbidden` holds rules (`_forbids`). In the probe child this is a second line: what
    the rules name is already out of the process (`take_out_operators`)."""
    # Python functions recorded only for rules whose code is still in this process: the probe child has withdrawn
    # every one its probes forbid (`withdraw_python`), so there a function under a rule cannot run at all and its
    # record would add nothing. The Python tracer doubled 08's probes (TransformerLens's hooks: 25 s against 12 s,
    # measured); it stays wherever nothing was withdrawn (the judge's tests, a probe run unsandboxed)
    python = any(rule.startswith("py:") and rule not in _PY_WITHDRAWN for rule in forbidden)
    out, ran, unreadable = _record_all(call, python)
    # each name's verdict once per set of rules: matching every event against every rule took a third of 07's
    # probe time (1,800 records of up to 357,000 events, measured with py-spy)
    seen = _VERDICTS.setdefault(forbidden, {})
    hits = sorted(n for n in ran if _hit(n, forbidden, seen))
    if hits:
        more = f" and {len(hits) - 2} more" if len(hits) > 2 else ""
        raise ProbeError(
            f"{target} ran code this exercise forbids (a library's implementation of what it asks you to write, "
            f"or the course's reference), whatever name reached it: {', '.join(h[:80] for h in hits[:2])}{more}"
        )
    if unreadable:  # made again (`run_probes`), once what could be read was judged: a forbidden call made only in
        # the attempt whose record had an unreadable name passed while that record was thrown away unread
        raise RecordUnreadable(unreadable)
    return out


# Threads a probe child may run at once beside its own (RLIMIT_NPROC counts them per uid, and every child has its own)
CHILD_THREADS = 64


def _threads_only() -> bool:
    """Let this process start threads and no process: a seccomp filter refuses `clone` without CLONE_THREAD (a new
    process: `fork`, `posix_spawn`, `subprocess`), `fork`, `vfork`, `execve` and `execveat`, and answers `clone3`
    ENOSYS, on which the C library starts its threads with `clone`. A process started there would run a fresh
    interpreter, with nothing taken out of it; a thread shares this process, with everything taken out of it.
    Returns whether the filter is in place (not on an architecture other than x86-64 and arm64)."""
    import ctypes
    import platform
    import struct

    arches = {  # the audit architecture; clone, clone3; the calls that make or replace a process
        "x86_64": (0xC000003E, 56, 435, (57, 58, 59, 322)),
        "aarch64": (0xC00000B7, 220, 435, (221, 281)),
    }
    if platform.machine() not in arches:
        return False
    arch, clone, clone3, refused = arches[platform.machine()]
    load, equal, any_bit, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JSET|K, BPF_RET|K
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    program = [(load, 0, 0, 4), (equal, 1, 0, arch), (ret, 0, 0, eperm), (load, 0, 0, 0)]  # another ABI: nothing
    program += [(equal, 0, 4, clone), (load, 0, 0, 16), (any_bit, 1, 0, 0x00010000), (ret, 0, 0, eperm)]
    program += [(ret, 0, 0, allow), (equal, 0, 1, clone3), (ret, 0, 0, enosys)]
    for number in refused:
        program += [(equal, 0, 1, number), (ret, 0, 0, eperm)]
    program += [(ret, 0, 0, allow)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *step) for step in program))
    libc = ctypes.CDLL(None, use_errno=True)
    no_new_privs, set_seccomp, filter_mode = 38, 22, 2
    if libc.prctl(no_new_privs, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(set_seccomp, filter_mode, ctypes.byref(Program(len(program), ctypes.addressof(code))), 0, 0) == 0


_PROCESS_EVENTS = frozenset(
    {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen", "pty.spawn"}
)


def no_new_tasks() -> None:
    """From here on this process can start no process (the probe child calls it before any learner code runs): a
    process started there would run a fresh interpreter, with nothing the rules take out taken out of it. Threads it
    may start (`_threads_only`): what the rules forbid is out of the process for every thread, and the record
    watches every thread's operators (an honest gelu_new computed in a `ThreadPoolExecutor`, or a progress bar that
    redraws itself from a thread, as rich's does, scored 0 while threads were refused too: red-team rounds 11 and
    14). Where no such filter can be made, neither can start: the kernel enforces RLIMIT_NPROC, set here to 0,
    soft and hard, for any uid but root's (never learner code's in the sandbox)."""
    if os.getuid() != 0:
        try:
            _record(lambda: None)  # the profiler starts its own threads the first time: before the limit
        except Exception:  # noqa: BLE001, S110 - then a probe's record fails, and says so
            pass
        if _threads_only():
            resource.setrlimit(resource.RLIMIT_NPROC, (CHILD_THREADS, CHILD_THREADS))

            def refuse_processes(event, args):  # what the filter refuses anyway, said so that a learner knows why
                if event in _PROCESS_EVENTS:  # an OSError, as the refused system call's: libraries catch that
                    raise PermissionError(
                        1, f"{event}: the judge runs your code in one process, which may start threads but no process"
                    )

            sys.addaudithook(refuse_processes)
            return
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        import threading

        def refused(*args, **kwargs):  # what the kernel refuses anyway, said so that a learner knows why
            raise RuntimeError(
                "can't start new thread: the judge runs your code in one thread, with none of its own (a progress "
                "bar that redraws itself from a thread, as rich's does, cannot run there; tqdm's can)"
            )

        threading._start_new_thread = refused


MAX_PHASES = 4


def phase_files(index: int) -> tuple[str, str]:
    """The outputs' and the errors' file names of phase `index` (`phases`), in the request's `out/` folder."""
    return (OUTPUTS, ERRORS) if index == 0 else (f"outputs.{index}.safetensors", f"errors.{index}.json")


def running_file(index: int) -> str:
    """The file in the request's `out/` folder that names the probe phase `index` is running (`run_probes`): where
    the phase's process is killed, the phases' runner resumes it past that probe (`template.run_probe_plan`)."""
    return f"running.{index}"


def _say_running(folder: str, phase: int, name: str) -> None:
    try:
        fd = os.open(os.path.join(folder, OUT_DIR, running_file(phase)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, name.encode())
        finally:
            os.close(fd)
    except OSError:  # the runner then takes the first probe with no result for the one running
        pass


def phases(request: dict) -> list[list[str]]:
    """The request's probes in groups that forbid the same (operators and Python code alike), from the fewest
    forbidden up: each group runs in a process of its own, with all of it taken out before any learner code
    (`template.run_probe_plan`, `take_out_operators`). One group where every probe forbids the same (all but 04's,
    05's and 08's); at most MAX_PHASES (past that, the last groups share a process and each is refused what any of
    them is: never an oracle left in, perhaps honest code refused)."""
    groups: dict[tuple, list[str]] = {}
    for probe in request["probes"]:  # a seeded probe's replicas in a process of their own (`judge._replicas`)
        key = (frozenset(probe.get("forbidden_ops", ())), bool(probe.get("replica")))
        groups.setdefault(key, []).append(probe["name"])
    keys = sorted(groups, key=lambda key: (key[1], len(_operator_rules({"forbidden_ops": key[0]})), len(key[0])))
    ordered = [groups[key] for key in keys if not key[1]]
    replicas = [groups[key] for key in keys if key[1]]
    while len(ordered) > max(1, MAX_PHASES - len(replicas)):  # never for the course's notebooks; replicas never
        ordered[-2:] = [ordered[-2] + ordered[-1]]  # share a process with what they are compared with
    return ordered + replicas


def run_probes(
    request: dict,
    namespace: dict,
    timeout: float,
    deadline: float,
    phase: int = 0,
    definitions: list | None = None,
) -> None:
    """Run every probe; outputs and errors into the request's `out/` folder (`phase`'s files). Never raises. In the
    probe child, what the probes forbid is already out of the process (`take_out_operators`, one phase's probes
    forbidding the same); the record of each call (`_call_watching`) is a second line."""
    outputs, errors = {}, {}
    previous = signal.getsignal(signal.SIGALRM)
    probes = list(request["probes"])
    limit = Alarm(ProbeTimeout)
    took = []  # (seconds, probe): the job's log names the slowest
    written = time.monotonic()
    try:
        signal.signal(signal.SIGALRM, limit.ring)
        for probe in probes:
            if time.monotonic() - written > CHECKPOINT_SECONDS:  # what is done survives a kill of this process
                write_outputs(request["folder"], outputs, dict(errors), phase)
                written = time.monotonic()
            began = time.monotonic()
            _say_running(request["folder"], phase, probe["name"])
            _drop_learner_modes()  # one entered while the definitions ran would run in the runner
            left = deadline - time.monotonic()
            if left <= 0:
                errors[probe["name"]] = "not run (the notebook's time limit)"
                continue
            seconds = max(0.5, min(timeout, left))
            try:
                try:
                    limit.start(seconds)
                    tensors = request["tensors"]
                    if request.get("fetch") is not None:  # the feeder's: this probe's entry and inputs, now and once
                        probe, tensors = request["fetch"](probe["name"])
                    for attempt in range(3):
                        try:
                            outputs.update(_run_one(probe, namespace, tensors))
                            break
                        except RecordUnreadable as err:
                            if attempt == 2:
                                raise ProbeError(f"the record of what {probe['target']} ran could not be read: {err}")
                finally:
                    limit.stop()
            except ProbeTimeout:  # the alarm, or its repeat landing while the first was handled: this probe's alone
                limit.stop()
                errors[probe["name"]] = f"ran past its {seconds:.0f} s limit"
            except ProbeError as err:
                errors[probe["name"]] = str(err)[:400]
            except BaseException as err:  # noqa: BLE001 - learner code may raise anything, SystemExit included
                errors[probe["name"]] = f"{probe['target']} raised {type(err).__name__}: {err}"[:400]
            took.append((time.monotonic() - began, probe["name"]))
    except BaseException as err:  # noqa: BLE001 - whatever ran is still written
        errors["__runner__"] = f"{type(err).__name__}: {err}"[:400]
    finally:
        limit.stop()
        signal.signal(signal.SIGALRM, previous)
    _drop_learner_modes()
    slowest = ", ".join(f"{name} {seconds:.2f} s" for seconds, name in sorted(took, reverse=True)[:3])
    print(f"phase {phase}: {len(took)} probes, the slowest {slowest}", file=sys.stderr)
    if definitions:  # a failed probe may fail for want of what a definition of the learner's did not make
        for name in errors:
            errors[name] = f"{errors[name][:250]} (one of your statements had failed first: {definitions[0][:140]})"
    write_outputs(request["folder"], outputs, errors, phase)


# A phase writes what its probes returned so far at most this often while it runs, and all of it at its end: a
# phase killed at its memory limit lost every probe's output, 35 points of an honest 07 for one probe's Python loop
# (red-team round 22); now the probes done before the last write keep theirs (`template._ended` says why the rest
# have none)
CHECKPOINT_SECONDS = 2.0


def safetensors_bytes(outputs: dict) -> bytes:
    """name -> (safetensors dtype, shape, bytes) as one safetensors file: a header, then the data (`_frozen`)."""
    header, offset, chunks = {}, 0, []
    for name in sorted(outputs):
        dtype, shape, data = outputs[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    text = _DUMPS(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(chunks)


def write_outputs(folder: str, outputs: dict, errors: dict, phase: int = 0) -> None:
    """The frozen outputs (`_frozen`) as one safetensors file, written from their bytes with nothing of torch's or
    safetensors' (whose functions learner code could have rebound): a header, then the data. Each file is written
    under another name and renamed, so a kill mid-write leaves the last whole one."""
    out = os.path.join(folder, OUT_DIR)
    outputs_name, errors_name = phase_files(phase)
    try:
        if outputs:
            with open(os.path.join(out, outputs_name + ".part"), "wb") as f:
                f.write(safetensors_bytes(outputs))
            os.replace(os.path.join(out, outputs_name + ".part"), os.path.join(out, outputs_name))
    except Exception as err:  # noqa: BLE001 - e.g. the file-size limit: say so rather than crash the child
        errors["__outputs__"] = f"could not write the outputs: {type(err).__name__}: {err}"[:400]
    try:
        with open(os.path.join(out, errors_name + ".part"), "w", encoding="utf-8") as f:
            f.write(_DUMPS(errors))
        os.replace(os.path.join(out, errors_name + ".part"), os.path.join(out, errors_name))
    except Exception:  # noqa: BLE001, S110 - the judge then reports "no output" for the missing ones
        pass


# ---------------------------------------------------------------------- the probe child's own defences
# What could answer a probe besides the learner's code is out of the probe child before any learner code runs: the
# oracles' packages hidden and their files covered (`instructor.template`), the forbidden operators taken out at
# the dispatcher and the forbidden Python functions withdrawn for good (`take_out_operators`), the graded notebook's
# answers never read. So the runner's state holds nothing worth reaching: frames, the garbage collector's view and
# code objects are the learner's to use (a debug helper's `inspect.stack()`, a traceback printed in an `except`,
# both refused while they were guarded, cost honest work its points; and frames stayed reachable anyway, from a
# signal handler's argument or `logging.currentframe`). What stays refused is what reaches past the dispatcher into
# native code, or rewrites memory: ctypes (`refuse_native_routes`; `/proc` is not mounted in a probe child, and the
# folders it may write are mounted noexec, so no library of its own can be loaded).
# The runner the child calls is still `sealed_run_probes()`, every function of this module it reaches bound to a
# private copy of this module's globals and of builtins taken before any learner code runs: rebinding the module's
# names or builtins (`builtins.isinstance = ...`) does not change how it reads the learner's results.


class Refused(RuntimeError):
    """What the probe child's audit hook raises."""


def sealed_run_probes():
    """`run_probes`, bound with everything of this module it reaches to a private copy of the module's globals and
    of builtins (`_probe_child` takes it before the learner's definitions run)."""
    import builtins
    import types

    private = dict(globals())
    private["__builtins__"] = dict(vars(builtins))
    for name, value in list(private.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == __name__:
            copy = types.FunctionType(value.__code__, private, value.__name__, value.__defaults__, value.__closure__)
            copy.__kwdefaults__ = value.__kwdefaults__
            copy.__dict__.update(value.__dict__)
            private[name] = copy
    private["SCRIPTS"] = {key: private.get(fn.__name__, fn) for key, fn in SCRIPTS.items()}
    # what learner code does to the module's own tables changes nothing here
    private["_FILE_PATHS"] = dict(_FILE_PATHS)
    private["_UNDER"] = {path: tuple(functions) for path, functions in _UNDER.items()}
    private["_LATE"], private["_VERDICTS"] = dict(_LATE), {}  # the record's memory of verdicts, out of reach
    return private["run_probes"]


class ForeignCode(RuntimeError):
    """What the probe child's audit hook raises for a code object that was not compiled from source here."""


def refuse_native_routes() -> None:
    """Install the probe child's audit hook, which no Python code can remove (before any learner code runs, once the
    operators are out): ctypes is refused to everything, the runner included, which needs it no more.

    And no code object is made here but by compiling source: the rules withdraw torch's forbidden functions by the
    code they hold and the file it came from, and a code object brought in as data is neither (torch's own
    `multi_head_attention_forward` and reference GELU, marshalled at home under another file name and pasted as
    base64, had full marks: red-team round 12). So `code.__new__` (`types.CodeType`, `code.replace`) and
    `marshal.load(s)` are refused, and a module imported from here on is compiled from its source: its cached
    bytecode is looked for in a folder that does not exist, and none is written."""
    sys.pycache_prefix = os.path.join(os.sep, "nonexistent-pycache")
    sys.dont_write_bytecode = True

    def hook(event, args):
        if event.startswith("ctypes."):
            raise Refused(f"the judge refuses {event}: nothing may call native code past the dispatcher here")
        if event == "code.__new__":
            raise ForeignCode(
                "the judge refuses code objects made from parts: only code compiled from your source runs"
            )
        if event in ("marshal.loads", "marshal.load"):
            raise ForeignCode("the judge refuses marshal: code brought in as data is not your notebook's source")

    sys.addaudithook(hook)


def compile_eagerly() -> None:
    """`torch.compile` and `nn.Module.compile` run the learner's code as written, eagerly (before any learner code
    runs). Its compilers are out of every probe child, with the decompositions they hold, so a compiled exercise
    failed there (honest code, 0 points); a compiler promises the eager result, which is what the judge compares."""
    import torch

    def compile(model=None, **options):
        return model if model is not None else (lambda model: model)

    torch.compile = compile
    torch.compiler.compile = compile
    torch.nn.Module.compile = lambda self, *args, **kwargs: None


def script_eagerly() -> None:
    """No TorchScript program runs in a probe child; `torch.jit.script` and `torch.jit.trace` give back what they were
    given, which runs as written (before any learner code runs).

    A TorchScript program runs torch's interpreter, not Python: a forbidden Python function compiled at home (torch's
    `local_response_norm` as a LayerNorm, `multi_head_attention_forward` as attention) and pasted into a notebook as
    a base64 archive ran none of its Python code, so the rules that withdraw that code never saw it, and three such
    cheats had full marks (red-team round 11). So every entry to the interpreter refuses, however the program was
    made (loaded, compiled from source or from IR text, traced): each script function's, method's and class's call,
    the static runtime's, the mobile interpreter's, and the graph interpreter. Scripting or tracing promises the
    eager result, which is what the judge compares, so honest scripted code loses nothing."""
    import torch

    def refused(*args, **kwargs):
        raise Refused("a TorchScript program does not run where the judge probes: your code runs as Python here")

    def given(obj=None, *args, **kwargs):
        return obj

    C = torch._C
    for cls, names in (
        (C.ScriptFunction, ("__call__",)),
        (C.ScriptMethod, ("__call__",)),
        (C.ScriptClass, ("__call__",)),
        (C.ScriptClassFunction, ("__call__",)),
        (C.StaticModule, ("__call__", "benchmark", "benchmark_individual_ops", "runAsync")),
        (C.LiteScriptModule, ("forward", "run_method", "find_method")),
    ):
        for name in names:
            setattr(cls, name, refused)
    C._jit_interpret_graph = refused
    for module in (torch.jit, torch.jit._script, torch.jit._trace, torch.jit._freeze):
        for name in ("script", "trace", "trace_module", "freeze", "optimize_for_inference", "script_if_tracing"):
            if hasattr(module, name):
                setattr(module, name, given)


def _dispatch_tools():
    """The dispatcher's functions the take-out uses, bound when this module is first imported (before any learner
    code), so that rebinding `torch._C`'s names later changes nothing."""
    import ctypes

    import torch

    c = torch._C
    return (
        c._dispatch_library,
        c._dispatch_get_all_op_names,
        c._dispatch_has_kernel_for_dispatch_key,
        ctypes.pythonapi.Py_IncRef,
        ctypes.py_object,
        tuple(c.DispatchKey.__members__),
    )


_DISPATCH = _dispatch_tools()
_TAKEN_OUT: set = set()  # operators (with overload) already out of this process: its probe template took them out
_OPERATORS = frozenset(name.split(".")[0] for name in _DISPATCH[1]())  # `aten::gelu`, `quantized::layer_norm`...
_NAMESPACES = frozenset(name.partition("::")[0] for name in _OPERATORS)
_CUSTOM_OPS, _TORCH_DIRS = _custom_ops()
_MODES = _mode_stacks()
_DUMPS = json.dumps


def _reading_tools():
    """What the runner reads a given model and tensors with, bound before any learner code (a class may override
    `state_dict`, a cell may rebind `torch.equal`)."""
    import torch

    return torch.nn.Module.state_dict, torch.equal


_STATE_DICT, _EQUAL = _reading_tools()


def _operator_rules(probe: dict) -> frozenset:
    """A probe's rules on operators (`NAMESPACE::NAME` patterns), not on Python functions (`py:`)."""
    return frozenset(rule for rule in probe.get("forbidden_ops", ()) if not rule.startswith("py:"))


def _common_rules(sets: list) -> frozenset:
    """The operator rules every probe has (what the probe child takes out before the learner's code)."""
    return frozenset.intersection(*sets) if sets else frozenset()


def _take_out(rules) -> list[str]:
    """Every operator under `rules`, in every namespace (`aten::`, and `quantized::`, `onednn::`... whose
    kernels compute the same: `quantized::layer_norm` on a quantized tensor scored full marks in 01 while only
    `aten::` was taken out), gets a kernel that raises at every dispatch key that has one (CPU, QuantizedCPU,
    the composite keys...), through library handles kept alive with no Python reference to them. Returns what was
    taken out."""
    library, all_ops, has_kernel, incref, py_object, keys = _DISPATCH
    handles: dict = {}
    taken = []
    done = _TAKEN_OUT

    def refusing(name: str):
        def refused(*args, **kwargs):
            raise RuntimeError(
                f"this exercise forbids {name} (whatever name reached it): the judge took it out of the process "
                "it runs in"
            )

        return refused

    for full in all_ops():
        namespace, _, overload = full.partition("::")
        name = full.split(".")[0]
        if full in done or not any(_forbids(rule, name) for rule in rules):
            continue
        done.add(full)
        for key in keys:
            try:
                if not has_kernel(full, key):
                    continue
                if namespace not in handles:
                    handles[namespace] = library("IMPL", namespace, "", "<the judge's probe child>", 0)
                handles[namespace].impl(overload, key, refusing(name), False)
            except (RuntimeError, ValueError):  # a key that takes no kernel from Python (BackendSelect...)
                continue
            taken.append(f"{full} ({key})")
    for handle in handles.values():
        incref(py_object(handle))  # alive for good, and out of reach once this returns
    return taken


def take_out_for_good(rules) -> int:
    """In a probe template, before it forks: what every probe it runs forbids (`rules.template_rules`: the oracles,
    torch's own implementations, the backends' operators), out once there rather than in every phase (the
    backends' 685 kernels took 1 s a phase). Returns how many operators and functions."""
    operators = _take_out([rule for rule in rules if not rule.startswith("py:")])
    return len(operators) + withdraw_python(rules)


def take_out_operators(request: dict) -> list[str]:
    """Take what every probe of `request` forbids out of this process (the probe child does this before any
    learner code runs, and its phases give all its probes the same rules): the operators, whose registration
    neither a name nor the garbage collector can reach to undo, and the Python functions (`withdraw_python`).
    Returns the operators taken out."""
    common = _common_rules([_operator_rules(probe) for probe in request["probes"]])
    taken = _take_out(common) if common else []
    rules = [frozenset(probe.get("forbidden_ops", ())) for probe in request["probes"]]
    if rules:
        withdraw_python(frozenset.intersection(*rules))
    return taken


# The Python oracles (torch's references and decompositions, `nn.Transformer`, TransformerLens's ready-made
# answers in 08, the harness's checks) are code, not operators: no dispatcher registration covers them, and the
# record that refuses them runs in the learner's process. So before any learner code runs, every Python function
# under the phase's `py:` rules has its code replaced by code that raises, for good, the original kept nowhere
# (every name, table and closure that holds the function holds the same object, so every route reaches the
# raising code: `dis`, `marshal` or the runner's frames find nothing to copy or put back), and running a module of
# those files afresh (an import after `del sys.modules[...]`, `importlib.reload`, `runpy`) is refused. The phases
# (`phases`) give every probe of a process the same rules, so nothing one probe forbids is there for another's
# call: a code object copied from `multi_head_attention_forward` while the definitions ran, or TransformerLens's
# patching run in another probe's call on inputs kept from the first, scored full marks while they were withdrawn
# only during the calls that forbade them.
_WITHDRAWN = "<taken out by the judge>"  # the file name of the code that withdrawn functions run


def withdraw_python(rules) -> int:
    """Withdraw for good the functions under the `py:` rules among `rules`; returns how many."""
    import gc
    import types

    import torch._inductor  # noqa: F401 - the profiler imports it the first time it starts: not once withdrawn

    parts = {rule: rule[3:].partition(":")[::2] for rule in rules if rule.startswith("py:")}
    if not parts:
        return 0
    files: dict = {}
    learned = _FILE_PATHS

    def rules_for(filename: str) -> tuple:
        if filename not in files:
            paths = learned.get(filename)
            files[filename] = tuple(
                rule
                for rule, (path, _) in parts.items()
                if (path in paths if paths is not None and path in _PYTHON_PATHS else _under(path, filename))
            )
        return files[filename]

    raisers: dict = {}

    def raiser(code):
        """Code that raises, with as many free variables as `code` (Python checks that when code is swapped)."""
        n = len(code.co_freevars)
        if n not in raisers:
            cells = [f"cell{i}" for i in range(n)]
            lines = ["def make():", *([f"    {' = '.join(cells)} = None"] if n else [])]
            lines += ["    def refused(*args, **kwargs):", '        raise RuntimeError("MESSAGE")']
            lines += [f"        ({', '.join(cells)},)"] if n else []  # never runs: it makes the cells free variables
            lines += ["    return refused.__code__"]
            made: dict = {}
            exec(compile("\n".join(lines), _WITHDRAWN, "exec"), made)  # noqa: S102 - the judge's own
            raisers[n] = made["make"]()
        where = code.co_filename.rsplit("site-packages/", 1)[-1]
        message = f"this exercise forbids {code.co_qualname} ({where}): the judge took it out of this process"
        consts = tuple(message if c == "MESSAGE" else c for c in raisers[n].co_consts)
        return raisers[n].replace(co_consts=consts, co_name=code.co_name)

    def under_rules(filename: str, name: str) -> bool:
        return any(not parts[rule][1] or name == parts[rule][1] for rule in rules_for(filename))

    found = {}  # the template's functions under these rules (`learn_rule_files`), then every one made since
    for path in {path for path, _ in parts.values()}:
        for function, filename, name in _UNDER.get(path, ()):
            if under_rules(filename, name):
                found[id(function)] = function
    for obj in gc.get_objects():  # not the template's own: frozen out of this view
        if type(obj) is types.FunctionType and under_rules(obj.__code__.co_filename, obj.__code__.co_name):
            found[id(obj)] = obj
    found = {key: f for key, f in found.items() if f.__code__.co_filename != _WITHDRAWN}  # the template's already
    for function in found.values():
        function.__code__ = raiser(function.__code__)

    def hook(event, args):
        if event == "exec" and args and type(args[0]) is types.CodeType and rules_for(args[0].co_filename):
            raise RuntimeError(f"this exercise forbids running {args[0].co_filename}: the judge took it out")

    sys.addaudithook(hook)
    _PY_WITHDRAWN.update(parts)
    return len(found)
