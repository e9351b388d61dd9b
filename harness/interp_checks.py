"""Checks for notebook 08 (interpretability): activation caching with hooks, head detectors, the induction score,
the repeated-segment data, mean ablation, the logit lens and direct logit attribution.

The oracles are TransformerLens's own (`run_with_cache`, `run_with_hooks`, its `ln_final` and `unembed`) on small
random models whose biases and LayerNorm parameters are far from their defaults, so that leaving one out shows; the
detectors are checked on crafted patterns whose scores are known. When an answer is wrong, the usual mistakes are
recomputed on the same input and the one that matches is named; when none matches, the message says what differs.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
from torch import Tensor

from harness._assertions import as_tensor_output, assert_unchanged, call, defaults_as_given, fail, mismatch_summary
from harness.config import Config

__all__ = [
    "cache_activations_test",
    "composition_test",
    "head_detector_test",
    "induction_score_test",
    "logit_attribution_test",
    "logit_lens_test",
    "mean_ablation_test",
    "patching_test",
    "pattern_test",
    "repeated_segments_test",
]


def _name(fn, default: str) -> str:
    if not callable(fn):
        fail(f"Expected the function itself, got {type(fn).__name__}.")
    return getattr(fn, "__name__", default)


def _close(a: Tensor, b: Tensor, atol: float = 1e-4) -> bool:
    return tuple(a.shape) == tuple(b.shape) and bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=1e-4))


# ---------------------------------------------------------------------------------------------------------------
# Small random models: every bias and LayerNorm parameter non-trivial, so a term left out changes the numbers.

_SMALL = Config(d_model=32, n_layers=3, n_heads=4, d_head=8, d_mlp=64, n_ctx=24, d_vocab=61)


def _randomise(module: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith(".w"):
                param.copy_(1.0 + 0.3 * noise)
            elif name.split(".")[-1].startswith("b"):
                param.copy_(0.3 * noise)
            else:
                param.copy_(noise / param.shape[-2 if param.ndim > 1 else -1] ** 0.5)


@functools.cache
def _course_models() -> tuple:
    """(GPT-2-shaped course model, attention-only course model), random weights, eval mode."""
    from harness.course import components

    course = components("08_interpretability")
    gpt2 = course.DemoTransformer(_SMALL)
    attn_only = course.AttnOnlyTransformer(Config(**{**_SMALL.__dict__, "n_layers": 2, "d_mlp": 0}))
    _randomise(gpt2, 0)
    _randomise(attn_only, 1)
    return gpt2.eval(), attn_only.eval()


def _hooked(model):
    from harness.interp import to_hooked_transformer

    return to_hooked_transformer(model)


@functools.cache
def _hooked_gpt2():
    return _hooked(_course_models()[0])


@functools.cache
def _hooked_deep_gpt2():
    """The small course model with GPT-2's 12 layers, random weights."""
    from harness.course import components

    model = components("08_interpretability").DemoTransformer(Config(**{**_SMALL.__dict__, "n_layers": 12}))
    _randomise(model, 2)
    return _hooked(model.eval())


@functools.cache
def _hooked_attn_only():
    return _hooked(_course_models()[1])


def _tokens(seed: int, batch: int = 3, pos: int = 12, d_vocab: int = _SMALL.d_vocab) -> Tensor:
    return torch.randint(0, d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def _run_with_cache(hooked, tokens):
    with torch.no_grad():
        return hooked.run_with_cache(tokens)


def _no_hook_points_left(hooked, name: str, consequence: str) -> None:
    """Fails (after clearing them, for the next call) if the learner's function left TransformerLens hooks."""
    left = [hp for hp in hooked.hook_dict.values() if hp.fwd_hooks or hp.bwd_hooks]
    if left:
        hooked.reset_hooks(including_permanent=True)
        fail(
            f"{name} left {len(left)} hook(s) on the model (e.g. on {left[0].name}): {consequence}. run_with_hooks "
            "removes its hooks itself; add_hook needs reset_hooks() afterwards."
        )


def _hooks_left(model: torch.nn.Module) -> list[str]:
    left = []
    for name, module in model.named_modules():
        n = len(module._forward_hooks) + len(module._forward_pre_hooks)
        if n:
            left.append(f"{name or 'the model'} ({n})")
    return left


# ---------------------------------------------------------------------------------------------------------------
# cache_activations


def _cache_names(n_layers: int, with_mlp: bool) -> list[str]:
    names = ["hook_embed", "hook_pos_embed"]
    for i in range(n_layers):
        b = f"blocks.{i}."
        names += [b + "hook_resid_pre", b + "attn.hook_pattern", b + "hook_attn_out"]
        if with_mlp:
            names += [b + "hook_resid_mid", b + "hook_mlp_out"]
        names.append(b + "hook_resid_post")
    return names


def _attention_variants(cache, layer: int) -> dict[str, Tensor]:
    """The usual wrong patterns, recomputed from the cached queries and keys."""
    q = cache[f"blocks.{layer}.attn.hook_q"]  # [batch pos n_heads d_head]
    k = cache[f"blocks.{layer}.attn.hook_k"]
    raw = torch.einsum("bqhd,bkhd->bhqk", q, k)
    scaled = raw / q.shape[-1] ** 0.5
    n = q.shape[1]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    return {
        "the scores before the softmax (masked and scaled)": scaled.masked_fill(future, -1e5),
        "the scores before the softmax and the mask": scaled,
        "a softmax with no causal mask: queries see future keys": scaled.softmax(-1),
        "a softmax of scores not divided by sqrt(d_head)": raw.masked_fill(future, -1e5).softmax(-1),
        "a softmax of scores with neither the mask nor the 1/sqrt(d_head) scale": raw.softmax(-1),
        "the pattern with query and key swapped ([batch n_heads key query]); TransformerLens's order is [batch n_heads query key]": scaled.masked_fill(
            future, -1e5
        )
        .softmax(-1)
        .transpose(-1, -2),
    }


def _diagnose_pattern(got: Tensor, cache, layer: int, name: str, key: str, verb: str = "stored") -> str:
    for label, variant in _attention_variants(cache, layer).items():
        if _close(got, variant):
            return f"{name} stored `{key}` as {label}" if verb == "stored" else f"{name} {verb} {label}"
    expected = cache[f"blocks.{layer}.attn.hook_pattern"]
    subject = f"{name}'s `{key}`" if verb == "stored" else f"{name}'s pattern"
    if tuple(got.shape) == tuple(expected.shape):
        sums = got.sum(-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            return (
                f"{subject} rows do not sum to 1 (row sums range {sums.min().item():.3g} to "
                f"{sums.max().item():.3g}): take the pattern after the softmax over keys"
            )
        if got.triu(1).abs().max() > 1e-6:
            return f"{subject} has weight on future keys: apply the causal mask before the softmax"
    return ""


def pattern_test(recompute_pattern) -> None:
    """Checks `recompute_pattern(attn, normalized_resid_pre) -> [batch n_heads query key]` against TransformerLens's
    `hook_pattern`, for every layer of a GPT-2-shaped and an attention-only model with random weights."""
    name = _name(recompute_pattern, "recompute_pattern")
    for model, hooked in ((_course_models()[0], _hooked_gpt2()), (_course_models()[1], _hooked_attn_only())):
        tokens = _tokens(6, batch=2, pos=9)
        _, cache = _run_with_cache(hooked, tokens)
        for layer, block in enumerate(model.blocks):
            with torch.no_grad():  # what the attention module receives: ln1 of the residual stream
                x = block.ln1(cache[f"blocks.{layer}.hook_resid_pre"])
            given = x.clone()
            call_text = f"{name}(model.blocks[{layer}].attn, normalized_resid_pre)"
            with torch.no_grad():
                got = as_tensor_output(call(recompute_pattern, block.attn, given, what=call_text), name)
            if not torch.equal(given, x):
                fail(f"{name} modified its input in place.")
            expected = cache[f"blocks.{layer}.attn.hook_pattern"]
            if _close(got, expected):
                continue
            if tuple(got.shape) != tuple(expected.shape):
                fail(
                    f"{call_text} returned shape {list(got.shape)}, expected [batch, n_heads, query, key] = "
                    f"{list(expected.shape)}."
                )
            attn = block.attn
            unbiased_q = torch.einsum("bpm,nmh->bnph", x, attn.W_Q)
            unbiased_k = torch.einsum("bpm,nmh->bnph", x, attn.W_K)
            n = x.shape[1]
            future = torch.ones(n, n, dtype=torch.bool).triu(1)
            no_bias = (unbiased_q @ unbiased_k.transpose(-1, -2) / attn.cfg.d_head**0.5).masked_fill(future, -1e5)
            if _close(got, no_bias.softmax(-1)):
                fail(f"{call_text} leaves out the biases b_Q and b_K: queries and keys are x @ W + b.")
            q = unbiased_q + attn.b_Q[:, None]
            k = unbiased_k + attn.b_K[:, None]
            scores = (q @ k.transpose(-1, -2) / attn.cfg.d_head**0.5).masked_fill(future, -1e5)
            raw = (q @ k.transpose(-1, -2)).masked_fill(future, -1e5)
            if _close(got, (raw / attn.cfg.d_model**0.5).softmax(-1)):
                fail(f"{call_text} divides the scores by sqrt(d_model); the scale is sqrt(d_head), a head's width.")
            if _close(got, scores.softmax(dim=-2)):
                fail(
                    f"{call_text} takes the softmax over the queries (dim -2); each query's weights over the keys sum to 1."
                )
            message = _diagnose_pattern(got, cache, layer, name, "the pattern", verb="returned")
            if message:
                fail(message + ".")
            fail(
                f"{call_text} differs from TransformerLens's hook_pattern: {mismatch_summary(got, expected, 1e-4, 1e-4)}."
            )
    print(f"{name} passed: matches TransformerLens's hook_pattern at every layer of two models.")


def cache_activations_test(cache_activations) -> None:
    """Checks `cache_activations(model, tokens) -> dict` against TransformerLens's `run_with_cache`, on a GPT-2-shaped
    course model and an attention-only one (random weights), and that no hook is left on the model."""
    name = _name(cache_activations, "cache_activations")
    for model, hooked, kind in (
        (_course_models()[0], _hooked_gpt2(), "a 3-layer GPT-2-shaped model"),
        (_course_models()[1], _hooked_attn_only(), "a 2-layer attention-only model (blocks without ln2 and mlp)"),
    ):
        tokens = _tokens(5)
        with torch.no_grad():
            expected_logits = model(tokens)
        with torch.enable_grad():  # so that a cache of undetached tensors shows (they would require grad)
            hint = ""
            try:
                got = fn_out = cache_activations(model, tokens)
            except AttributeError as err:
                if "mlp" in str(err) or "ln2" in str(err):
                    hint = " The attention-only model's blocks have no `ln2` or `mlp`: register those hooks only where the block has them (hasattr)."
                raise AssertionError(f"{name}(model, tokens) raised AttributeError on {kind}: {err}.{hint}") from err
            except AssertionError:
                raise
            except Exception as err:
                raise AssertionError(f"{name}(model, tokens) raised {type(err).__name__} on {kind}: {err}") from err
            left = _hooks_left(model)
            for _, module in model.named_modules():  # leave the shared test model clean for the next call
                module._forward_hooks.clear()
                module._forward_pre_hooks.clear()
            if left:
                fail(
                    f"{name} left hooks registered on {', '.join(left[:4])}{' ...' if len(left) > 4 else ''}: every "
                    "later forward pass would still run them (and keep filling an old cache). Keep the handle that "
                    "register_forward_hook returns and call handle.remove() in a `finally:` block."
                )
            if not isinstance(fn_out, dict):
                fail(f"{name} returned {type(fn_out).__name__}, expected a dict from hook name to tensor.")
            if not torch.allclose(model(tokens).detach(), expected_logits):
                fail(
                    f"{name} changed the model: its logits differ after the call (a hook that returns a value replaces the module's output)."
                )
        _, cache = _run_with_cache(hooked, tokens)
        wanted = _cache_names(model.cfg.n_layers, kind.startswith("a 3-layer"))
        missing = [key for key in wanted if key not in got]
        n_layers = model.cfg.n_layers
        if missing and f"blocks.{n_layers}.hook_resid_pre" in got:
            fail(
                f"{name} numbered the layers from 1 (it has 'blocks.{n_layers}...' but not 'blocks.0...'): TransformerLens counts from 0, as enumerate(model.blocks) does."
            )
        if (
            missing
            and n_layers > 1
            and f"blocks.{n_layers - 1}.hook_resid_pre" in got
            and "blocks.0.hook_resid_pre" not in got
        ):
            fail(
                f"{name} stored every layer under the last layer's names (only 'blocks.{n_layers - 1}...' exist): a hook "
                "function defined inside the loop reads the loop variable when it runs, after the loop has ended. Build each "
                "hook in a factory function that receives its name (or bind it as a default argument)."
            )
        if missing:
            fail(
                f"{name}'s cache of {kind} lacks {len(missing)} of the {len(wanted)} names, e.g. "
                f"{missing[:3]}. Use TransformerLens's names: {wanted[:4]} ..."
            )
        for key in wanted:
            value = got[key]
            if not isinstance(value, Tensor):
                fail(
                    f"{name}'s cache['{key}'] is a {type(value).__name__}, not a tensor (a forward hook's `inputs` is a tuple: take inputs[0])."
                )
            expected = cache[key]
            if _close(value, expected):
                continue
            if key.endswith("hook_pattern"):
                layer = int(key.split(".")[1])
                message = _diagnose_pattern(value, cache, layer, name, key)
                if message:
                    fail(message + ".")
            for other in wanted:
                if other != key and _close(value, cache[other]):
                    fail(
                        f"{name}'s cache['{key}'] holds what TransformerLens calls '{other}': "
                        + (
                            "the layer index is off."
                            if other.split(".")[2:] == key.split(".")[2:]
                            else "the hook is on the wrong module, or saves its input where the output is due (or the reverse)."
                        )
                    )
            if tuple(value.shape) != tuple(expected.shape):
                fail(f"{name}'s cache['{key}'] has shape {list(value.shape)}, expected {list(expected.shape)}.")
            fail(
                f"{name}'s cache['{key}'] differs from run_with_cache's: {mismatch_summary(value, expected, 1e-4, 1e-4)}."
            )
        if any(v.requires_grad for v in got.values() if isinstance(v, Tensor)):
            fail(
                f"{name} stored tensors that still require grad: detach them (a cache should not keep the graph alive)."
            )
    print(
        f"{name} passed: every activation matches run_with_cache on a GPT-2-shaped and an attention-only model; no hook left behind."
    )


# ---------------------------------------------------------------------------------------------------------------
# Head detectors on crafted patterns


def _right_at_size(name: str, got, expected, right_at: str, wrong_at: str, judged: str) -> None:
    """Fails unless `got` matches `expected` at a larger size than the check's first one: the judge draws such sizes
    (a number of rows, positions or layers written into the code passed the first size alone: red-team round 51).
    The message says what was seen at each size, not why."""
    got = as_tensor_output(got, name)
    if tuple(got.shape) == tuple(expected.shape) and _close(got, expected):
        return
    seen = (
        f"shape {list(got.shape)} where {list(expected.shape)} is due"
        if tuple(got.shape) != tuple(expected.shape)
        else mismatch_summary(got, expected, 1e-4, 1e-4)
    )
    fail(
        f"{name} is right {right_at} and differs {wrong_at} ({seen}). The judge draws {judged}: look for a size "
        "written into your code, or a loop or slice that stops early."
    )


def _crafted_patterns(batch: int, n_pos: int, seed: int, stripes: list[int | str]) -> Tensor:
    """One head per entry: an int k puts 0.9 of each query's weight on key q-k (when it exists), 'first' on key 0,
    'uniform' spreads it evenly, 'random' is a random causal softmax. The rest is spread over the other keys."""
    generator = torch.Generator().manual_seed(seed)
    causal = torch.ones(n_pos, n_pos).tril().bool()
    heads = []
    for stripe in stripes:
        if stripe == "random":
            scores = 2 * torch.randn(batch, n_pos, n_pos, generator=generator)
            heads.append(scores.masked_fill(~causal, float("-inf")).softmax(-1))
            continue
        base = causal.float() / causal.sum(-1, keepdim=True)
        pattern = base.expand(batch, n_pos, n_pos).clone()
        if stripe == "uniform":
            heads.append(pattern)
            continue
        for q in range(n_pos):
            k = 0 if stripe == "first" else q - stripe
            if k < 0 or q == 0:
                continue
            row = torch.zeros(n_pos)
            row[: q + 1] = 0.1 / q if q > 0 else 0
            row[k] = 0.9 if q > 0 else 1.0
            row[: q + 1] /= row[: q + 1].sum()
            pattern[:, q] = row
        heads.append(pattern)
    return torch.stack(heads, dim=1)  # [batch n_heads query key]


def _detector_oracle(pattern: Tensor, include_query_0: bool = False) -> dict[str, Tensor]:
    start = 0 if include_query_0 else 1
    return {
        "previous": pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, -1)),
        "current": pattern.diagonal(dim1=-2, dim2=-1)[..., start:].mean((0, -1)),
        "first": pattern[..., start:, 0].mean((0, -1)),
    }


def head_detector_test(head_detector_scores) -> None:
    """Checks `head_detector_scores(pattern) -> {"previous", "current", "first": [n_heads]}` on crafted patterns."""
    name = _name(head_detector_scores, "head_detector_scores")
    pattern = _crafted_patterns(3, 9, 0, [1, 0, "first", "uniform", "random"])
    given = pattern.clone()
    out = call(head_detector_scores, given, what=f"{name}(pattern)")
    if not torch.equal(given, pattern):
        fail(f"{name} modified the pattern in place.")
    if not isinstance(out, dict):
        fail(f"{name} returned {type(out).__name__}; return a dict with the keys 'previous', 'current' and 'first'.")
    expected = _detector_oracle(pattern)
    if set(out) != set(expected):
        fail(f"{name} returned the keys {sorted(out)}; expected exactly {sorted(expected)}.")
    n_heads = pattern.shape[1]
    for key in ("previous", "current", "first"):
        got = as_tensor_output(out[key], f"{name}(...)['{key}']")
        if tuple(got.shape) != (n_heads,):
            extra = ""
            if tuple(got.shape) == (pattern.shape[0], n_heads):
                extra = " It still has the batch dimension: average over the batch too."
            elif got.ndim == 2 and got.shape[0] == n_heads:
                extra = " It still has a position dimension: average over the query positions."
            fail(f"{name}(...)['{key}'] has shape {list(got.shape)}, expected [n_heads] = [{n_heads}].{extra}")
        if _close(got, expected[key]):
            continue
        variants = {}
        if key == "previous":
            variants[
                "read the diagonal above the main one (key q+1, which the causal mask zeroes; or the query and key axes are swapped): the previous token is offset=-1 on [..., query, key]"
            ] = pattern.diagonal(offset=1, dim1=-2, dim2=-1).mean((0, -1))
        variants |= {
            "included query 0, which can attend only to itself (key 0 is both the current and the first token there): average queries 1 onwards": _detector_oracle(
                pattern, True
            )[key],
            "took the key axis for the query axis (pattern is [batch n_heads query key])": _detector_oracle(
                pattern.transpose(-1, -2)
            )[key],
            "summed where the mean is due": pattern.diagonal(
                offset=-1 if key == "previous" else 0, dim1=-2, dim2=-1
            ).sum((0, -1))
            if key != "first"
            else pattern[..., 1:, 0].sum((0, -1)),
            "averaged over every key of each row (which is 1/(q+1) on average for any head), not over the queries' chosen key": pattern[
                ..., 1:, :
            ].mean((0, -2, -1)),
        }
        for label, variant in variants.items():
            if _close(got, variant):
                fail(f"{name}'s '{key}' score {label}.")
        fail(
            f"{name}'s '{key}' scores are {[round(v, 3) for v in got.tolist()]}, expected "
            f"{[round(v, 3) for v in expected[key].tolist()]} on crafted heads (previous-token, current-token, "
            "first-token, uniform, random)."
        )
    # one batch row and one head: every axis of size one that a bare `.squeeze()` would drop (the grader's judge
    # probes such shapes, and a squeeze there passed this check: agreement sweep 18)
    lone = _crafted_patterns(1, 9, 1, [1])
    squeeze = "a bare .squeeze() also drops the batch and head axes when they have size one"
    try:
        out = call(head_detector_scores, lone.clone(), what=f"{name}(pattern of 1 batch row, 1 head)")
    except AssertionError as err:
        raise AssertionError(f"{err}. It was right on 3 rows of 5 heads: {squeeze}.") from err
    for key, want in _detector_oracle(lone).items():
        got = as_tensor_output(out[key] if isinstance(out, dict) and key in out else None, f"{name}(...)['{key}']")
        if tuple(got.shape) != (1,) or not _close(got, want):
            fail(
                f"{name} on a pattern of one batch row and one head gave '{key}' {got.tolist()} of shape "
                f"{list(got.shape)}, expected [1] = {[round(v, 3) for v in want.tolist()]}: reduce the axes by "
                f"position ({squeeze})."
            )
    rows = 20  # the judge draws 17 to 40 rows as well as a few
    many = _crafted_patterns(rows, 9, 11, [1, 0, "first", "uniform", "random"])
    out = call(head_detector_scores, many.clone(), what=f"{name}(pattern)")
    want = _detector_oracle(many)
    for key in ("previous", "current", "first"):
        got = out.get(key) if isinstance(out, dict) else None
        _right_at_size(f"{name}(...)['{key}']", got, want[key], "on 3 rows", f"on {rows}", "17 to 40 rows too")
    print(
        f"{name} passed: previous-, current- and first-token scores match on crafted heads, query 0 left out, on 3 "
        f"rows and on {rows}."
    )


def _induction_oracle(pattern: Tensor, offset: int, seq_len: int) -> Tensor:
    return pattern.diagonal(offset=-offset, dim1=-2, dim2=-1)[..., -seq_len:].mean((0, -1))


def induction_score_test(induction_scores) -> None:
    """Checks `induction_scores(pattern, seq_len) -> [n_heads]` on crafted [BOS, r, r] patterns."""
    name = _name(induction_scores, "induction_scores")
    seq_len = 7
    n_pos = 1 + 2 * seq_len
    pattern = _crafted_patterns(2, n_pos, 3, [seq_len - 1, seq_len, 1, "uniform", "random"])
    given = pattern.clone()
    got = as_tensor_output(call(induction_scores, given, seq_len, what=f"{name}(pattern, {seq_len})"), name)
    if not torch.equal(given, pattern):
        fail(f"{name} modified the pattern in place.")
    n_heads = pattern.shape[1]
    expected = _induction_oracle(pattern, seq_len - 1, seq_len)
    if tuple(got.shape) != (n_heads,):
        extra = ""
        if tuple(got.shape) == (pattern.shape[0], n_heads):
            extra = " It still has the batch dimension: average over the batch too."
        elif got.numel() in (seq_len, seq_len + 2):
            extra = " It has one value per position: average over the queries, keep the heads."
        fail(f"{name} returned shape {list(got.shape)}, expected [n_heads] = [{n_heads}].{extra}")
    if _close(got, expected):
        other = 4  # a second length: the offset and the queries averaged must follow the argument
        pattern = _crafted_patterns(2, 1 + 2 * other, 5, [other - 1, other, 1, "uniform", "random"])
        again = as_tensor_output(call(induction_scores, pattern.clone(), other, what=f"{name}(pattern, {other})"), name)
        want = _induction_oracle(pattern, other - 1, other)
        if tuple(again.shape) != tuple(want.shape) or not _close(again, want):
            fail(
                f"{name}(pattern, {other}) gave {[round(v, 3) for v in again.flatten().tolist()]}, expected "
                f"{[round(v, 3) for v in want.tolist()]}, while seq_len = {seq_len} was right: the stripe's offset "
                "(seq_len - 1) and the queries averaged (the last seq_len) must follow the seq_len argument."
            )
        long = 60  # the judge repeats sequences of 51 to 100 tokens as well as short ones
        pattern = _crafted_patterns(2, 1 + 2 * long, 9, [long - 1, long, 1, "uniform", "random"])
        again = call(induction_scores, pattern.clone(), long, what=f"{name}(pattern, {long})")
        right = f"for seq_len = {seq_len} and {other}"
        _right_at_size(name, again, _induction_oracle(pattern, long - 1, long), right, f"for {long}", "51 to 100 too")
        print(
            f"{name} passed: scores the induction stripe (offset seq_len - 1) over the second copy's queries only, "
            f"for seq_len = {seq_len}, {other} and {long}."
        )
        return
    variants = {
        f"used offset seq_len = {seq_len}: that is the earlier copy of the same token, which duplicate-token heads attend to. An induction head attends to the token *after* it, seq_len - 1 back": _induction_oracle(
            pattern, seq_len, seq_len
        ),
        "averaged over queries from the first copy too, where no earlier occurrence exists: keep the last seq_len queries of the stripe": pattern.diagonal(
            offset=-(seq_len - 1), dim1=-2, dim2=-1
        ).mean((0, -1)),
        "averaged the second copy's whole rows (all keys), not the stripe's entry": pattern[..., -seq_len:, :].mean(
            (0, -2, -1)
        ),
        f"used offset seq_len - 2 = {seq_len - 2}": _induction_oracle(pattern, seq_len - 2, seq_len),
        "averaged one query too few or too many": _induction_oracle(pattern, seq_len - 1, seq_len - 1),
    }
    variants["averaged one query too few or too many "] = pattern.diagonal(offset=-(seq_len - 1), dim1=-2, dim2=-1)[
        ..., -(seq_len + 1) :
    ].mean((0, -1))
    for label, variant in variants.items():
        if _close(got, variant):
            fail(f"{name} {label.strip()}.")
    fail(
        f"{name} gave {[round(v, 3) for v in got.tolist()]}, expected {[round(v, 3) for v in expected.tolist()]} on "
        "crafted heads (induction, duplicate-token, previous-token, uniform, random)."
    )


# ---------------------------------------------------------------------------------------------------------------
# Repeated-segment training data


def _far_from_uniform(counts: list[int], k: int, rare: float = 1e-9):
    """(value, count, draws, k) for a value drawn further from 1/k of the time than k equally likely values would be
    with probability `rare` (Chernoff's bound, both sides, every value), or None. The judge uses it too."""
    counts = counts + [0] * (k - len(counts))
    total = sum(counts)
    for value, count in enumerate(counts):
        q, p = count / total, 1 / k
        divergence = (q * math.log(q / p) if q else 0.0) + ((1 - q) * math.log((1 - q) / (1 - p)) if q < 1 else 0.0)
        if total * divergence > math.log(2 * k / rare):
            return value, count, total, k
    return None


def _repeats_off(segments: list[list[int]], k: int, rare: float = 1e-9) -> tuple[int, float, int] | None:
    """(rows whose segment repeats a token, how many independent uniform draws from k ids make that on average, rows)
    where the count is further from that than such draws put it with probability `rare` (Hoeffding's bound, both
    sides: rows are independent, each with its own chance of a repeat), or None. A segment drawn without
    replacement (a permutation, a shuffle) never repeats one. The judge uses it too."""
    chances = [1 - math.prod(1 - i / k for i in range(len(segment))) for segment in segments]
    count = sum(len(set(segment)) < len(segment) for segment in segments)
    mean = sum(chances)
    if abs(count - mean) > math.sqrt(len(segments) * math.log(2 / rare) / 2):
        return count, mean, len(segments)
    return None


def repeated_segments_test(repeated_segments) -> None:
    """Checks `repeated_segments(batch, n_ctx, d_vocab, min_period, max_period, generator) -> (tokens, periods)`."""
    name = _name(repeated_segments, "repeated_segments")
    defaults_as_given(repeated_segments, "08_interpretability", "repeated_segments", name)
    # two argument sets: every argument changes between them (a hard-coded one shows), a small vocabulary last
    for batch, n_ctx, d_vocab, lo, hi in ((4000, 40, 30, 3, 9), (3000, 23, 7, 2, 5)):
        call_text = f"{name}({batch}, {n_ctx}, {d_vocab}, {lo}, {hi}, generator)"
        out = call(repeated_segments, batch, n_ctx, d_vocab, lo, hi, torch.Generator().manual_seed(0), what=call_text)
        if not (isinstance(out, tuple) and len(out) == 2):
            fail(f"{name} must return a pair (tokens, periods); got {type(out).__name__}.")
        tokens, periods = (as_tensor_output(t, name) for t in out)
        if tuple(tokens.shape) != (batch, n_ctx):
            fail(
                f"{name}'s tokens have shape {list(tokens.shape)}, expected [batch, n_ctx] = [{batch}, {n_ctx}] (BOS included)."
            )
        if tuple(periods.shape) != (batch,):
            fail(
                f"{name}'s periods have shape {list(periods.shape)}, expected [batch] = [{batch}]: one period per row."
            )
        if tokens.dtype != torch.long or periods.dtype != torch.long:
            fail(f"{name} must return integer (torch.long) tensors; got {tokens.dtype} and {periods.dtype}.")
        if not (tokens[:, 0] == 0).all():
            fail(
                f"{name}'s rows do not start with BOS (token 0): {int((tokens[:, 0] != 0).sum())} of {batch} rows start "
                "with another token. The model needs a fixed first token to attend to when nothing else fits."
            )
        body = tokens[:, 1:]
        if body.min() < 1 or body.max() > d_vocab - 1:
            fail(
                f"{name}'s segments use tokens {int(body.min())}..{int(body.max())}; they must be 1..d_vocab-1 = "
                f"1..{d_vocab - 1} (0 is BOS, and d_vocab - 1 is the last id there is)."
            )
        if periods.min() < lo or periods.max() > hi:
            fail(
                f"{name}'s periods range {int(periods.min())}..{int(periods.max())}, outside min_period..max_period = {lo}..{hi}."
            )
        if periods.unique().numel() == 1:
            fail(
                f"{name} gives every row the same period ({int(periods[0])}): with a fixed period a head that attends a "
                "fixed distance back does the job, and no induction head needs to form. Draw a period per row."
            )
        if int(periods.max()) != hi or int(periods.min()) != lo:
            fail(
                f"{name} never drew period {hi if int(periods.max()) != hi else lo} in {batch} rows: the periods must run "
                "from min_period to max_period inclusive (torch.randint's upper bound is exclusive)."
            )
        index = torch.arange(n_ctx - 1)
        for row in range(batch):
            p = int(periods[row])
            if not torch.equal(body[row, p:], body[row, : n_ctx - 1 - p]):
                fail(
                    f"{name}'s row {row} is not its first {p} tokens repeated (its period is {p}); e.g. positions "
                    f"1..{min(n_ctx - 1, 2 * p + 2)}: {tokens[row, 1 : 2 * p + 3].tolist()}."
                )
        del index
        if (body[:, :lo] == body[0, :lo]).all(1).float().mean() > 0.5:
            fail(f"{name} uses the same segment in every row: draw a random segment per row.")
        unused = sorted(set(range(1, d_vocab)) - set(body.unique().tolist()))
        if unused:
            fail(
                f"{name} never used token{'s' if len(unused) > 1 else ''} {unused[:5]} in {batch} rows of "
                f"{n_ctx} with d_vocab = {d_vocab}: the segments draw from every id 1..d_vocab-1."
            )
        drawn = torch.cat([body[row, : int(periods[row])] for row in range(batch)])
        for what, values, first in (("token", drawn, 1), ("period", periods, lo)):
            odd = _far_from_uniform(
                torch.bincount(values - first).tolist(), (d_vocab - 1, hi - lo + 1)[what == "period"]
            )
            if odd is not None:
                value, count, total, k = odd
                fail(
                    f"{name} drew {what} {first + value} {count} times in {total} draws, where {k} equally likely "
                    f"values give about {total / k:.0f}: every {what} in its range must be equally likely "
                    "(rounding a scaled torch.rand, for one, draws the two ends of the range half as often)."
                )
        odd = _repeats_off([body[row, : int(periods[row])].tolist() for row in range(batch)], d_vocab - 1)
        if odd is not None:
            count, mean, rows = odd
            fail(
                f"{name}: {count} of {rows} rows have a segment that repeats a token, where independent draws of each "
                f"token give about {mean:.0f} (a segment drawn without replacement, by torch.randperm or a shuffle, "
                "never repeats one): draw every token of a segment on its own, e.g. with torch.randint."
            )
        again = call(repeated_segments, batch, n_ctx, d_vocab, lo, hi, torch.Generator().manual_seed(0), what=call_text)
        other = call(repeated_segments, batch, n_ctx, d_vocab, lo, hi, torch.Generator().manual_seed(1), what=call_text)
        if not torch.equal(again[0], tokens):
            fail(
                f"{name} gave different tokens for the same generator seed: draw every random number with `generator=generator`."
            )
        if torch.equal(other[0], tokens):
            fail(f"{name} gave the same tokens for two different generator seeds: use the generator it is given.")
    # with no generator: torch's global one, so two calls differ (the notebook's own experiments call it so)
    text = f"{name}(64, 30, 50, 3, 9)"
    first, second = (call(repeated_segments, 64, 30, 50, 3, 9, what=text) for _ in range(2))
    if torch.equal(as_tensor_output(first[0], name), as_tensor_output(second[0], name)):
        fail(
            f"{text}, called twice with no generator, gave the same tokens: with none given, draw from torch's global "
            "generator (generator=None), never from one seeded afresh at each call."
        )
    print(
        f"{name} passed: BOS first, one random segment per row repeated with its own period, every token id used, "
        "reproducible, for two sets of arguments; two calls without a generator differ."
    )


# ---------------------------------------------------------------------------------------------------------------
# Mean ablation


def _ablated(hooked, tokens, layer: int, heads: list[int], how: str) -> Tensor:
    def hook_z(z, hook):
        if how == "mean":
            z[:, :, heads] = z[:, :, heads].mean(0, keepdim=True)
        elif how == "zero":
            z[:, :, heads] = 0.0
        elif how == "mean_all":
            z[:, :, heads] = z[:, :, heads].mean((0, 1), keepdim=True)
        elif how == "position":
            z[:, heads] = z[:, heads].mean(0, keepdim=True)
        elif how == "position_zero":
            z[:, heads] = 0.0
        elif how == "first_only":
            z[:, :, heads[:1]] = z[:, :, heads[:1]].mean(0, keepdim=True)
        return z

    def hook_pattern(pattern, hook):
        pattern[:, heads] = pattern[:, heads].mean(0, keepdim=True) if how == "pattern_mean" else 0.0
        return pattern

    hook_name = f"blocks.{layer}.attn.hook_pattern" if how.startswith("pattern") else f"blocks.{layer}.attn.hook_z"
    fn = hook_pattern if how.startswith("pattern") else hook_z
    with torch.no_grad():
        return hooked.run_with_hooks(tokens, fwd_hooks=[(hook_name, fn)])


def mean_ablation_test(mean_ablate_heads) -> None:
    """Checks `mean_ablate_heads(model, tokens, layer, heads) -> logits` against `run_with_hooks` on a random model,
    for one head and for two heads at once."""
    name = _name(mean_ablate_heads, "mean_ablate_heads")
    hooked = _hooked_gpt2()
    tokens = _tokens(7, batch=4, pos=10)
    params = {k: v.clone() for k, v in hooked.state_dict().items()}
    for layer, heads in ((1, [2]), (2, [0, 3])):
        call_text = f"{name}(model, tokens, layer={layer}, heads={heads})"
        with torch.no_grad():
            out = call(mean_ablate_heads, hooked, tokens, layer, list(heads), what=call_text)
        _no_hook_points_left(hooked, name, "later calls would still be ablated")
        changed = [k for k, v in hooked.state_dict().items() if not torch.equal(v, params[k])]
        if changed:
            hooked.load_state_dict(params)
            fail(
                f"{name} changed the model's weights ({changed[:3]}): ablate the activation through a hook, not the parameters."
            )
        got = as_tensor_output(out, name)
        expected = _ablated(hooked, tokens, layer, heads, "mean")
        if tuple(got.shape) != tuple(expected.shape):
            fail(
                f"{call_text} returned shape {list(got.shape)}, expected the logits' [batch pos d_vocab] = {list(expected.shape)}."
            )
        if _close(got, expected):
            continue
        with torch.no_grad():
            clean = hooked(tokens)
        variants = {
            f"returned the clean logits: nothing was ablated (is the hook on 'blocks.{layer}.attn.hook_z', and does it change z?)": clean,
            "set z to zero (zero ablation); this exercise replaces it by its mean over the batch, which keeps the head's typical output": _ablated(
                hooked, tokens, layer, heads, "zero"
            ),
            "averaged z over the positions as well as the batch: keep each position's own mean (mean over dim 0 only)": _ablated(
                hooked, tokens, layer, heads, "mean_all"
            ),
            "indexed positions, not heads: z is [batch pos n_heads d_head], so the heads are the third index (z[:, :, heads])": _ablated(
                hooked, tokens, layer, heads, "position"
            ),
            "zeroed positions, not heads' z: z is [batch pos n_heads d_head], the heads are the third index": _ablated(
                hooked, tokens, layer, heads, "position_zero"
            ),
            "ablated the attention pattern, not z: the pattern decides where the head looks, z is what it reads; hook 'hook_z'": _ablated(
                hooked, tokens, layer, heads, "pattern_mean"
            ),
            "zeroed the attention pattern, not z: hook 'hook_z' and replace the heads' z by its mean": _ablated(
                hooked, tokens, layer, heads, "pattern_zero"
            ),
        }
        if len(heads) > 1:
            variants[f"ablated only the first head of the list {heads}: ablate every head in `heads`"] = _ablated(
                hooked, tokens, layer, heads, "first_only"
            )
        for other in range(hooked.cfg.n_layers):
            if other != layer:
                variants[f"ablated layer {other}, not layer {layer}"] = _ablated(hooked, tokens, other, heads, "mean")
        for other in range(hooked.cfg.n_heads):
            if [other] != heads:
                variants[f"ablated head {other}, not heads {heads}"] = _ablated(hooked, tokens, layer, [other], "mean")
        for label, variant in variants.items():
            if _close(got, variant):
                fail(f"{call_text} {label}.")
        fail(
            f"{call_text}'s logits differ from run_with_hooks' with those heads mean-ablated: {mismatch_summary(got, expected, 1e-4, 1e-4)}."
        )
    rows = 20  # the judge draws 17 to 40 rows as well as a few
    tokens = _tokens(8, batch=rows, pos=6)
    with torch.no_grad():
        out = call(mean_ablate_heads, hooked, tokens, 1, [2], what=f"{name}(model, tokens, layer=1, heads=[2])")
    _no_hook_points_left(hooked, name, "later calls would still be ablated")
    _right_at_size(name, out, _ablated(hooked, tokens, 1, [2], "mean"), "on 4 rows", f"on {rows}", "17 to 40 rows too")
    print(
        f"{name} passed: matches run_with_hooks with the heads' z replaced by its mean over the batch (one head, and "
        f"two at once; on 4 rows and on {rows})."
    )


# ---------------------------------------------------------------------------------------------------------------
# Logit lens and direct logit attribution


def _lens_oracle(hooked, cache, *, ln: str = "recompute", bias: bool = True, layers: str = "all") -> Tensor:
    n_layers = hooked.cfg.n_layers
    residuals = [cache[f"blocks.{i}.hook_resid_pre"] for i in range(n_layers)]
    residuals.append(cache[f"blocks.{n_layers - 1}.hook_resid_post"])
    if layers == "pre":
        residuals = residuals[:-1]
    elif layers == "post":
        residuals = residuals[1:]
    out = []
    with torch.no_grad():
        for resid in residuals:
            if ln == "recompute":
                x = hooked.ln_final(resid)
            elif ln == "none":
                x = resid
            elif ln == "cached_scale":
                x = (resid - resid.mean(-1, keepdim=True)) / cache[
                    "ln_final.hook_scale"
                ] * hooked.ln_final.w + hooked.ln_final.b
            elif ln == "cached_scale_no_affine":
                x = (resid - resid.mean(-1, keepdim=True)) / cache["ln_final.hook_scale"]
            elif ln == "no_affine":
                x = (resid - resid.mean(-1, keepdim=True)) / (
                    resid.var(-1, keepdim=True, unbiased=False) + hooked.cfg.eps
                ).sqrt()
            logits = x @ hooked.W_U
            out.append(logits + hooked.b_U if bias else logits)
    return torch.stack(out)


def logit_lens_test(logit_lens) -> None:
    """Checks `logit_lens(model, cache) -> [n_layers+1 batch pos d_vocab]` on a random model with a non-zero b_U.
    The oracle equals TransformerLens 3.9's `model.unembed(cache.accumulated_resid(apply_ln=True))`."""
    name = _name(logit_lens, "logit_lens")
    hooked = _hooked_gpt2()
    tokens = _tokens(11)
    logits, cache = _run_with_cache(hooked, tokens)
    with torch.no_grad():
        got = as_tensor_output(call(logit_lens, hooked, cache, what=f"{name}(model, cache)"), name)
    expected = _lens_oracle(hooked, cache)
    n = hooked.cfg.n_layers
    if tuple(got.shape) != tuple(expected.shape):
        extra = ""
        if got.ndim == 4 and got.shape[0] == n:
            for label, layers in (
                ("before each block but not after the last", "pre"),
                ("after each block but not before the first (the embeddings)", "post"),
            ):
                if _close(got, _lens_oracle(hooked, cache, layers=layers)):
                    extra = f" It holds the residual stream {label}: there are n_layers + 1 = {n + 1} readouts."
        fail(
            f"{name} returned shape {list(got.shape)}, expected [n_layers+1, batch, pos, d_vocab] = {list(expected.shape)}.{extra}"
        )
    if _close(got, expected, atol=1e-3):
        if not _close(got[-1], logits, atol=1e-3):
            fail(f"{name}'s last readout differs from the model's logits.")
        deep = _hooked_deep_gpt2()  # GPT-2's 12 layers, as the judge draws them too
        tokens = _tokens(12, batch=2, pos=5)
        _, deep_cache = _run_with_cache(deep, tokens)
        with torch.no_grad():
            again = call(logit_lens, deep, deep_cache, what=f"{name}(model, cache)")
        layers = deep.cfg.n_layers
        wrong = f"on {layers} layers"
        _right_at_size(name, again, _lens_oracle(deep, deep_cache), f"on {n} layers", wrong, "GPT-2's 12 layers too")
        print(
            f"{name} passed: each residual stream through ln_final and the unembedding, on {n} layers and on {layers}; "
            "the last one is the model's logits."
        )
        return
    variants = {
        "skipped the final LayerNorm: the unembedding was trained on ln_final's output, so apply model.ln_final first": _lens_oracle(
            hooked, cache, ln="none"
        ),
        "left out the unembedding bias b_U (this check's model has a non-zero one): use model.unembed, or add model.b_U": _lens_oracle(
            hooked, cache, bias=False
        ),
        "normalised every layer with the last layer's cached scale (ln_final.hook_scale): each layer's stream has its own size, so recompute the LayerNorm (model.ln_final does)": _lens_oracle(
            hooked, cache, ln="cached_scale"
        ),
        "divided every layer by the last layer's cached scale (ln_final.hook_scale) and applied neither ln_final.w nor ln_final.b: pass each residual stream through model.ln_final itself": _lens_oracle(
            hooked, cache, ln="cached_scale_no_affine"
        ),
        "normalised without ln_final's learned weight and bias: use model.ln_final itself": _lens_oracle(
            hooked, cache, ln="no_affine"
        ),
        "skipped the final LayerNorm and the bias b_U": _lens_oracle(hooked, cache, ln="none", bias=False),
    }
    for label, variant in variants.items():
        if _close(got, variant, atol=1e-3):
            fail(f"{name} {label}.")
    for i in range(n + 1):
        if not _close(got[i], expected[i], atol=1e-3):
            fail(
                f"{name}'s readout {i} ({'the embeddings' if i == 0 else f'after block {i - 1}'}) differs: {mismatch_summary(got[i], expected[i], 1e-3, 1e-4)}."
            )


def _components(hooked, cache) -> Tensor:
    parts = [cache["hook_embed"], cache["hook_pos_embed"]]
    for layer, block in enumerate(hooked.blocks):
        z = cache[f"blocks.{layer}.attn.hook_z"]
        parts += list(torch.einsum("bphd,hdm->hbpm", z, block.attn.W_O))
        parts.append(block.attn.b_O.expand_as(cache["hook_embed"]))
        if not hooked.cfg.attn_only:
            parts.append(cache[f"blocks.{layer}.hook_mlp_out"])
    return torch.stack(parts)


def _attribution(hooked, components, cache, tokens, *, shift=1, center=True, scale="cached", weight=True) -> Tensor:
    targets = tokens[:, 1:] if shift == 1 else tokens[:, :-1]
    x = components[:, :, :-1]
    if center:
        x = x - x.mean(-1, keepdim=True)
    if scale == "cached":
        x = x / cache["ln_final.hook_scale"][:, :-1]
    elif scale == "own":
        x = x / (x.var(-1, keepdim=True, unbiased=False) + hooked.cfg.eps).sqrt()
    if weight:
        x = x * hooked.ln_final.w
    return torch.einsum("cbpm,bpm->cbp", x, hooked.W_U.T[targets])


def logit_attribution_test(logit_attribution) -> None:
    """Checks `logit_attribution(model, parts, cache, tokens) -> [component batch pos-1]`: against the formula,
    and that the parts plus ln_final's bias and b_U add up to the model's logit for each next token."""
    name = _name(logit_attribution, "logit_attribution")
    hooked = _hooked_gpt2()
    tokens = _tokens(13)
    logits, cache = _run_with_cache(hooked, tokens)
    components = _components(hooked, cache)
    given = components.clone()
    with torch.no_grad():
        got = as_tensor_output(
            call(
                logit_attribution,
                hooked,
                given,
                cache,
                tokens,
                what=f"{name}(model, components, cache, tokens)",
            ),
            name,
        )
    assert_unchanged(components, given, f"{name} (its components)")
    expected = _attribution(hooked, components, cache, tokens)
    if tuple(got.shape) != tuple(expected.shape):
        extra = ""
        if tuple(got.shape) == tuple(components.shape[:3]):
            extra = " It has a value at the last position too, which has no next token to score: drop it (pos - 1)."
        fail(
            f"{name} returned shape {list(got.shape)}, expected [component, batch, pos-1] = {list(expected.shape)}.{extra}"
        )
    if _close(got, expected, atol=1e-3):
        targets = tokens[:, 1:]
        constant = (hooked.ln_final.b @ hooked.W_U + hooked.b_U)[targets]
        total = got.sum(0) + constant
        actual = logits[:, :-1].gather(-1, targets[..., None])[..., 0]
        if not _close(total, actual, atol=1e-3):  # cannot happen when the formula matches; kept as the property itself
            fail(f"{name}'s parts do not add up to the logits: {mismatch_summary(total, actual, 1e-3, 1e-4)}.")
        print(f"{name} passed: the parts, plus ln_final.b and b_U, add up to each next token's logit.")
        return
    variants = {
        "scored the current token, not the next one: the logits at position p predict token p+1 (targets = tokens[:, 1:])": _attribution(
            hooked, components, cache, tokens, shift=0
        ),
        "did not centre the components: LayerNorm subtracts the mean of the whole stream, and the mean is linear, so subtract each component's own mean": _attribution(
            hooked, components, cache, tokens, center=False
        ),
        "normalised each component by its own standard deviation: LayerNorm divides the whole stream by one scale per position, the cached ln_final.hook_scale": _attribution(
            hooked, components, cache, tokens, scale="own"
        ),
        "did not divide by the final LayerNorm's scale (cache['ln_final.hook_scale'])": _attribution(
            hooked, components, cache, tokens, scale="none"
        ),
        "left out ln_final's weight w: the normalised stream is multiplied by it before the unembedding": _attribution(
            hooked, components, cache, tokens, weight=False
        ),
    }
    for label, variant in variants.items():
        if _close(got, variant, atol=1e-3):
            fail(f"{name} {label}.")
    fail(f"{name} differs from the direct logit attribution: {mismatch_summary(got, expected, 1e-3, 1e-4)}.")


# ---------------------------------------------------------------------------------------------------------------
# Activation patching


def _patched(
    hooked,
    corrupted: Tensor,
    clean_cache,
    metric,
    *,
    hook: str = "resid_pre",
    shift: int = 0,
    rows: slice = slice(None),
    fixed: int | None = None,
) -> Tensor:
    """[n_layers pos]: the metric on the corrupted run with one layer's `hook` at one position taken from the clean
    cache. `shift` moves the position written (an off-by-one); `rows` limits the batch rows patched; `fixed`
    patches that one position for every entry."""
    n_layers, n_pos = hooked.cfg.n_layers, corrupted.shape[1]
    out = torch.zeros(n_layers, n_pos)
    for layer in range(n_layers):
        name = f"blocks.{layer}.hook_{hook}"
        for pos in range(n_pos):
            where = (pos + shift) % n_pos if fixed is None else fixed

            def patch(act, hook, where=where, name=name):
                act[rows, where] = clean_cache[name][rows, where]
                return act

            with torch.no_grad():
                out[layer, pos] = float(metric(hooked.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])))
    return out


def patching_test(patch_resid_pre) -> None:
    """Checks `patch_resid_pre(model, corrupted_tokens, clean_cache, metric) -> [n_layers pos]` against
    TransformerLens's `patching.get_act_patch_resid_pre`, on a random model with two different metrics."""
    import contextlib
    import io

    from transformer_lens import patching

    name = _name(patch_resid_pre, "patch_resid_pre")
    hooked = _hooked_gpt2()
    clean, corrupted = _tokens(21, batch=3, pos=5), _tokens(22, batch=3, pos=5)
    clean[:, 0] = corrupted[:, 0]  # the same first token, as a BOS would be: position 0 still differs after it
    _, clean_cache = _run_with_cache(hooked, clean)
    params = {k: v.clone() for k, v in hooked.state_dict().items()}
    metrics = {  # the batch's mean logit difference of two tokens at the last position; then one position earlier
        "the logit difference of tokens 3 and 5 at the last position": lambda logits: (
            logits[:, -1, 3] - logits[:, -1, 5]
        ).mean(),
        "the log-probability of token 7 at position 2": lambda logits: logits[:, 2].log_softmax(-1)[:, 7].mean(),
    }
    for what, metric in metrics.items():
        call_text = f"{name}(model, corrupted_tokens, clean_cache, metric) with metric = {what}"
        given = corrupted.clone()
        with torch.no_grad():
            out = call(patch_resid_pre, hooked, given, clean_cache, metric, what=call_text)
        _no_hook_points_left(hooked, name, "every later run would still be patched")
        if not torch.equal(given, corrupted):
            fail(f"{name} modified `corrupted_tokens` in place.")
        changed = [k for k, v in hooked.state_dict().items() if not torch.equal(v, params[k])]
        if changed:
            hooked.load_state_dict(params)
            fail(f"{name} changed the model's weights ({changed[:3]}): patch activations through a hook.")
        got = as_tensor_output(out, name).detach().float()
        with contextlib.redirect_stderr(io.StringIO()), torch.no_grad():  # its progress bar
            expected = patching.get_act_patch_resid_pre(hooked, corrupted, clean_cache, metric).float()
        n_layers, n_pos = expected.shape
        if tuple(got.shape) == (n_pos, n_layers) and n_pos != n_layers:
            fail(f"{call_text} returned [pos, n_layers] = {list(got.shape)}: put the layer first, [n_layers, pos].")
        if tuple(got.shape) != (n_layers, n_pos):
            fail(f"{call_text} returned shape {list(got.shape)}, expected [n_layers, pos] = {[n_layers, n_pos]}.")
        if _close(got, expected, atol=1e-4):
            continue
        with torch.no_grad():
            corrupted_value = float(metric(hooked(corrupted)))
            clean_value = float(metric(hooked(clean)))
        if torch.allclose(got, torch.full_like(got, corrupted_value), atol=1e-4):
            fail(
                f"{name} with metric = {what}: every entry is the metric of the corrupted run ({corrupted_value:.4g}): "
                "no patch took effect. Does the hook write the clean activation into the tensor it returns, at "
                "'blocks.{layer}.hook_resid_pre'?"
            )
        if torch.allclose(got, torch.full_like(got, clean_value), atol=1e-4):
            fail(
                f"{name} with metric = {what}: every entry is the metric of the clean run ({clean_value:.4g}): each "
                "patch replaced every position at once, or the clean tokens were run. Patch one position per entry, "
                "on the corrupted tokens."
            )
        variants = {
            # patching resid_mid at (layer, pos) leaves the same stream after the block as patching resid_post there
            "patched the stream after block `layer` (hook_resid_post or hook_resid_mid): row `layer` is the stream "
            "entering block `layer`, hook_resid_pre": _patched(
                hooked, corrupted, clean_cache, metric, hook="resid_post"
            ),
            "patched position pos + 1 for entry pos: an off-by-one in the position": _patched(
                hooked, corrupted, clean_cache, metric, shift=1
            ),
            "patched position pos - 1 for entry pos: an off-by-one in the position": _patched(
                hooked, corrupted, clean_cache, metric, shift=-1
            ),
            "patched only the first sequence of the batch: patch every row (the batch is the first axis)": _patched(
                hooked, corrupted, clean_cache, metric, rows=slice(0, 1)
            ),
            "patched the last position for every entry: a hook defined in a loop reads the loop variable when it "
            "runs, after the loop has moved on; bind the position as a default argument (pos=pos)": _patched(
                hooked, corrupted, clean_cache, metric, fixed=corrupted.shape[1] - 1
            ),
        }
        for label, variant in variants.items():
            if _close(got, variant, atol=1e-4):
                fail(f"{name} with metric = {what}: {label}.")
        # What the output shows: does it follow the metric, and which layers' rows are right.
        other = next(m for w, m in metrics.items() if w != what)
        with torch.no_grad():
            again = call(patch_resid_pre, hooked, corrupted.clone(), clean_cache, other, what=call_text)
        hooked.reset_hooks(including_permanent=True)
        if isinstance(again, Tensor) and again.shape == got.shape and torch.allclose(again.float(), got, atol=1e-6):
            fail(
                f"{name}: its output did not change when the metric changed ({what}, then another): call `metric` "
                "on each patched run's logits and record what it returns."
            )
        right = [layer for layer in range(n_layers) if _close(got[layer], expected[layer], atol=1e-4)]
        wrong = [layer for layer in range(n_layers) if layer not in right]
        fail(
            f"{name} with metric = {what} differs from TransformerLens's get_act_patch_resid_pre in the rows of "
            f"layers {wrong}" + (f" (layers {right} are right)" if right else "") + ": "
            f"{mismatch_summary(got, expected, 1e-4, 1e-4)} (rows are layers, columns positions)."
        )
    print(
        f"{name} passed: matches TransformerLens's get_act_patch_resid_pre for two metrics, every layer and position."
    )


# ---------------------------------------------------------------------------------------------------------------
# Composition scores


def _composition(left: Tensor, right: Tensor) -> Tensor:
    """[i, j]: ||left[i] @ right[j]||_F / (||left[i]||_F ||right[j]||_F), for stacks of [d_model d_model] matrices."""
    product = torch.einsum("iab,jbc->ijac", left, right).flatten(-2).norm(dim=-1)
    return product / left.flatten(-2).norm(dim=-1)[:, None] / right.flatten(-2).norm(dim=-1)[None, :]


def _spectral_composition(left: Tensor, right: Tensor) -> Tensor:
    norm = torch.linalg.matrix_norm
    product = left[:, None] @ right[None]
    return norm(product, ord=2) / norm(left, ord=2)[:, None] / norm(right, ord=2)[None, :]


def composition_test(k_composition_scores) -> None:
    """Checks `k_composition_scores(model, earlier, later) -> [n_heads n_heads]` against TransformerLens's
    `all_composition_scores("K")`, on a random 3-layer model, for every pair of layers."""
    name = _name(k_composition_scores, "k_composition_scores")
    hooked = _hooked_gpt2()
    with torch.no_grad():
        reference = hooked.all_composition_scores("K")  # [n_layers n_heads n_layers n_heads]
        W_OV = hooked.W_V @ hooked.W_O  # [n_layers n_heads d_model d_model]
        W_QK = hooked.W_Q @ hooked.W_K.transpose(-1, -2)
    for earlier, later in ((0, 1), (0, 2), (1, 2)):
        call_text = f"{name}(model, earlier={earlier}, later={later})"
        with torch.no_grad():
            got = as_tensor_output(call(k_composition_scores, hooked, earlier, later, what=call_text), name)
        expected = reference[earlier, :, later, :]
        n = hooked.cfg.n_heads
        if tuple(got.shape) != (n, n):
            fail(f"{call_text} returned shape {list(got.shape)}, expected [n_heads, n_heads] = {[n, n]}.")
        got = got.detach().float()
        if _close(got, expected, atol=1e-5):
            continue
        variants = {
            "is Q-composition: the earlier head's output read by the later head's queries (W_OV @ W_QK). "
            "K-composition is about the keys: W_OV @ W_QK.T, with W_QK = W_Q @ W_K.T": _composition(
                W_OV[earlier], W_QK[later]
            ),
            "is V-composition: the earlier head's output read by the later head's values (W_OV @ W_OV of the "
            "later head). K-composition reads it through the keys: W_OV @ W_QK.T": _composition(
                W_OV[earlier], W_OV[later]
            ),
            "has rows and columns swapped: rows are the earlier layer's heads, columns the later layer's": expected.T,
            "is not normalised: divide ||W_OV @ W_QK.T||_F by ||W_OV||_F and ||W_QK||_F, so that it does not "
            "depend on the weights' scale": torch.einsum("iab,jbc->ijac", W_OV[earlier], W_QK[later].transpose(-1, -2))
            .flatten(-2)
            .norm(dim=-1),
            "uses W_OV transposed (W_O.T @ W_V.T): the head's output map is W_V @ W_O, applied as x @ W_V @ W_O "
            "(values first, then the output projection)": _composition(
                hooked.W_O[earlier].transpose(-1, -2) @ hooked.W_V[earlier].transpose(-1, -2),
                W_QK[later].transpose(-1, -2),
            ),
            "uses spectral norms (the largest singular value); the score divides Frobenius norms, "
            "`norm(dim=(-2, -1))`": _spectral_composition(W_OV[earlier], W_QK[later].transpose(-1, -2)),
            "takes the earlier head from layer `later` and the later head from layer `earlier`": _composition(
                W_OV[later], W_QK[earlier].transpose(-1, -2)
            ),
        }
        for label, variant in variants.items():
            if _close(got, variant.float(), atol=1e-5):
                fail(f"{call_text} {label}.")
        fail(
            f"{call_text} differs from TransformerLens's all_composition_scores('K')[earlier, :, later, :]: "
            f"{mismatch_summary(got, expected, 1e-5, 1e-4, names=('earlier head', 'later head'))}."
        )
    print(f"{name} passed: matches TransformerLens's K-composition scores for every pair of layers.")


def _silence(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TransformerLens's deprecation notice would reach stderr
            return fn(*args, **kwargs)

    return wrapper


for _check in __all__:
    globals()[_check] = _silence(globals()[_check])
del _check
