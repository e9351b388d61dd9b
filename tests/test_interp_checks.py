"""Notebook 08's checks: the course's solutions pass, and each realistic wrong version fails with a message that
names its mistake."""

from __future__ import annotations

import math

import einops
import pytest
import torch

import harness
from harness.course import components

course = components("08_interpretability")


# ---------------------------------------------------------------------------------------------------------------
# The solutions pass


@pytest.mark.parametrize(
    ("check", "solution"),
    [
        ("cache_activations_test", "cache_activations"),
        ("head_detector_test", "head_detector_scores"),
        ("induction_score_test", "induction_scores"),
        ("repeated_segments_test", "repeated_segments"),
        ("mean_ablation_test", "mean_ablate_heads"),
        ("logit_lens_test", "logit_lens"),
        ("logit_attribution_test", "logit_attribution"),
    ],
)
def test_solution_passes(check, solution, capsys):
    assert getattr(harness, check)(getattr(course, solution)) is None
    assert "passed" in capsys.readouterr().out


def _fails(check, fn, *phrases):
    with pytest.raises(AssertionError) as info:
        check(fn)
    message = str(info.value)
    for phrase in phrases:
        assert phrase in message, message


# ---------------------------------------------------------------------------------------------------------------
# cache_activations


def _make_cache_activations(pattern="right", layer_names="right", leave_hooks=False, detach=True, skip_mlp_check=False):
    """The solution's structure, with one mistake switched on."""

    def cache_activations(model, tokens):
        cache, handles = {}, []

        def store(name, value):
            cache[name] = value.detach() if detach else value

        def save_output(name):
            return lambda module, inputs, output: store(name, output)

        def save_input(name):
            return lambda module, inputs: store(name, inputs[0])

        def save_pattern(name):
            def hook(attn, inputs):
                x = inputs[0]
                q = einops.einsum(x, attn.W_Q, "b p m, n m h -> b n p h") + attn.b_Q[:, None]
                k = einops.einsum(x, attn.W_K, "b p m, n m h -> b n p h") + attn.b_K[:, None]
                scores = q @ k.transpose(-1, -2)
                if pattern != "unscaled":
                    scores = scores / math.sqrt(attn.cfg.d_head)
                if pattern != "unmasked":
                    scores = attn.apply_causal_mask(scores)
                result = scores if pattern == "scores" else scores.softmax(-1)
                store(name, result.transpose(-1, -2) if pattern == "transposed" else result)

            return hook

        handles.append(model.embed.register_forward_hook(save_output("hook_embed")))
        handles.append(model.pos_embed.register_forward_hook(save_output("hook_pos_embed")))
        for i, block in enumerate(model.blocks, start=1 if layer_names == "from_one" else 0):
            if layer_names == "late_binding":
                handles.append(
                    block.register_forward_pre_hook(lambda m, inp: store(f"blocks.{i}.hook_resid_pre", inp[0]))  # noqa: B023
                )
                handles.append(
                    block.register_forward_hook(lambda m, inp, out: store(f"blocks.{i}.hook_resid_post", out))  # noqa: B023
                )
            else:
                pre, post = "hook_resid_pre", "hook_resid_post"
                if layer_names == "pre_post_swapped":
                    pre, post = post, pre
                handles.append(block.register_forward_pre_hook(save_input(f"blocks.{i}.{pre}")))
                handles.append(block.register_forward_hook(save_output(f"blocks.{i}.{post}")))
            handles.append(block.attn.register_forward_pre_hook(save_pattern(f"blocks.{i}.attn.hook_pattern")))
            handles.append(block.attn.register_forward_hook(save_output(f"blocks.{i}.hook_attn_out")))
            if skip_mlp_check or hasattr(block, "mlp"):
                handles.append(block.ln2.register_forward_pre_hook(save_input(f"blocks.{i}.hook_resid_mid")))
                handles.append(block.mlp.register_forward_hook(save_output(f"blocks.{i}.hook_mlp_out")))
        model(tokens)
        if not leave_hooks:
            for handle in handles:
                handle.remove()
        return cache

    return cache_activations


@pytest.mark.parametrize(
    ("mistake", "phrases"),
    [
        ({"pattern": "scores"}, ["before the softmax"]),
        ({"pattern": "unmasked"}, ["no causal mask"]),
        ({"pattern": "unscaled"}, ["not divided by sqrt(d_head)"]),
        ({"pattern": "transposed"}, ["query and key swapped"]),
        ({"layer_names": "from_one"}, ["numbered the layers from 1"]),
        ({"layer_names": "late_binding"}, ["last layer's names", "factory"]),
        ({"layer_names": "pre_post_swapped"}, ["saves its input where the output is due"]),
        ({"leave_hooks": True}, ["left hooks registered", "handle.remove()"]),
        ({"detach": False}, ["require grad", "detach"]),
        ({"skip_mlp_check": True}, ["no `ln2` or `mlp`"]),
    ],
)
def test_cache_activations_mistakes(mistake, phrases):
    _fails(harness.cache_activations_test, _make_cache_activations(**mistake), *phrases)


def test_cache_activations_wrong_return():
    _fails(harness.cache_activations_test, lambda model, tokens: [model(tokens)], "expected a dict")


# ---------------------------------------------------------------------------------------------------------------
# Head detectors and the induction score


def _detector(mistake):
    def head_detector_scores(pattern):
        start = 0 if mistake == "query_0" else 1
        previous = pattern.diagonal(offset=1 if mistake == "above" else -1, dim1=-2, dim2=-1)
        current = pattern.diagonal(dim1=-2, dim2=-1)[..., start:]
        first = pattern[..., start:, 0] if mistake != "transposed" else pattern[..., 0, start:]
        reduce = {
            "sum": lambda x: x.sum((0, -1)),
            "keep_batch": lambda x: x.mean(-1),
        }.get(mistake, lambda x: x.mean((0, -1)))
        return {"previous": reduce(previous), "current": reduce(current), "first": reduce(first)}

    return head_detector_scores


@pytest.mark.parametrize(
    ("mistake", "phrases"),
    [
        ("query_0", ["included query 0"]),
        ("above", ["diagonal above"]),
        ("transposed", ["key axis for the query axis"]),
        ("sum", ["summed where the mean is due"]),
        ("keep_batch", ["batch dimension"]),
    ],
)
def test_head_detector_mistakes(mistake, phrases):
    _fails(harness.head_detector_test, _detector(mistake), *phrases)


def test_head_detector_wrong_keys():
    _fails(harness.head_detector_test, lambda p: {"prev": p.mean((0, 2, 3))}, "expected exactly")


def _induction(mistake):
    def induction_scores(pattern, seq_len):
        if mistake == "hard_coded":  # the 7 of the check's first call, in place of the argument
            seq_len = 7
        offset = seq_len if mistake == "duplicate" else seq_len - 1
        stripe = pattern.diagonal(offset=-offset, dim1=-2, dim2=-1)
        if mistake == "whole_stripe":
            return stripe.mean((0, -1))
        if mistake == "rows":
            return pattern[..., -seq_len:, :].mean((0, -2, -1))
        if mistake == "keep_batch":
            return stripe[..., -seq_len:].mean(-1)
        return stripe[..., -seq_len:].mean((0, -1))

    return induction_scores


@pytest.mark.parametrize(
    ("mistake", "phrases"),
    [
        ("duplicate", ["duplicate-token heads", "seq_len - 1"]),
        ("whole_stripe", ["first copy too"]),
        ("rows", ["whole rows"]),
        ("keep_batch", ["batch dimension"]),
        ("hard_coded", ["must follow the seq_len argument"]),
    ],
)
def test_induction_score_mistakes(mistake, phrases):
    _fails(harness.induction_score_test, _induction(mistake), *phrases)


# ---------------------------------------------------------------------------------------------------------------
# Repeated segments


def _segments(mistake):
    def repeated_segments(batch, n_ctx, d_vocab, min_period, max_period, generator=None):
        g = None if mistake == "no_generator" else generator
        high = max_period if mistake == "exclusive" else max_period + 1
        periods = torch.randint(min_period, high, (batch,), generator=g)
        if mistake == "fixed":
            periods = torch.full((batch,), max_period)
        if mistake == "hard_coded_periods":  # the first example's 3..9, written in place of the arguments
            periods = torch.randint(3, 10, (batch,), generator=g).clamp(max=max_period)
        low = {"bos_inside": 0, "skips_one": 2}.get(mistake, 1)
        segments = torch.randint(low, d_vocab, (batch, max_period), generator=g)
        if mistake == "rounded":  # each range's two ends half as likely (red-team round 22: full marks in the judge)
            segments = (1 + torch.rand(batch, max_period, generator=g) * (d_vocab - 2)).round().long()
            periods = (min_period + torch.rand(batch, generator=g) * (max_period - min_period)).round().long()
        if mistake == "one_segment":
            segments = segments[:1].expand(batch, -1)
        length = n_ctx if mistake == "no_bos" else n_ctx - 1
        body = segments.gather(1, torch.arange(length)[None] % periods[:, None])
        if mistake == "no_bos":
            return body, periods
        tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.long), body], dim=1)
        return tokens if mistake == "tokens_only" else (tokens, periods)

    return repeated_segments


@pytest.mark.parametrize(
    ("mistake", "phrases"),
    [
        ("fixed", ["same period", "fixed distance back"]),
        ("no_bos", ["do not start with BOS"]),
        ("exclusive", ["never drew period", "exclusive"]),
        ("bos_inside", ["1..d_vocab-1"]),
        ("one_segment", ["same segment in every row"]),
        ("skips_one", ["never used token [1]"]),
        ("hard_coded_periods", ["never drew period 2"]),
        ("no_generator", ["same generator seed"]),
        ("tokens_only", ["pair (tokens, periods)"]),
        ("rounded", ["must be equally likely", "half as often"]),
    ],
)
def test_repeated_segments_mistakes(mistake, phrases):
    _fails(harness.repeated_segments_test, _segments(mistake), *phrases)


def test_repeated_segments_not_periodic():
    def shuffled(batch, n_ctx, d_vocab, min_period, max_period, generator=None):
        periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)
        body = torch.randint(1, d_vocab, (batch, n_ctx - 1), generator=generator)  # no repetition at all
        return torch.cat([torch.zeros(batch, 1, dtype=torch.long), body], 1), periods

    _fails(harness.repeated_segments_test, shuffled, "is not its first")


# ---------------------------------------------------------------------------------------------------------------
# Mean ablation


def _ablate(mistake):
    def mean_ablate_heads(model, tokens, layer, heads):
        if mistake == "weights":
            with torch.no_grad():
                model.blocks[layer].attn.W_O[heads] = 0.0
            return model(tokens)

        def fn(z, hook):
            if mistake == "zero":
                z[:, :, heads] = 0.0
            elif mistake == "position":
                z[:, heads] = z[:, heads].mean(0, keepdim=True)
            elif mistake == "all_positions":
                z[:, :, heads] = z[:, :, heads].mean((0, 1), keepdim=True)
            elif mistake == "first_head":
                z[:, :, heads[0]] = z[:, :, heads[0]].mean(0, keepdim=True)
            else:
                z[:, :, heads] = z[:, :, heads].mean(0, keepdim=True)
            return z

        if mistake == "pattern":
            name = f"blocks.{layer}.attn.hook_pattern"

            def fn(pattern, hook):
                pattern[:, heads] = pattern[:, heads].mean(0, keepdim=True)
                return pattern
        else:
            name = f"blocks.{layer}.attn.hook_z"
        if mistake == "add_hook":
            model.add_hook(name, fn)
            return model(tokens)
        return model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])

    return mean_ablate_heads


@pytest.mark.parametrize(
    ("mistake", "phrases"),
    [
        ("zero", ["zero ablation"]),
        ("position", ["indexed positions, not heads"]),
        ("all_positions", ["positions as well"]),
        ("first_head", ["only the first head"]),
        ("pattern", ["attention pattern, not z"]),
        ("add_hook", ["left", "reset_hooks"]),
        ("weights", ["changed the model's weights"]),
    ],
)
def test_mean_ablation_mistakes(mistake, phrases):
    _fails(harness.mean_ablation_test, _ablate(mistake), *phrases)
    harness.mean_ablation_test(course.mean_ablate_heads)  # the shared test model was restored


# ---------------------------------------------------------------------------------------------------------------
# Logit lens and attribution


def _lens(mistake):
    def logit_lens(model, cache):
        n = model.cfg.n_layers
        if mistake == "final_scale":
            stack = cache.accumulated_resid()
            return model.unembed((stack - stack.mean(-1, keepdim=True)) / cache["ln_final.hook_scale"])
        residuals = [cache[f"blocks.{i}.hook_resid_pre"] for i in range(n)]
        if mistake != "no_final":
            residuals.append(cache[f"blocks.{n - 1}.hook_resid_post"])
        out = []
        for resid in residuals:
            x = resid if mistake == "no_ln" else model.ln_final(resid)
            out.append(x @ model.W_U if mistake == "no_bias" else model.unembed(x))
        return torch.stack(out)

    return logit_lens


@pytest.mark.parametrize(
    ("mistake", "phrases"),
    [
        ("no_ln", ["skipped the final LayerNorm"]),
        ("no_bias", ["unembedding bias b_U"]),
        ("final_scale", ["last layer's cached scale", "neither ln_final.w nor ln_final.b"]),
        ("no_final", ["before each block but not after the last", "n_layers + 1"]),
    ],
)
def test_logit_lens_mistakes(mistake, phrases):
    _fails(harness.logit_lens_test, _lens(mistake), *phrases)


def test_logit_lens_oracle_is_transformer_lens():
    from harness.interp_checks import _hooked_gpt2, _lens_oracle, _run_with_cache, _tokens

    hooked = _hooked_gpt2()
    _, cache = _run_with_cache(hooked, _tokens(11))
    with torch.no_grad():
        assert torch.allclose(
            _lens_oracle(hooked, cache), hooked.unembed(cache.accumulated_resid(apply_ln=True)), atol=1e-5
        )
    harness.logit_lens_test(lambda model, cache: model.unembed(cache.accumulated_resid(apply_ln=True)))


def _attribution(mistake):
    def logit_attribution(model, components, cache, tokens):
        targets = tokens[:, :-1] if mistake == "not_shifted" else tokens[:, 1:]
        x = components if mistake == "keep_last" else components[:, :, :-1]
        if mistake != "not_centred":
            x = x - x.mean(-1, keepdim=True)
        if mistake == "own_scale":
            x = x / (x.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()
        else:
            scale = cache["ln_final.hook_scale"]
            x = x / (scale if mistake == "keep_last" else scale[:, :-1])
        if mistake != "no_weight":
            x = x * model.ln_final.w
        if mistake == "keep_last":
            return einops.einsum(x[:, :, :-1], model.W_U.T[targets], "c b p m, b p m -> c b p")
        return einops.einsum(x, model.W_U.T[targets], "c b p m, b p m -> c b p")

    return logit_attribution


def test_attribution_keeping_the_last_position():
    def keeps_last(model, components, cache, tokens):
        x = components - components.mean(-1, keepdim=True)
        x = x / cache["ln_final.hook_scale"] * model.ln_final.w
        return einops.einsum(x, model.W_U.T[tokens], "c b p m, b p m -> c b p")

    _fails(harness.logit_attribution_test, keeps_last, "last position")


@pytest.mark.parametrize(
    ("mistake", "phrases"),
    [
        ("not_shifted", ["current token, not the next one"]),
        ("not_centred", ["did not centre"]),
        ("own_scale", ["its own standard deviation"]),
        ("no_weight", ["ln_final's weight w"]),
    ],
)
def test_logit_attribution_mistakes(mistake, phrases):
    _fails(harness.logit_attribution_test, _attribution(mistake), *phrases)


# ---------------------------------------------------------------------------------------------------------------
# The helpers the notebook uses


def test_show_attention_is_offline_and_inlined():
    pattern = torch.softmax(torch.randn(2, 4, 4).masked_fill(torch.ones(4, 4).triu(1).bool(), -1e9), -1)
    html = harness.show_attention(pattern, ["a", "b", "c", "d"])._repr_html_()
    assert "unpkg.com" not in html and "CircuitsVis.render" in html and len(html) > 500_000
    with pytest.raises(ValueError, match="query = key = len"):
        harness.show_attention(pattern, ["a", "b"])


def test_to_hooked_transformer_matches_the_course_model():
    model = course.AttnOnlyTransformer(course.INDUCTION_CONFIG).eval()
    tokens, _ = course.repeated_segments(2, 20, 64, 3, 5, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(harness.to_hooked_transformer(model)(tokens), model(tokens), atol=1e-5)


def test_shipped_induction_model_shows_the_circuit():
    """The shipped checkpoint matches the notebook's class and config, and holds the circuit the notebook describes:
    one previous-token head in layer 0 whose ablation undoes copying, induction heads in layer 1."""
    config, state_dict, metrics = harness.load_induction_model()
    assert harness.Config(**config) == course.INDUCTION_CONFIG
    model = course.AttnOnlyTransformer(course.INDUCTION_CONFIG).eval()
    model.load_state_dict(state_dict, strict=True)
    args = course.InductionArgs()
    probe = course.induction_probe(model, args)
    assert probe["repeated_loss"] < 0.5 and probe["induction_score"] > 0.5, probe
    history = metrics["history"]
    assert history["induction_score"][0] < 0.2 and history["repeated_loss"][0] > 3.5  # it starts without the circuit
    assert metrics["final"]["repeated_loss"] == pytest.approx(probe["repeated_loss"], abs=1e-3)
    seq_len = args.eval_seq_len
    tokens = course.repeated_tokens(64, seq_len, 64, bos=0, generator=torch.Generator().manual_seed(4321))
    with torch.no_grad():
        cache = course.cache_activations(model, tokens)
        prev = course.head_detector_scores(cache["blocks.0.attn.hook_pattern"])["previous"]
        hooked = harness.to_hooked_transformer(model)
        ablated = course.per_token_loss(course.mean_ablate_heads(hooked, tokens, 0, [int(prev.argmax())]), tokens)
    assert ablated[:, seq_len:].mean() > 3.0  # removing the previous-token head undoes copying


def test_train_induction_fast(tmp_path):
    from harness import train_induction

    train_induction.main(["--fast", "--out", str(tmp_path)])
    _, state_dict, metrics = harness.load_induction_model(tmp_path)
    assert metrics["history"]["step"] == [0, 10, 20, 30, 40]
    assert set(state_dict) == set(course.AttnOnlyTransformer(course.INDUCTION_CONFIG).state_dict())


def test_segments_drawn_without_replacement_fail_their_check():
    """Every token of a segment uniform on its own, none repeated in a segment (mutation sweep 10)."""
    from test_judge import WITHOUT_REPLACEMENT, course_with

    notebook, _, old, new, cause = WITHOUT_REPLACEMENT
    with pytest.raises(AssertionError, match="|".join(cause)):
        harness.repeated_segments_test(course_with(notebook, old, new)["repeated_segments"])
    harness.repeated_segments_test(course_with(notebook, None, None)["repeated_segments"])
