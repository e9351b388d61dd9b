"""Checks for notebook 07's batches of prompts of different lengths: left padding, a model that takes an attention
mask, and greedy generation for such a batch.

The oracle is the definition of padding done right: every row of the batch gives what the prompt gives alone, with
no padding at all, through the course's own `DemoTransformer` (notebook 05) on the same random weights. Where a
learner's output is wrong, the check recomputes the usual mistakes on the same weights (pads attended, positions
counted from the padded start, a new token's position taken from the padded length, right padding) and names one
only when it reproduces the learner's numbers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness._assertions import call, defaults_as_given, fail, mismatch_summary
from harness.config import Config
from harness.kv_cache_checks import _learner_model, _step
from harness.sampling_checks import _first_difference

__all__ = ["left_pad_test", "padded_generate_test", "padded_transformer_test"]

_CFG = Config(d_model=32, n_heads=4, d_head=8, d_mlp=64, n_layers=2, n_ctx=16, d_vocab=61)
_CFG_OTHER = Config(d_model=24, n_heads=2, d_head=12, d_mlp=40, n_layers=2, n_ctx=12, d_vocab=37)  # no size hard-coded


def _course_model(cfg: Config, seed: int):
    """Notebook 05's DemoTransformer with random weights scaled by their input size: its greedy continuations vary
    from prompt to prompt and token to token (weights of one scale make a small random model repeat one token)."""
    from harness.course import components

    model = components("05_full_gpt2").DemoTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            values, last = torch.randn(param.shape, generator=gen), name.rsplit(".", 1)[-1]
            if param.dim() >= 2 and last not in ("W_E", "W_pos"):
                values /= param.shape[-2] ** 0.5
            elif param.dim() == 1:
                values = 0.2 * values if last.startswith("b") else 1 + 0.2 * values
            param.copy_(values)
    return model


def _left_padded(prompts: list[list[int]], pad: int, right: bool = False) -> tuple[Tensor, Tensor]:
    longest = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        where = slice(0, len(prompt)) if right else slice(longest - len(prompt), longest)
        tokens[row, where], mask[row, where] = torch.tensor(prompt, dtype=torch.long), True
    return tokens, mask


def left_pad_test(left_pad) -> None:
    """Checks `left_pad(prompts: list[list[int]], pad_token_id) -> (tokens [batch pos], attention_mask [batch pos])`."""
    name = getattr(left_pad, "__name__", "left_pad")
    cases = (
        ([[5, 6, 7], [8], [9, 10]], 0),
        ([[11, 12], [13, 14, 15, 16, 17], [18, 19, 20, 21]], 50256),
        ([[3, 4], [5, 6]], 7),  # nothing to pad
        ([[42]], 1),
        # GPT-2's prompts begin with <|endoftext|>, which is also the usual pad: a real token may equal the pad id
        ([[50256, 11, 12], [50256, 13], [50256, 14, 50256, 15]], 50256),
    )
    for prompts, pad in cases:
        what = f"{name}({prompts}, pad_token_id={pad})"
        given = [list(p) for p in prompts]
        out = call(left_pad, given, pad, what=what)
        if given != [list(p) for p in prompts]:
            fail(f"{what} changed the prompts it was given (now {given}): build the batch in new tensors.")
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, Tensor) for t in out)):
            fail(f"{what} returned {type(out).__name__}: return a pair of tensors (tokens, attention_mask).")
        tokens, mask = out
        want_tokens, want_mask = _left_padded(prompts, pad)
        if tuple(tokens.shape) != tuple(want_tokens.shape) or tuple(mask.shape) != tuple(want_tokens.shape):
            fail(
                f"{what} returned tokens of shape {list(tokens.shape)} and a mask of shape {list(mask.shape)}; "
                f"expected both {list(want_tokens.shape)}: one row per prompt, as long as the longest prompt."
            )
        if mask.dtype != torch.bool:
            fail(f"{what} returned a mask of dtype {mask.dtype}: make it torch.bool (True at real tokens).")
        if tokens.dtype != torch.long:
            fail(f"{what} returned tokens of dtype {tokens.dtype}: token ids are torch.long.")
        if torch.equal(tokens, want_tokens) and torch.equal(mask, want_mask):
            continue
        right_tokens, right_mask = _left_padded(prompts, pad, right=True)
        if torch.equal(tokens, right_tokens):
            fail(
                f"{what} padded on the right: {tokens.tolist()}. Pad on the LEFT, so that every row's last "
                "position holds its last real token and the next token is predicted from there in every row."
            )
        if torch.equal(tokens, want_tokens) and torch.equal(mask, ~want_mask):
            fail(f"{what}: the mask is True at the padding. It marks the tokens to attend to: True at real tokens.")
        if torch.equal(tokens, want_tokens) and torch.equal(mask, tokens != pad):
            fail(
                f"{what}: the mask is False at every token equal to pad_token_id, not set by each prompt's length. "
                "These prompts hold that id as a real token, as GPT-2's begin with <|endoftext|>, which is also the "
                "usual pad: mark each row's last len(prompt) positions."
            )
        if torch.equal(tokens, want_tokens) and torch.equal(mask, right_mask):
            fail(f"{what}: the tokens are padded on the left but the mask marks the first positions of each row.")
        if torch.equal(tokens, want_tokens):
            fail(f"{what}: the tokens are right; the mask is {mask.tolist()}, expected {want_mask.tolist()}.")
        if torch.equal(tokens[want_mask], want_tokens[want_mask]):
            found = sorted(set(tokens[~want_mask].tolist()))
            fail(f"{what}: the padding holds {found}, not pad_token_id = {pad}.")
        fail(f"{what} returned tokens {tokens.tolist()}, expected {want_tokens.tolist()}.")
    print(f"{name} passed: prompts of different lengths padded on the left, the mask True at real tokens.")


def _manual_forward(course, tokens: Tensor, key_mask: Tensor, positions: Tensor) -> Tensor:
    """The course model's logits for every position, attending to the keys `key_mask` allows (and the causal mask),
    with the positional embedding of `positions`; the fill is the course's -1e5, so a query with no key is finite."""
    cfg = course.cfg
    residual = course.embed(tokens) + course.pos_embed.W_pos[positions]
    pos = tokens.shape[1]
    hidden = torch.ones(pos, pos, dtype=torch.bool).triu(1) | ~key_mask[:, None, None, :]  # [batch 1 q k]
    for block in course.blocks:
        attn, x = block.attn, block.ln1(residual)
        q = torch.einsum("bpm,nmh->bnph", x, attn.W_Q) + attn.b_Q[None, :, None]
        k = torch.einsum("bpm,nmh->bnph", x, attn.W_K) + attn.b_K[None, :, None]
        v = torch.einsum("bpm,nmh->bnph", x, attn.W_V) + attn.b_V[None, :, None]
        pattern = (q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head)).masked_fill(hidden, -1e5).softmax(-1)
        residual = residual + torch.einsum("bnph,nhm->bpm", pattern @ v, attn.W_O) + attn.b_O
        residual = residual + block.mlp(block.ln2(residual))
    return course.unembed(course.ln_final(residual))


def _mask_positions(mask: Tensor) -> Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _name_prompt_mistake(got: Tensor, course, tokens: Tensor, mask: Tensor, what: str) -> None:
    """The learner's prompt logits (real positions right or wrong) against the usual mistakes; fails with one."""
    ones, arange = torch.ones_like(mask), torch.arange(tokens.shape[1]).expand_as(tokens)
    variants = (
        (
            ones,
            _mask_positions(mask),
            (
                "the padding is attended to: a real token's query must not see the pads' keys. Hide every key whose "
                "mask is False, besides the future ones"
            ),
        ),
        (
            mask,
            arange,
            (
                "the positions are counted from the padded start: a row's first real token must get position 0, as it "
                "would alone. Take each token's position from the mask (the number of real tokens before it)"
            ),
        ),
        (ones, arange, "the mask is not used at all: the pads are attended to and counted as positions"),
        (~mask, _mask_positions(mask), "the mask is used the wrong way round: True marks the real tokens"),
    )
    for key_mask, positions, cause in variants:
        with torch.no_grad():
            wrong = _manual_forward(course, tokens, key_mask, positions)
        if torch.allclose(got[mask], wrong[mask], atol=1e-4, rtol=1e-4):
            fail(f"{what}: {cause}.")


def padded_transformer_test(PaddedTransformer) -> None:
    """Checks `PaddedTransformer(cfg)`, whose forward is `(tokens [batch new], attention_mask [batch offset+new],
    past_kvs=None) -> (logits [batch new d_vocab], past_kvs)`: each row gives what its prompt gives alone."""
    name = getattr(PaddedTransformer, "__name__", "PaddedTransformer")
    for cfg in (_CFG, _CFG_OTHER):
        label = name if cfg is _CFG else f"{name} (d_head={cfg.d_head}, n_ctx={cfg.n_ctx})"
        _padded_transformer_case(PaddedTransformer, cfg, label)
    print(
        f"{name} passed: each row of a left-padded batch gives its prompt's logits alone, with and without the cache; "
        "a context filled to n_ctx works and one token more is refused; for two configurations."
    )


def _padded_transformer_case(PaddedTransformer, cfg: Config, name: str) -> None:
    course = _course_model(cfg, seed=5)
    model = _learner_model(PaddedTransformer, course, cfg)
    gen = torch.Generator().manual_seed(6)
    lengths = (6, 2, 4)
    prompts = [torch.randint(0, cfg.d_vocab, (n,), generator=gen).tolist() for n in lengths]
    new = torch.randint(0, cfg.d_vocab, (len(lengths), 3), generator=gen)
    # The pad is an ordinary id: attending to it, or counting it as a position, changes the logits.
    tokens, mask = _left_padded(prompts, pad=int(new[0, 0]))
    alone = []
    with torch.no_grad():
        for row, prompt in enumerate(prompts):
            alone.append(course(torch.tensor([prompt + new[row].tolist()]))[0])  # [len+3 d_vocab]
        what = f"{name}(tokens [3, 6] padded on the left, attention_mask)"
        logits, kvs = _step_with_mask(model, tokens, mask, None, what)
        if tuple(logits.shape) != (3, tokens.shape[1], cfg.d_vocab):
            fail(f"{what} returned logits of shape {list(logits.shape)}: one row per position, [3, 6, d_vocab].")
        expected = torch.zeros_like(logits)
        for row, n in enumerate(lengths):
            expected[row, tokens.shape[1] - n :] = alone[row][:n]
        if not torch.isfinite(logits[mask]).all():
            fail(
                f"{what}: the logits at real tokens are not finite. A pad's query (left padding puts them first) "
                "has no key it may see; with -inf everywhere its softmax is NaN, and that NaN reaches every real "
                "token through the values. Fill with a large negative number (self.IGNORE), not -inf."
            )
        summary = mismatch_summary(logits[mask], expected[mask], 1e-4, 1e-4)
        if summary is not None:
            _name_prompt_mistake(logits, course, tokens, mask, what)
            fail(f"{what}: at the real tokens, the logits differ from each prompt run alone: {summary}.")
        full_mask = mask
        for step in range(new.shape[1]):
            full_mask = torch.cat([full_mask, torch.ones_like(mask[:, :1])], dim=1)
            what = f"{name}(one new token per row, attention_mask [3, {full_mask.shape[1]}], past_kvs)"
            logits, kvs = _step_with_mask(model, new[:, step : step + 1], full_mask, kvs, what)
            if tuple(logits.shape) != (3, 1, cfg.d_vocab):
                fail(f"{what} returned logits of shape {list(logits.shape)}: [3, 1, d_vocab].")
            want = torch.stack([alone[row][n + step] for row, n in enumerate(lengths)])[:, None]
            if mismatch_summary(logits, want, 1e-4, 1e-4) is None:
                continue
            all_tokens = torch.cat([tokens, new[:, : step + 1]], dim=1)
            counted = torch.cat([_mask_positions(mask), torch.arange(6, 7 + step).expand(3, -1)], dim=1)
            wrong = _manual_forward(course, all_tokens, full_mask, counted)[:, -1:]
            if torch.allclose(logits, wrong, atol=1e-4, rtol=1e-4):
                fail(
                    f"{what}: the new token's position was taken from the padded length ({6 + step}): it is the "
                    "number of real tokens before it in its row, which differs from row to row."
                )
            fail(
                f"{what}: the prompt was right but the new token's logits differ from its prompt run alone: "
                f"{mismatch_summary(logits, want, 1e-4, 1e-4)}."
            )
        # The context's edge: the cache plus new tokens may fill n_ctx exactly (the last step is one token, fewer
        # than the rows: a limit taken on the batch size shows); one token more must be refused.
        cached = tokens.shape[1] + new.shape[1]
        rest = torch.randint(0, cfg.d_vocab, (3, cfg.n_ctx - cached), generator=gen)
        for chunk in (rest[:, :-1], rest[:, -1:]):
            full_mask = torch.cat([full_mask, torch.ones_like(chunk, dtype=torch.bool)], dim=1)
            filled = full_mask.shape[1]
            what = f"{name}({chunk.shape[1]} new tokens, {filled - chunk.shape[1]} cached, n_ctx = {cfg.n_ctx})"
            try:
                _, kvs = _step_with_mask(model, chunk, full_mask, kvs, what)
            except AssertionError as err:
                fail(f"{what} failed ({str(err).splitlines()[0]}), but a context filled up to n_ctx is allowed.")
        full_mask = torch.cat([full_mask, torch.ones_like(mask[:, :1])], dim=1)
        what = f"{name}(one token after {cfg.n_ctx} cached, n_ctx = {cfg.n_ctx})"
        try:
            _step_with_mask(model, rest[:, :1], full_mask, kvs, what)
        except AssertionError as err:
            cause = err.__cause__
            if not (isinstance(cause, ValueError) and "n_ctx" in str(cause)):
                fail(f"{what} failed without a ValueError naming n_ctx ({str(err).splitlines()[0]}): raise one.")
        else:
            fail(
                f"{what} returned logits: past n_ctx there is no positional embedding. Raise a ValueError naming n_ctx."
            )


def _step_with_mask(model, tokens: Tensor, mask: Tensor, past, what: str):
    return _step(lambda t, p: model(t, mask.clone(), p), tokens, past, what)


def _alone(course, prompt: list[int], max_new: int, eos: int) -> list[int]:
    """Greedy decoding of one prompt, no padding, no cache: the tokens it adds (up to and with eos)."""
    tokens, out = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(max_new):
            token = int(course(tokens)[0, -1].argmax())
            out.append(token)
            if token == eos:
                break
            tokens = torch.cat([tokens, torch.tensor([[token]])], dim=1)
    return out


PAD_IN_PROMPTS = "prompts that begin with the padding id itself"
EOS_IN_PROMPTS = "prompts that hold the end-of-text id"


def padded_generate_test(padded_generate, PaddedTransformer) -> None:
    """Checks `padded_generate(model, prompts: list[list[int]], max_new_tokens, eos_token_id, pad_token_id)`:
    greedy, cached, left-padded with pad_token_id, finished rows padded with it, stopping when every row has
    finished."""
    name = getattr(padded_generate, "__name__", "padded_generate")
    defaults_as_given(padded_generate, "07_sampling_and_kv_cache", "padded_generate", name)
    cfg = _CFG
    course = _course_model(cfg, seed=7)
    model = _learner_model(PaddedTransformer, course, cfg)
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, cfg.d_vocab, (n,), generator=gen).tolist() for n in (2, 5, 3)]
    plain = [_alone(course, p, 6, eos=-1) for p in prompts]
    # ids no row emits and no prompt holds: until the last case, a padding id is never a real token
    unused = sorted(set(range(cfg.d_vocab)) - {t for row in plain + prompts for t in row})
    never, other = unused[:2]  # `other`: a padding id that is not the end-of-text id

    def first(row: list[int], token: int) -> int:
        return row.index(token) if token in row else len(row)

    # An id the first row emits first at step s >= 1 while another row emits it later or never: rows finish at
    # different steps. Then one that the second prompt, alone, emits first at its third step or later.
    early = next(
        t for s, t in enumerate(plain[0]) if s >= 1 and first(plain[0], t) == s and max(first(r, t) for r in plain) > s
    )
    late = next(t for s, t in enumerate(plain[1]) if s >= 2 and first(plain[1], t) == s)
    fits = cfg.n_ctx + 1 - max(len(p) for p in prompts)  # the last new token is never fed back: n_ctx + 1 fit
    cases = (
        (prompts, 6, never, never, "an end-of-text id no row emits, padding with it"),
        (prompts, fits, cfg.d_vocab, other, f"{fits} new tokens: the padded prompt plus them is n_ctx + 1"),
        (
            prompts,
            6,
            early,
            other,
            f"rows that emit the end-of-text id as new token {[first(r, early) + 1 for r in plain]}",
        ),
        (
            [prompts[1]],
            6,
            late,
            other,
            f"one prompt that emits the end-of-text id as new token {first(plain[1], late) + 1}",
        ),
        # after every earlier case was right: the end-of-text id inside the prompts finishes no row
        ([[*prompts[0], never], [never, *prompts[1]], prompts[2]], 6, never, other, EOS_IN_PROMPTS),
        # last: GPT-2's prompts begin with <|endoftext|>, the usual pad as well
        ([[never, *p] for p in prompts], 6, never, never, PAD_IN_PROMPTS),
    )
    lengths, calls = [], []
    hook = model.embed.register_forward_hook(lambda module, args, out: lengths.append(args[0].shape[-1]))

    def record(module, args, kwargs):  # what each forward was given: new tokens, mask columns, cached positions
        given = list(args) + [kwargs.get(k) for k in ("tokens", "attention_mask", "past_kvs") if k in kwargs]
        tokens, mask = given[0], given[1] if len(given) > 1 else None
        past = given[2] if len(given) > 2 else None
        cached = past[0][0].shape[1] if past else 0
        calls.append((tokens.shape[-1], None if not isinstance(mask, Tensor) else mask.shape[-1], cached))

    pre_hook = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        for batch, max_new, eos, pad, about in cases:
            what = (
                f"{name}(model, {len(batch)} prompts of lengths {[len(p) for p in batch]}, {max_new}, "
                f"eos_token_id={eos}, pad_token_id={pad})"
            )
            lengths.clear()
            calls.clear()
            with torch.no_grad():
                try:
                    got = call(padded_generate, model, [list(p) for p in batch], max_new, eos, pad, what=what)
                except AssertionError as err:
                    _name_mask_length(calls, what)
                    raised = str(err.__cause__ or err)
                    if eos >= cfg.d_vocab and "index" in raised.lower() and "out of" in raised.lower():
                        fail(  # what was observed: the one id outside the vocabulary here is the end-of-text id
                            f"{what} raised ({raised.splitlines()[0][:120]}): the only id outside the vocabulary "
                            f"here is eos_token_id = {eos}, so something was indexed with it (prompts padded with "
                            "it, or it fed to the model): pad with pad_token_id, and only compare the new tokens "
                            "with eos_token_id."
                        )
                    if max_new == fits and "n_ctx" in str(err.__cause__ or ""):
                        fail(
                            f"{what} failed ({str(err).splitlines()[0]}), but the model never needs more than "
                            f"n_ctx = {cfg.n_ctx} positions here: the last new token needs no forward of its own."
                        )
                    raise
            _name_mask_length(calls, what)
            expected = _expected_batch(course, batch, max_new, eos, pad)
            if not isinstance(got, Tensor):
                fail(f"{what} returned {type(got).__name__}: return the tokens as one tensor.")
            if tuple(got.shape) == tuple(expected.shape) and torch.equal(got, expected):
                if lengths[:1] != [max(len(p) for p in batch)] or any(n != 1 for n in lengths[1:]):
                    fail(
                        f"{what} embedded {lengths} tokens per forward: the padded prompts once, then only the one "
                        "new token of each row per step (the cache holds the rest)."
                    )
                continue
            holding = [i for i, p in enumerate(batch) if pad in p]
            if about == EOS_IN_PROMPTS:
                fail(
                    f"{what}: wrong only where prompts hold eos_token_id = {eos} (the first ends with it), every "
                    "earlier case right: a row is finished by the tokens generation emits, not by its prompt; start "
                    f"with no row finished ({_first_difference(got, expected)})."
                )
            if about == PAD_IN_PROMPTS and tuple(got.shape) == tuple(expected.shape):
                fail(
                    f"{what}: wrong only where each prompt begins with pad_token_id = {pad} as a real token (as "
                    "GPT-2's begin with <|endoftext|>), every earlier case right: a position is padding by its "
                    f"prompt's length, not its id ({_first_difference(got, expected)})."
                )
            try:
                _name_generate_mistake(got, expected, course, batch, max_new, eos, pad, what, about)
            except AssertionError as err:
                if not holding:
                    raise
                raise AssertionError(  # what was seen, then a fact the learner may have missed
                    f"{err} Prompts {holding} hold pad_token_id = {pad} as a real token: a position is padding by "
                    "its prompt's length, not its id."
                ) from None
    finally:
        hook.remove()
        pre_hook.remove()
    print(f"{name} passed: every row equals its prompt decoded alone; finished rows padded; stops when all finish.")


def _name_mask_length(calls: list, what: str) -> None:
    """Fails when a forward was given a mask whose columns are not the cached positions plus the new tokens."""
    for i, (new, columns, cached) in enumerate(calls):
        if columns is None:
            fail(f"{what}: forward {i + 1} of the model was given no attention mask: pass one to every forward.")
        if columns != cached + new:
            fail(
                f"{what}: forward {i + 1} was given a mask of {columns} columns for {cached} cached and {new} new "
                f"positions: the mask covers them all ({cached + new}), one column longer each step."
            )


def _expected_batch(course, prompts, max_new: int, eos: int, pad: int) -> Tensor:
    outs = [_alone(course, p, max_new, eos) for p in prompts]
    n_new = max(len(o) for o in outs)
    tokens, _ = _left_padded(prompts, pad)
    new = torch.tensor([o + [pad] * (n_new - len(o)) for o in outs], dtype=torch.long)
    return torch.cat([tokens, new], dim=1)


def _name_generate_mistake(got: Tensor, expected: Tensor, course, prompts, max_new, eos, pad, what, about) -> None:
    longest = max(len(p) for p in prompts)
    if got.dim() != 2 or got.shape[0] != len(prompts):
        fail(f"{what} returned shape {list(got.shape)}: one row per prompt, [{len(prompts)}, pos].")
    if got.shape[1] == expected.shape[1] - longest:
        fail(f"{what} returned only the new tokens: return the padded prompts followed by them, as `generate` does.")
    if got.shape[1] > expected.shape[1] and got.shape[1] == longest + max_new:
        fail(
            f"{what} ({about}) ran all {max_new} steps: stop as soon as every row has emitted eos_token_id "
            f"(expected {expected.shape[1] - longest} new tokens)."
        )
    if got.shape[1] < expected.shape[1]:
        fail(
            f"{what} ({about}) stopped after {got.shape[1] - longest} new tokens, expected "
            f"{expected.shape[1] - longest}: stop only when EVERY row has finished."
        )
    if got.shape == expected.shape:
        unpadded = expected.clone()
        for row, prompt in enumerate(prompts):  # the finished rows' later tokens as the model chooses them
            alone = _alone(course, prompt, expected.shape[1] - longest, eos=-1)
            unpadded[row, longest:] = torch.tensor(alone, dtype=torch.long)
        if torch.equal(got, unpadded) and not torch.equal(got, expected):
            fail(
                f"{what} ({about}): a row that emitted eos_token_id went on generating. Pad a finished row "
                "with pad_token_id until the others are done."
            )
        with_eos = torch.where(got == eos, pad, got)
        if not torch.equal(got, expected) and torch.equal(torch.where(expected == eos, pad, expected), with_eos):
            fail(f"{what} ({about}): eos_token_id stands where pad_token_id = {pad} is due (or the other way round).")
        unmasked = _unmasked_run(course, prompts, expected.shape[1] - longest, pad)
        if torch.equal(got[:, longest:], unmasked) and not torch.equal(unmasked, expected[:, longest:]):
            fail(
                f"{what}: the new tokens are those of the left-padded batch with a mask of all True (the pads "
                "attended to, counted as positions): pass left_pad's mask to the first forward, then the grown one."
            )
        right = _unmasked_run(course, prompts, expected.shape[1] - longest, pad, right=True)
        if torch.equal(got[:, longest:], right):
            fail(
                f"{what}: the shorter prompts were padded on the right, so their next token was predicted after "
                "the padding. Pad on the left (left_pad) and pass the mask."
            )
        if not torch.equal(got[:, :longest], expected[:, :longest]):
            fail(
                f"{what}: the padded prompts are {got[:, :longest].tolist()}, expected {expected[:, :longest].tolist()}."
            )
        bad = (got != expected).any(dim=1).nonzero().flatten().tolist()
        first = int((got != expected).any(dim=0).nonzero()[0]) - longest
        fail(
            f"{what} ({about}): the padded prompts are right, but rows {bad} continue differently from their prompt "
            f"decoded alone, from new token {first} on: got {got[:, longest:].tolist()}, expected "
            f"{expected[:, longest:].tolist()}."
        )
    fail(f"{what} ({about}) returned {got.tolist()}, expected {expected.tolist()}.")


def _unmasked_run(course, prompts, n_new: int, pad: int, right: bool = False) -> Tensor:
    """The new tokens of greedy decoding on the padded prompts with no mask (left or right padding)."""
    tokens, _ = _left_padded(prompts, pad, right=right)
    start = tokens.shape[1]
    with torch.no_grad():
        for _ in range(n_new):
            tokens = torch.cat([tokens, course(tokens)[:, -1:].argmax(-1)], dim=1)
    return tokens[:, start:]
