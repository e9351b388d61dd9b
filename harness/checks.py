"""The three general checks a learner calls: `rand_int_test`, `rand_float_test` and `load_gpt2_test`.

Each one recognises which GPT-2 module it is testing from its parameter names (LayerNorm, Embed, PosEmbed,
Attention, MLP, TransformerBlock, Unembed or the full model), compares the learner's output with TransformerLens's
own component holding the very same weights, and then runs that kind's targeted probes: small, oddly shaped
configurations and crafted inputs on which the usual mistakes cannot hide. When the output is wrong, the known
mistakes are recomputed from the same weights to name the one the learner most likely made.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
from torch import Tensor

from harness import _variants
from harness._assertions import (
    ATTENTION_OPS,
    NORM_OPS,
    as_tensor_output,
    assert_unchanged,
    build,
    call,
    check_tensor,
    fail,
    mismatch_summary,
    refuse_operators,
)
from harness.config import Config

# A configuration on which shape shortcuts fail: d_head * n_heads != d_model, every size distinct, two layers.
PROBE_CONFIG = Config(d_model=12, d_head=5, n_heads=3, d_mlp=20, n_layers=2, n_ctx=10, d_vocab=30)
RTOL = 1e-4


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    takes_tokens: bool
    learner_call: str  # how the course's docs call the module's forward, for messages


KINDS = {
    "LayerNorm": Kind("LayerNorm", False, "LayerNorm(cfg)(residual)"),
    "Embed": Kind("Embed", True, "Embed(cfg)(tokens)"),
    "PosEmbed": Kind("PosEmbed", True, "PosEmbed(cfg)(tokens)"),
    "Attention": Kind("Attention", False, "Attention(cfg)(normalized_resid_pre)"),
    "MLP": Kind("MLP", False, "MLP(cfg)(normalized_resid_mid)"),
    "TransformerBlock": Kind("TransformerBlock", False, "TransformerBlock(cfg)(resid_pre)"),
    "Unembed": Kind("Unembed", False, "Unembed(cfg)(normalized_resid_final)"),
    "DemoTransformer": Kind("DemoTransformer", True, "DemoTransformer(cfg)(tokens)"),
}


def _oracle(kind: str, cfg: Config):
    """TransformerLens's own module of this kind (weights uninitialised: they are loaded from the learner's)."""
    from transformer_lens import HookedTransformer
    from transformer_lens import components as tl

    tl_cfg = cfg.to_transformer_lens()
    builders = {
        "LayerNorm": lambda: tl.LayerNorm(tl_cfg),
        "Embed": lambda: tl.Embed(tl_cfg),
        "PosEmbed": lambda: tl.PosEmbed(tl_cfg),
        "Attention": lambda: tl.Attention(tl_cfg, "global", 0),
        "MLP": lambda: tl.MLP(tl_cfg),
        "TransformerBlock": lambda: tl.TransformerBlock(tl_cfg, 0),
        "Unembed": lambda: tl.Unembed(tl_cfg),
        "DemoTransformer": lambda: HookedTransformer(tl_cfg, move_to_device=False),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TransformerLens's deprecation notice would reach stderr
        return builders[kind]().eval()


def _run_reference(module, x: Tensor, grad: bool = False) -> Tensor:
    from transformer_lens.components import AbstractAttention

    with torch.enable_grad() if grad else torch.no_grad():
        if isinstance(module, AbstractAttention):
            return module(x, x, x)
        return module(x)


def _reference_shapes(kind: str, cfg: Config) -> dict[str, tuple[int, ...]]:
    """The parameter names and shapes of TransformerLens's module of this kind (what strict loading expects)."""
    d, h, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    ln = {"w": (d,), "b": (d,)}
    attn = {"W_Q": (h, d, dh), "W_K": (h, d, dh), "W_V": (h, d, dh), "W_O": (h, dh, d)}
    attn |= {"b_Q": (h, dh), "b_K": (h, dh), "b_V": (h, dh), "b_O": (d,)}
    mlp = {"W_in": (d, cfg.d_mlp), "b_in": (cfg.d_mlp,), "W_out": (cfg.d_mlp, d), "b_out": (d,)}
    unembed = {"W_U": (d, cfg.d_vocab), "b_U": (cfg.d_vocab,)}

    def prefixed(prefix: str, shapes: dict) -> dict:
        return {f"{prefix}.{name}": shape for name, shape in shapes.items()}

    block = prefixed("ln1", ln) | prefixed("attn", attn) | prefixed("ln2", ln) | prefixed("mlp", mlp)
    if kind == "DemoTransformer":
        full = {"embed.W_E": (cfg.d_vocab, d), "pos_embed.W_pos": (cfg.n_ctx, d)}
        for layer in range(cfg.n_layers):
            full |= prefixed(f"blocks.{layer}", block)
        return full | prefixed("ln_final", ln) | prefixed("unembed", unembed)
    return {
        "LayerNorm": ln,
        "Embed": {"W_E": (cfg.d_vocab, d)},
        "PosEmbed": {"W_pos": (cfg.n_ctx, d)},
        "Attention": attn,
        "MLP": mlp,
        "TransformerBlock": block,
        "Unembed": unembed,
    }[kind]


def _learner_weights(module) -> dict[str, Tensor]:
    """Parameters and persistent buffers: some learners keep b_U as a buffer; both are weights."""
    weights = dict(module.named_parameters())
    for name, buf in module.state_dict().items():
        weights.setdefault(name, buf)
    return weights


def _identify(module, cls, cfg: Config) -> str:
    """Which course module this is: by parameter names, else by parameter shapes and the class name."""
    params = {name: tuple(p.shape) for name, p in module.named_parameters()}
    cls_name = getattr(cls, "__name__", "").lower()
    best, best_score = None, 0.0
    for kind in KINDS:
        expected = _reference_shapes(kind, cfg)
        if set(expected) <= set(_learner_weights(module)) and set(params) <= set(expected) | {"IGNORE"}:
            return kind
        names = set(expected) | set(params)
        score = len(set(expected) & set(params)) / len(names) if names else 0.0
        if sorted(expected.values()) == sorted(params.values()):
            score += 0.75
        if kind.lower() in cls_name:
            score += 0.5
        if score > best_score:
            best, best_score = kind, score
    if best is None:
        fail(
            f"{getattr(cls, '__name__', cls)} has parameters {sorted(params) or 'none'}, which match none of the "
            "course's modules. Name them as in the exercise (e.g. w, b for LayerNorm; W_Q, W_K, W_V, W_O, b_Q, ... "
            "for Attention) and create them with nn.Parameter in __init__."
        )
    return best


def _compare_weights(kind: str, module, reference_shapes: dict, what: str) -> None:
    """Strict loading: every missing, unexpected or mis-shaped parameter is named."""
    learner = _learner_weights(module)
    learner_params = set(dict(module.named_parameters()))
    missing = sorted(set(reference_shapes) - set(learner))
    unexpected = sorted(learner_params - set(reference_shapes))
    misshaped = [
        f"{name}: yours {list(learner[name].shape)}, expected {list(shape)}"
        for name, shape in reference_shapes.items()
        if name in learner and tuple(learner[name].shape) != tuple(shape)
    ]
    problems = []
    seen: dict[int, str] = {}
    for name, tensor in learner.items():
        first = seen.setdefault(tensor.data_ptr(), name)
        if first != name and tensor.numel() > 1:
            problems.append(
                f"{first} and {name} are the same tensor: one module serves in two places. Build a new one for each "
                "(two LayerNorm(cfg) calls for ln1 and ln2; a TransformerBlock(cfg) per layer, "
                "nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)]), not [block] * n_layers)"
            )
            break
    if missing:
        problems.append(f"missing parameters {missing}")
    if unexpected:
        problems.append(f"unexpected parameters {unexpected}")
    if misshaped:
        problems.append("parameters of the wrong shape: " + "; ".join(misshaped))
    if problems:
        fail(
            f"{what} cannot load the {kind} weights: " + ", ".join(problems) + ". "
            "Parameter names and shapes must match the reference's (see the exercise's __init__)."
        )


def _randomize(module, cfg: Config, seed: int) -> None:
    """Weights of a realistic scale with non-zero biases and LayerNorm gains away from 1, so no term can hide.
    Drawn in place (no temporary copy of each weight); large weights are filled by `_PooledNormal`."""
    gen = torch.Generator().manual_seed(seed)
    pooled = _PooledNormal(gen)
    with torch.no_grad():
        for name, p in _learner_weights(module).items():
            if not p.is_floating_point():
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "w":
                pooled.fill(p, 1.0, 0.3)
            elif leaf.startswith("b"):
                pooled.fill(p, 0.0, 0.3)
            elif leaf in ("W_E", "W_pos"):
                pooled.fill(p, 0.0, 1.0)
            elif leaf == "W_O":
                pooled.fill(p, 0.0, (cfg.n_heads * cfg.d_head) ** -0.5)
            elif p.dim() >= 2:
                pooled.fill(p, 0.0, p.shape[-2] ** -0.5)


class _PooledNormal:
    """Normal draws for weights of any size. Drawing GPT-2 small's 163 million weights one by one takes about a
    second here, most of a full-model check; so a weight of a quarter of a million numbers or more is filled with
    runs of 65,536 values, each the scaled sum of two runs read from two pools of about a million standard normal
    draws, each at its own random offset. One pool alone would repeat: with 50,257 embedding rows read from a million
    numbers, hundreds of rows would start at the same place and be equal. With two, a repeat needs both offsets to
    coincide (tests/test_checks.py asserts no row repeats). Smaller weights, and every probe on a small config, get
    independent draws."""

    POOLS = (1_000_003, 999_983)
    RUN = 1 << 16
    LARGE = 1 << 18

    def __init__(self, gen: torch.Generator):
        self.gen = gen
        self.pools: list[Tensor] = []

    def fill(self, p: Tensor, mean: float, std: float) -> None:
        if p.numel() < self.LARGE or not p.is_contiguous() or p.dtype != torch.float32:
            p.normal_(mean, std, generator=self.gen)
            return
        if not self.pools:
            self.pools = [torch.randn(size, generator=self.gen) for size in self.POOLS]
        flat = p.view(-1)
        n = flat.numel()
        n_runs = (n + self.RUN - 1) // self.RUN
        starts = [torch.randint(0, len(pool) - self.RUN, (n_runs,), generator=self.gen).tolist() for pool in self.pools]
        (a, b), (starts_a, starts_b) = self.pools, starts
        scale = std / math.sqrt(2)  # the sum of two standard normals has variance 2
        for i in range(n_runs):
            lo = i * self.RUN
            width = min(self.RUN, n - lo)
            out = flat[lo : lo + width]
            torch.add(a[starts_a[i] : starts_a[i] + width], b[starts_b[i] : starts_b[i] + width], out=out)
            out.mul_(scale)  # while the run is still in cache
            if mean:
                out.add_(mean)


def _load_into(target, weights: dict[str, Tensor], share: bool = False) -> None:
    """Copy `weights` into `target`'s tensors; with `share`, `target` takes the tensors themselves (no copy: GPT-2
    small's weights are half a gigabyte). Only a fresh oracle shares; the course's reference is never shared."""
    target_weights = _learner_weights(target)
    if share:
        shared = {name: tensor.detach() for name, tensor in weights.items() if name in target_weights}
        target.load_state_dict(shared, strict=False, assign=True)
        return
    with torch.no_grad():
        for name, tensor in weights.items():
            if name in target_weights:
                target_weights[name].copy_(tensor)


def _expected_shape(kind: str, input_shape: tuple[int, ...], cfg: Config) -> tuple[int, ...]:
    if kind in ("Embed", "PosEmbed"):
        return (*input_shape, cfg.d_model)
    if kind == "DemoTransformer":
        return (*input_shape, cfg.d_vocab)
    if kind == "Unembed":
        return (*input_shape[:-1], cfg.d_vocab)
    return tuple(input_shape)


def _tolerance(expected: Tensor) -> float:
    return 1e-5 * max(1.0, expected.abs().max().item())


def _forward(module, x: Tensor, what: str, kind: str, cfg: Config) -> Tensor:
    before = x.clone()
    out = as_tensor_output(call(module, x, what=f"{what}.forward"), f"{what}.forward")
    assert_unchanged(before, x, f"{what}.forward")
    batch, pos = x.shape[0], x.shape[1] if x.dim() > 1 else 0
    if kind == "PosEmbed" and out.dim() == 3 and batch != pos and tuple(out.shape[:2]) == (batch, batch):
        fail(
            f"{what} output has shape {list(out.shape)} for tokens of shape {list(x.shape)}: its length is the batch "
            "size. The sequence length is tokens.shape[1] (batch, seq_len = tokens.shape)."
        )
    check_tensor(out, _expected_shape(kind, tuple(x.shape), cfg), what, device=x.device)
    return out


def _axis_names(kind: str, out) -> tuple[str, ...] | None:
    """What the output's axes are, for the messages' account of where it differs."""
    if out.dim() != 3:
        return None
    return ("batch row", "position", "logit" if kind in ("Unembed", "DemoTransformer") else "feature")


def _compare_outputs(kind, module, reference, x, out, what, context) -> None:
    expected = _run_reference(reference, x)
    summary = mismatch_summary(out, expected, _tolerance(expected), RTOL, _axis_names(kind, out))
    if summary is None:
        return
    hint = _variants.diagnose(kind, reference, x, out, _tolerance(expected), RTOL)
    if not hint and kind == "TransformerBlock":
        hint = _variants.diagnose_block(module, reference, x, _tolerance(expected), RTOL)
    elif not hint and kind == "DemoTransformer":
        hint = _variants.diagnose_model(module, reference, x, _tolerance(expected), RTOL)
    if hint:  # the likely cause first, then the evidence
        fail(f"{what}: {hint} (Its output does not match the reference {context}: {summary}.)")
    fail(f"{what} output does not match the reference {context}: {summary}.")


def _module_check(
    cls, cfg: Config, x: Tensor, seed: int, context: str, expected_kind: str | None = None, module=None
) -> str:
    """Build (unless `module`, built from `cls` and `cfg`, is given), identify, randomise, run and compare one module
    against TransformerLens's."""
    what = getattr(cls, "__name__", "module")
    module = build(cls, cfg) if module is None else module
    kind = expected_kind or _identify(module, cls, cfg)
    _compare_weights(kind, module, _reference_shapes(kind, cfg), what)
    _randomize(module, cfg, seed)
    module.eval()
    reference = _oracle(kind, cfg)
    _load_into(reference, _learner_weights(module), share=True)
    with torch.no_grad():
        out = _forward(module, x, what, kind, cfg)
    _compare_outputs(kind, module, reference, x, out, what, context)
    return kind


def _probe_input(kind: str, cfg: Config, shape: tuple[int, ...], gen: torch.Generator, scale: float = 1.0) -> Tensor:
    if KINDS[kind].takes_tokens:
        return torch.randint(0, cfg.d_vocab, shape, generator=gen)
    return torch.randn((*shape, cfg.d_model), generator=gen) * scale


def _run_probes(cls, kind: str) -> list[str]:
    """The targeted checks of one kind of module; returns what was probed, for the success line."""
    gen = torch.Generator().manual_seed(1234)
    probe_shape = (3, 7)
    done = []
    x = _probe_input(kind, PROBE_CONFIG, probe_shape, gen)
    _module_check(cls, PROBE_CONFIG, x, 1, "on a small config (d_model=12, n_heads=3, d_head=5, d_mlp=20)", kind)
    done.append("odd-sized config")
    if kind == "LayerNorm":
        big_eps = dataclasses.replace(PROBE_CONFIG, layer_norm_eps=0.5)
        x = 5.0 + 0.3 * _probe_input(kind, big_eps, probe_shape, gen)
        _module_check(cls, big_eps, x, 2, "with layer_norm_eps=0.5 and inputs of small spread around 5", kind)
        done.append("large epsilon")
    if kind == "Attention":
        _variants.causal_mask_probe(build(cls, PROBE_CONFIG))
        done.append("causal mask")
    if kind == "MLP":
        _variants.gelu_probe(cls)
        done.append("GELU on [-6, 6]")
    if kind == "PosEmbed":
        x = _probe_input(kind, PROBE_CONFIG, (2, PROBE_CONFIG.n_ctx - 6), gen)
        _module_check(cls, PROBE_CONFIG, x, 3, "on a sequence shorter than n_ctx", kind)
        done.append("short sequence")
    _gradient_check(cls, kind)
    done.append("gradients" + (", no ready-made operator" if kind in FORBIDDEN else ""))
    return done


# The modules whose notebook forbids torch's own implementation (the grader's judge refuses them as well)
FORBIDDEN = {
    "LayerNorm": (NORM_OPS, "the exercise is LayerNorm from tensor operations, without F.layer_norm or nn.LayerNorm"),
    "Attention": (
        ATTENTION_OPS,
        "the exercise is attention from tensor operations, without F.scaled_dot_product_attention or nn.MultiheadAttention",
    ),
}


def _gradient_check(cls, kind: str) -> None:
    """One random cotangent backpropagated through the learner's module and TransformerLens's, with the same
    weights, in training mode: each trainable parameter's gradient, and the input's where it is a float, must match.
    A `.detach()`, `.data` or a value computed outside autograd gives the right outputs and the wrong gradients:
    training would never move that weight, and the grader's judge refuses it."""
    cfg, what = PROBE_CONFIG, getattr(cls, "__name__", "module")
    module = build(cls, cfg)
    _randomize(module, cfg, 5)
    reference = _oracle(kind, cfg)
    _load_into(reference, _learner_weights(module))
    module.train()
    reference.train()
    gen = torch.Generator().manual_seed(4321)
    x = _probe_input(kind, cfg, (2, 5), gen)
    floats = not KINDS[kind].takes_tokens
    mine, theirs = x.clone().requires_grad_(floats), x.clone().requires_grad_(floats)
    with torch.enable_grad():
        if kind in FORBIDDEN:  # the same forward, recorded: the operator the notebook forbids must not run in it
            patterns, rule = FORBIDDEN[kind]
            out = refuse_operators(module, mine, patterns=patterns, what=f"{what}.forward", rule=rule)
        else:
            out = call(module, mine, what=f"{what}.forward")
        out = as_tensor_output(out, f"{what}.forward")
        expected = _run_reference(reference, theirs, grad=True)
        cotangent = torch.randn(expected.shape, generator=gen)
        if not out.requires_grad:
            fail(
                f"{what}'s output carries no gradient (requires_grad is False) although its parameters require one: "
                "training could not change them. Something in forward cuts the graph: a .detach(), .data, "
                "torch.no_grad(), or a value made outside torch (a float(), .item() or .tolist() turned back into a "
                "tensor)."
            )
        (out * cotangent).sum().backward()
        (expected * cotangent).sum().backward()
    learner = dict(module.named_parameters())
    pairs = [("its input", mine.grad, theirs.grad)] if floats else []
    for name, param in reference.named_parameters():
        own = learner.get(name)
        if own is not None and own.requires_grad:  # a weight kept frozen on purpose (the course's b_U) is not judged
            pairs.append((f"its parameter {name}", own.grad, param.grad))
    for where, got, due in pairs:
        if due is None:
            continue
        # a parameter whose gradient is zero in TransformerLens's too may get none: the key bias b_K shifts every
        # score of a query alike, which the softmax ignores (an attention without it was refused: agreement sweep 19)
        if got is None and due.abs().max().item() <= _tolerance(due):
            continue
        if got is None or not got.abs().any() and due.abs().max().item() > _tolerance(due):
            fail(
                f"{what}: no gradient reaches {where} (its output is right): training could never change "
                f"{'it' if 'parameter' in where else 'what feeds it'}. Something in forward cuts the graph on the way "
                "there: a .detach(), .data, torch.no_grad(), or a value made outside torch and turned back into a "
                "tensor."
            )
        summary = mismatch_summary(got, due, _tolerance(due), 1e-3)
        if summary is not None:
            fail(
                f"{what}: the gradient that reaches {where} differs from TransformerLens's, though the output is right "
                f"(one random cotangent, backpropagated in training mode: {summary}). Part of forward is cut from the "
                "graph (a .detach(), .data, torch.no_grad()) or computed in a way autograd cannot follow."
            )


def _success(check: str, cls, kind: str, shape, probes: list[str], extra: str = "") -> None:
    name = getattr(cls, "__name__", kind)
    print(f"{check}({name}) passed: output shape {list(shape)}{extra}; probes: {', '.join(probes)}.")


def _resolve_cfg(cfg):
    if cfg is None:
        return Config()
    if not dataclasses.is_dataclass(cfg) or not hasattr(cfg, "d_model"):
        fail(f"cfg must be a Config, got {type(cfg).__name__}.")
    return cfg


def _rand_test(check: str, cls, shape, cfg, takes_tokens: bool) -> None:
    cfg = _resolve_cfg(cfg)
    shape = tuple(int(s) for s in shape)
    what = getattr(cls, "__name__", "module")
    module = build(cls, cfg)
    kind = _identify(module, cls, cfg)
    if KINDS[kind].takes_tokens != takes_tokens:
        other = "rand_int_test" if KINDS[kind].takes_tokens else "rand_float_test"
        fail(
            f"{what} looks like a {kind}, which takes {'token ids' if KINDS[kind].takes_tokens else 'floats'}: use {other}."
        )
    gen = torch.Generator().manual_seed(0)
    if takes_tokens:
        x = torch.randint(0, cfg.d_vocab, shape, generator=gen)
    else:
        if shape[-1] != cfg.d_model:
            fail(f"The last dimension of the input shape must be d_model={cfg.d_model}, got shape {list(shape)}.")
        x = torch.randn(shape, generator=gen)
    # The module built to identify the kind is the one checked: a GPT-2-sized constructor runs once, not twice.
    _module_check(cls, cfg, x, 0, "with random weights on a random input", kind, module=module)
    probes = _run_probes(cls, kind)
    _success(check, cls, kind, _expected_shape(kind, shape, cfg), probes, ", matches TransformerLens")


def rand_int_test(cls, shape, cfg: Config | None = None) -> None:
    """Check a module that takes token ids (Embed, PosEmbed, the full model) on random tokens of `shape`."""
    _rand_test("rand_int_test", cls, shape, cfg, takes_tokens=True)


def rand_float_test(cls, shape, cfg: Config | None = None) -> None:
    """Check a module that takes floats (LayerNorm, Attention, MLP, TransformerBlock, Unembed) on randn(`shape`)."""
    _rand_test("rand_float_test", cls, shape, cfg, takes_tokens=False)


def _reference_cfg(reference_module) -> Config:
    tl_cfg = getattr(reference_module, "cfg", None)
    if tl_cfg is None:
        from harness import reference as ref

        if not ref._loaded:
            fail("Could not tell the reference's config: pass cfg=Config.from_reference(reference).")
        tl_cfg = next(reversed(ref._loaded.values())).cfg
    return Config.from_reference(type("M", (), {"cfg": tl_cfg}))


def load_gpt2_test(cls, reference_module, input, cfg: Config | None = None) -> None:
    """Load `reference_module`'s weights strictly into `cls(cfg)` and compare outputs on `input`."""
    if not isinstance(reference_module, torch.nn.Module):
        fail(
            f"reference_module must be a module of the reference model (e.g. reference.ln_final), got {type(reference_module).__name__}."
        )
    if not isinstance(input, Tensor):
        fail(f"input must be a torch.Tensor, got {type(input).__name__}.")
    cfg = _resolve_cfg(cfg) if cfg is not None else _reference_cfg(reference_module)
    what = getattr(cls, "__name__", "module")
    module = build(cls, cfg)
    reference_shapes = {name: tuple(p.shape) for name, p in reference_module.named_parameters()}
    kind = _identify(module, cls, cfg)
    _compare_weights(kind, module, reference_shapes, what)
    _load_into(module, dict(reference_module.named_parameters()))
    module.eval()
    x = input.detach().clone()
    with torch.no_grad():
        out = _forward(module, x, what, kind, cfg)
        expected = _run_reference(reference_module, x)
    atol = 1e-4 * max(1.0, expected.abs().mean().item())
    summary = mismatch_summary(out, expected, atol, 1e-4, _axis_names(kind, out))
    if summary is not None:
        hint = _variants.diagnose(kind, reference_module, x, out, atol, 1e-4)
        if not hint and kind == "TransformerBlock":
            hint = _variants.diagnose_block(module, reference_module, x, atol, 1e-4)
        elif not hint and kind == "DemoTransformer":
            hint = _variants.diagnose_model(module, reference_module, x, atol, 1e-4)
        if hint:  # the likely cause first, then the evidence
            fail(f"{what}: {hint} (With the reference's weights it does not reproduce its output: {summary}.)")
        fail(f"{what} with the reference's weights does not reproduce its output: {summary}.")
    probes = _run_probes(cls, kind)
    diff = (out - expected).abs().max().item()
    _success("load_gpt2_test", cls, kind, out.shape, probes, f", max difference from the reference {diff:.2e}")
