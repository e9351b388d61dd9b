"""Checks for notebook 07's decoding exercises: temperature, top-k, top-p, the frequency penalty, min-p, the
repetition penalty, the full sampler, batched generation with end-of-text, and beam search.

The oracles are independent of the learner's code: `transformers`' own logits processors for temperature, top-k,
top-p, min-p and the repetition penalty; counting by `scatter_add` for the frequency penalty; the exact
probabilities those give for the sampler (compared with the frequencies of many draws); `GPT2LMHeadModel.generate` and small "scripted" language models whose best answers
are known (greedy, exhaustive search) for generation and beam search. When an output is wrong, the usual mistakes
are recomputed on the same input and the one that matches is named.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import torch
from torch import Tensor, nn

from harness._assertions import as_tensor_output, call, fail

__all__ = [
    "beam_search_test",
    "frequency_penalty_test",
    "generate_test",
    "min_p_test",
    "ngram_ban_test",
    "repetition_penalty_test",
    "sample_next_token_test",
    "temperature_test",
    "top_k_test",
    "top_p_test",
]

NEG_INF = float("-inf")


def _kcall(fn, *args, what: str, **kwargs):
    """`call` with keyword arguments."""
    return call(functools.partial(fn, **kwargs), *args, what=what)


def _name(fn, default: str) -> str:
    if not callable(fn):
        fail(f"Expected the function itself, got {type(fn).__name__}.")
    return getattr(fn, "__name__", default)


def _logits(seed: int, batch: int = 4, d_vocab: int = 40, scale: float = 3.0) -> Tensor:
    return scale * torch.randn(batch, d_vocab, generator=torch.Generator().manual_seed(seed))


def _run_filter(fn, name: str, logits: Tensor, *args) -> Tensor:
    given = logits.clone()
    out = as_tensor_output(call(fn, given, *args, what=f"{name}(logits, {', '.join(map(repr, args))})"), name)
    if not torch.equal(given, logits):
        fail(f"{name} modified `logits` in place: work on a copy (e.g. logits.masked_fill(...), not masked_fill_).")
    if tuple(out.shape) != tuple(logits.shape):
        fail(f"{name} returned shape {list(out.shape)}, expected {list(logits.shape)} (the same as `logits`).")
    if out.isnan().any():
        fail(f"{name} returned NaN values.")
    return out


def _same_filter(out: Tensor, expected: Tensor) -> bool:
    """The same kept entries with the same values, and -inf exactly where the oracle removed a token."""
    if not torch.equal(torch.isneginf(out), torch.isneginf(expected)):
        return False
    kept = ~torch.isneginf(expected)
    return torch.allclose(out[kept], expected[kept], atol=1e-5, rtol=1e-5)


def _kept_counts(t: Tensor) -> list[int]:
    return (~torch.isneginf(t)).sum(-1).tolist()


def _filter_evidence(out: Tensor, expected: Tensor, logits: Tensor) -> str:
    """Where a filter's output parts from the expected one: the counts kept, then the first row that differs, in
    terms of which tokens were kept and whether the kept ones kept their values."""
    got, want = _kept_counts(out), _kept_counts(expected)
    kept, due = ~torch.isneginf(out), ~torch.isneginf(expected)
    for row in range(out.shape[0]):
        if torch.equal(kept[row], due[row]):
            if not torch.allclose(out[row][kept[row]], logits[row][kept[row]], atol=1e-5):
                return f"row {row} keeps the right tokens but changes their values (a filter only removes tokens)"
            continue
        extra = (kept[row] & ~due[row]).nonzero().flatten().tolist()
        missing = (due[row] & ~kept[row]).nonzero().flatten().tolist()
        parts = [f"keeps tokens {extra[:6]} that are removed"] * bool(extra)
        parts += [f"removes tokens {missing[:6]} that are kept"] * bool(missing)
        count = (
            "the right number of tokens" if got[row] == want[row] else f"{got[row]} tokens where {want[row]} are due"
        )
        return f"kept {got} tokens per row where {want} are due; row {row} keeps {count}, but " + " and ".join(parts)
    return f"kept {got} tokens per row where {want} are due"


# --------------------------------------------------------------------------------------------------------------------
# Temperature
# --------------------------------------------------------------------------------------------------------------------


def temperature_test(apply_temperature) -> None:
    """Checks `apply_temperature(logits [batch d_vocab], temperature) -> logits`; temperature 0 means greedy."""
    from transformers import TemperatureLogitsWarper

    name = _name(apply_temperature, "apply_temperature")
    logits = _logits(0)
    for temperature in (0.5, 1.0, 2.0):
        out = _run_filter(apply_temperature, name, logits, temperature)
        expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
        # Any per-row shift of the logits gives the same distribution, so compare distributions.
        if torch.allclose(out.softmax(-1), expected.softmax(-1), atol=1e-5):
            continue
        probs = logits.softmax(-1)
        variants = {
            "multiplies the logits by the temperature: divide them by it (a temperature above 1 must flatten)": (
                logits * temperature
            ),
            "applies the temperature after the softmax (to probabilities): divide the logits, then softmax": (
                probs / temperature
            ),
            "returns probabilities, not logits: return logits / temperature (the softmax comes later)": (
                (logits / temperature).softmax(-1)
            ),
        }
        for cause, candidate in variants.items():
            if torch.allclose(out, candidate, atol=1e-5) or torch.allclose(
                out.softmax(-1), candidate.softmax(-1), atol=1e-5
            ):
                fail(f"{name} at temperature {temperature}: it {cause}.")
        fail(
            f"{name} at temperature {temperature} gives a distribution that differs from softmax(logits / "
            f"temperature) (largest difference in probability "
            f"{(out.softmax(-1) - expected.softmax(-1)).abs().max().item():.3g})."
        )
    # A near tie in one row (0.5 and the float32 two steps below it, no exact tie): dividing by a tiny temperature
    # instead of 0 leaves both tokens likely, while greedy keeps the argmax alone.
    logits = logits.clone()
    logits[1] -= logits[1].max() + 1.0
    logits[1, 3] = 0.5
    below = torch.nextafter(torch.tensor(0.5), torch.tensor(0.0))
    logits[1, 7] = torch.nextafter(below, torch.tensor(0.0))
    try:
        out = _run_filter(apply_temperature, name, logits, 0.0)
    except AssertionError as err:
        if isinstance(err.__cause__, ZeroDivisionError) or "ZeroDivisionError" in str(err):
            fail(f"{name} divides by zero at temperature 0: treat 0 as greedy (keep only each row's argmax).")
        raise
    probs = out.softmax(-1)
    if torch.isposinf(out).any():
        fail(f"{name} divides by zero at temperature 0 (the logits became +-inf): treat 0 as greedy instead.")
    if out.isinf().all(-1).any() or probs.isnan().any():
        fail(f"{name} at temperature 0 removed every token of a row: keep each row's argmax.")
    if not torch.equal(probs.argmax(-1), logits.argmax(-1)) or (probs.max(-1).values < 1 - 1e-6).any():
        fail(
            f"{name} at temperature 0 must make sampling greedy: all the probability on each row's argmax (e.g. -inf "
            f"everywhere else); the largest probability is {probs.max(-1).values.min().item():.3g} on some row."
        )
    print(f"{name} passed: matches transformers' TemperatureLogitsWarper at 0.5, 1 and 2, and is greedy at 0.")


# --------------------------------------------------------------------------------------------------------------------
# Top-k
# --------------------------------------------------------------------------------------------------------------------


def top_k_test(top_k_filter) -> None:
    """Checks `top_k_filter(logits [batch d_vocab], k)`: every token below the k-th largest logit of its row -> -inf."""
    from transformers import TopKLogitsWarper

    name = _name(top_k_filter, "top_k_filter")
    ties = torch.tensor([[5.0, 1.0, 5.0, 3.0, 5.0, 0.0, 2.0, -1.0], [0.0, 4.0, 1.0, 3.0, 2.0, 6.0, 5.0, 7.0]])
    cases = [(_logits(1), 5), (_logits(2), 1), (ties, 2), (_logits(3, d_vocab=12), 12), (_logits(4, d_vocab=12), 50)]
    for logits, k in cases:
        if k > logits.shape[-1]:
            try:
                top_k_filter(logits.clone(), k)
            except RuntimeError as err:  # topk(k) with k > d_vocab: the only case the others cannot catch
                raise AssertionError(
                    f"{name}(logits, {k}) on logits with only {logits.shape[-1]} tokens raised {type(err).__name__}: "
                    f"{err}. k may be larger than d_vocab: clamp it first, k = min(k, logits.shape[-1]) (then "
                    "every token is kept)."
                ) from err
        out = _run_filter(top_k_filter, name, logits, k)
        expected = TopKLogitsWarper(top_k=k, filter_value=NEG_INF)(None, logits.clone())
        if _same_filter(out, expected):
            continue
        where = f"with k={k} on logits of shape {list(logits.shape)}"
        got, want = _kept_counts(out), _kept_counts(expected)
        removed = torch.isneginf(expected) & ~torch.isneginf(out)
        if removed.any() and torch.equal(out[~torch.isneginf(expected)], expected[~torch.isneginf(expected)]):
            changed = out[removed & (out != logits)]
            if changed.numel():
                value = changed[0].item()
                fail(f"{name} {where}: removed tokens must become -inf, not {value:g} (they keep some probability).")
        if k >= logits.shape[-1] and got != want:
            fail(f"{name} {where}: with k >= d_vocab every token stays; it kept {got} per row.")
        if all(g == w + 1 for g, w in zip(got, want)):
            fail(f"{name} {where}: keeps k + 1 tokens per row ({got}): an off-by-one in the threshold index.")
        if all(g == w - 1 for g, w in zip(got, want)):
            fail(f"{name} {where}: keeps k - 1 tokens per row ({got}): an off-by-one in the threshold index.")
        row0 = logits.topk(min(k, logits.shape[-1]), dim=-1).values[0, -1]
        if _same_filter(out, logits.masked_fill(logits < row0, NEG_INF)):
            fail(f"{name} {where}: every row used the first row's threshold: take the k-th largest value per row.")
        if logits is ties:
            fail(
                f"{name} {where}: on a row with ties at the k-th value it kept {got[0]} tokens where {want[0]} are due: "
                "keep every token whose logit equals the k-th largest (as transformers does)."
            )
        fail(f"{name} {where}: {_filter_evidence(out, expected, logits)}.")
    print(f"{name} passed: matches transformers' TopKLogitsWarper, ties and k >= d_vocab included.")


# --------------------------------------------------------------------------------------------------------------------
# Top-p
# --------------------------------------------------------------------------------------------------------------------


def _top_p_without_crossing(logits: Tensor, p: float) -> Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    remove_sorted = cumulative > p
    remove_sorted[..., 0] = False
    return logits.masked_fill(remove_sorted.scatter(-1, order, remove_sorted), NEG_INF)


def _top_p_unscattered(logits: Tensor, p: float, keep: int) -> Tensor:
    """The right mask, computed in sorted order, applied to the logits in vocabulary order."""
    sorted_logits = logits.sort(dim=-1, descending=True).values
    probs = sorted_logits.softmax(-1)
    remove_sorted = probs.cumsum(-1) - probs >= p
    remove_sorted[..., :keep] = False
    return logits.masked_fill(remove_sorted, NEG_INF)


def top_p_test(top_p_filter) -> None:
    """Checks `top_p_filter(logits, p, min_tokens_to_keep=1)`: nucleus filtering, the crossing token kept."""
    from transformers import TopPLogitsWarper

    name = _name(top_p_filter, "top_p_filter")
    cases = [(_logits(5, scale=2.0), 0.9, 1), (_logits(6, scale=1.0), 0.5, 1), (_logits(7, scale=4.0), 0.01, 3)]
    for logits, p, keep in cases:
        out = _run_filter(top_p_filter, name, logits, p, keep)
        expected = TopPLogitsWarper(top_p=p, filter_value=NEG_INF, min_tokens_to_keep=keep)(None, logits.clone())
        if _same_filter(out, expected):
            continue
        where = f"with p={p}, min_tokens_to_keep={keep}"
        got, want = _kept_counts(out), _kept_counts(expected)
        if _same_filter(out, _top_p_unscattered(logits, p, keep)):
            fail(f"{name} {where}: the mask is in sorted order: scatter it back to vocabulary order.")
        if _same_filter(out, _top_p_without_crossing(logits, p)) or all(g == w - 1 for g, w in zip(got, want)):
            fail(
                f"{name} {where}: it drops the token whose probability crosses p (kept {got}, due {want}): keep the "
                "smallest set whose total probability reaches p, the crossing token included."
            )
        if keep > 1 and any(g < keep for g in got):
            fail(f"{name} {where}: kept {got} tokens per row: never fewer than min_tokens_to_keep.")
        fail(f"{name} {where}: {_filter_evidence(out, expected, logits)}.")
    print(f"{name} passed: matches transformers' TopPLogitsWarper, the crossing token and min_tokens_to_keep included.")


# --------------------------------------------------------------------------------------------------------------------
# Frequency penalty
# --------------------------------------------------------------------------------------------------------------------


def _counts(tokens: Tensor, d_vocab: int) -> Tensor:
    return torch.zeros(tokens.shape[0], d_vocab).scatter_add(1, tokens, torch.ones(tokens.shape, dtype=torch.float32))


def _run_penalty(fn, name: str, logits: Tensor, tokens: Tensor, penalty: float, fix: str) -> Tensor:
    """`fn(logits, tokens, penalty)` on copies, which it may not change: the sampler reuses the logits it passed."""
    given_tokens, given_logits = tokens.clone(), logits.clone()
    out = as_tensor_output(call(fn, given_logits, given_tokens, penalty, what=f"{name}(logits, tokens, p)"), name)
    if not torch.equal(given_tokens, tokens):
        fail(f"{name} modified `tokens` in place.")
    if not torch.equal(given_logits, logits):
        fail(f"{name} modified `logits` in place{fix}")
    return out


def frequency_penalty_test(apply_frequency_penalty) -> None:
    """Checks `apply_frequency_penalty(logits [batch d_vocab], tokens [batch pos], penalty)`."""
    name = _name(apply_frequency_penalty, "apply_frequency_penalty")
    logits = _logits(8, batch=3, d_vocab=10)
    tokens = torch.tensor([[1, 1, 1, 4, 9, 4], [0, 2, 2, 2, 2, 7], [5, 6, 5, 6, 5, 3]])
    for penalty in (0.5, 1.5):
        out = _run_penalty(
            apply_frequency_penalty,
            name,
            logits,
            tokens,
            penalty,
            "(e.g. scatter_add_ or -= on logits): return a new tensor, logits - penalty * counts.",
        )
        counts = _counts(tokens, logits.shape[-1])
        expected = logits - penalty * counts
        if tuple(out.shape) == tuple(logits.shape) and torch.allclose(out, expected, atol=1e-5):
            continue
        if tuple(out.shape) != tuple(logits.shape):
            fail(f"{name} returned shape {list(out.shape)}, expected {list(logits.shape)}.")
        if torch.allclose(out, logits - penalty * (counts > 0).float(), atol=1e-5):
            fail(f"{name} subtracts the penalty once per token present (presence); subtract it once per occurrence.")
        if torch.allclose(out, logits - penalty * _counts(tokens[:1].expand_as(tokens), logits.shape[-1]), atol=1e-5):
            fail(f"{name} used the first row's counts for every row: count each row's own tokens.")
        whole_batch = torch.bincount(tokens.flatten(), minlength=logits.shape[-1]).float()
        if torch.allclose(out, logits - penalty * whole_batch, atol=1e-5):
            fail(
                f"{name} counts the tokens of the whole batch: count each row's own tokens (row r's penalty uses row r)."
            )
        if torch.allclose(out, logits + penalty * counts, atol=1e-5):
            fail(f"{name} adds the penalty: subtract it, so repeated tokens become less likely.")
        # What the output shows: the change of one wrong entry, and whether the order of the tokens matters.
        bad = ((out - expected).abs() > 1e-5).nonzero()
        r, t = (int(i) for i in bad[0])
        change, count = (out[r, t] - logits[r, t]).item(), int(counts[r, t])
        shown = (
            f"for row {r}, token {t} (in the row {count} times) your output moves the logit by {change:+.4g} "
            f"({-change / penalty:.4g} x penalty), expected {-penalty * count:+.4g} ({count} x penalty)"
        )
        with torch.no_grad():
            reordered = call(apply_frequency_penalty, logits.clone(), tokens.flip(-1), penalty, what=name)
        if isinstance(reordered, Tensor) and reordered.shape == out.shape and not torch.allclose(reordered, out):
            shown += "; reversing the order of each row's tokens changed your output, though no count changes"
        fail(
            f"{name} with penalty={penalty} differs from logits - penalty * (occurrences of each token in its row): {shown}."
        )
    print(f"{name} passed: subtracts penalty x count of each token, row by row.")


# --------------------------------------------------------------------------------------------------------------------
# Min-p and the repetition penalty
# --------------------------------------------------------------------------------------------------------------------


def min_p_test(min_p_filter) -> None:
    """Checks `min_p_filter(logits, min_p, min_tokens_to_keep=1)`: tokens less likely than min_p times the row's
    most likely token -> -inf, at least `min_tokens_to_keep` kept."""
    from transformers import MinPLogitsWarper

    name = _name(min_p_filter, "min_p_filter")
    # Rows of different confidence (top probabilities 0.21 to 0.63), so that one row's threshold is wrong for another
    # and no row is so sure that min_p itself is the threshold; a min_p high
    # enough that only the top token survives, where min_tokens_to_keep is what keeps more.
    spread = _logits(11, batch=4, d_vocab=40) * torch.tensor([[0.3], [0.6], [1.0], [1.4]])
    # min_p = 1 keeps exactly the tokens tied for the top: "below the threshold" is strict (the tie is the point).
    tied_top = torch.tensor([[2.0, 0.5, 2.0, -1.0, 1.0, 2.0], [0.0, 3.0, 1.0, 3.0, -2.0, 0.5]])
    cases = [
        (spread, 0.1, 1),
        (_logits(12, scale=2.0), 0.3, 1),
        (_logits(13, scale=4.0), 0.9, 5),  # more to keep than rows in the batch
        (tied_top, 1.0, 1),
        (_logits(15, batch=2, d_vocab=6, scale=4.0), 0.9, 10),  # more to keep than the vocabulary holds: all of it
    ]
    for logits, min_p, keep in cases:
        out = _run_filter(min_p_filter, name, logits, min_p, keep)
        expected = MinPLogitsWarper(min_p=min_p, filter_value=NEG_INF, min_tokens_to_keep=keep)(None, logits.clone())
        if _same_filter(out, expected):
            continue
        where = f"with min_p={min_p}, min_tokens_to_keep={keep}"
        probs = logits.softmax(-1)
        absolute = logits.masked_fill(probs < min_p, NEG_INF)
        on_logits = logits.masked_fill(logits < min_p * logits.amax(-1, keepdim=True), NEG_INF)
        batch_top = logits.masked_fill(probs < min_p * probs.max(), NEG_INF)
        if _same_filter(out, absolute):
            fail(
                f"{name} {where}: it removes tokens whose probability is below min_p itself; the threshold is min_p "
                "times the probability of the row's most likely token, so it moves with the model's confidence."
            )
        if _same_filter(out, on_logits):
            fail(f"{name} {where}: the threshold is applied to logits; compare probabilities (after a softmax).")
        if _same_filter(out, batch_top):
            fail(
                f"{name} {where}: every row is compared with the most likely token of the whole batch; use each row's "
                "own top probability."
            )
        likeliest = probs.topk(min(keep, probs.shape[-1]), dim=-1).indices
        reversed_ = (probs > min_p * probs.amax(-1, keepdim=True)).scatter(-1, likeliest, False)
        if _same_filter(out, logits.masked_fill(reversed_, NEG_INF)):
            fail(
                f"{name} {where}: it removes the tokens above the threshold and keeps those below: the comparison is "
                "reversed (remove a token when its probability is below min_p times the top one)."
            )
        at_most = probs <= min_p * probs.amax(-1, keepdim=True)
        if _same_filter(out, logits.masked_fill(at_most.scatter(-1, likeliest, False), NEG_INF)):
            fail(
                f"{name} {where}: it also removes the tokens whose probability equals the threshold; remove only "
                "those strictly below it (with min_p = 1 every token tied for the top stays)."
            )
        first_ids = probs < min_p * probs.amax(-1, keepdim=True)
        first_ids[:, :keep] = False
        if _same_filter(out, logits.masked_fill(first_ids, NEG_INF)):
            fail(
                f"{name} {where}: it always keeps the first {keep} token ids of the vocabulary; min_tokens_to_keep "
                "protects the likeliest tokens of each row (find them by probability)."
            )
        got = _kept_counts(out)
        if keep > 1 and any(g < keep for g in got):
            fail(f"{name} {where}: kept {got} tokens per row: never fewer than min_tokens_to_keep.")
        fail(f"{name} {where}: {_filter_evidence(out, expected, logits)}.")
    print(f"{name} passed: matches transformers' MinPLogitsWarper, min_tokens_to_keep included.")


def repetition_penalty_test(apply_repetition_penalty) -> None:
    """Checks `apply_repetition_penalty(logits [batch d_vocab], tokens [batch pos], penalty)`: CTRL's rule."""
    from transformers import RepetitionPenaltyLogitsProcessor

    name = _name(apply_repetition_penalty, "apply_repetition_penalty")
    logits = _logits(14, batch=3, d_vocab=10)  # about half of the seen tokens' logits are negative
    # and some seen tokens' logits between 0 and 1, where dividing and multiplying still differ
    logits[0, 1], logits[1, 2], logits[2, 5] = 0.4, 0.8, 0.05
    tokens = torch.tensor([[1, 1, 1, 4, 9, 4], [0, 2, 2, 2, 2, 7], [5, 6, 5, 6, 5, 3]])
    for penalty in (1.3, 2.0, 0.8):
        out = _run_penalty(apply_repetition_penalty, name, logits, tokens, penalty, ": return a new tensor.")
        if tuple(out.shape) != tuple(logits.shape):
            fail(f"{name} returned shape {list(out.shape)}, expected {list(logits.shape)}.")
        expected = RepetitionPenaltyLogitsProcessor(penalty=penalty)(tokens, logits.clone())
        if torch.allclose(out, expected, atol=1e-5):
            continue
        where = f"with penalty={penalty}"
        seen = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, tokens, True)
        counts = _counts(tokens, logits.shape[-1])
        if torch.allclose(out, torch.where(seen, logits / penalty, logits), atol=1e-5):
            fail(
                f"{name} {where}: it divides every seen token's logit by the penalty; a negative logit divided by a "
                "penalty above 1 grows towards 0 and the token becomes likelier. Multiply negative logits instead."
            )
        by_count = torch.where(logits < 0, logits * penalty**counts, logits / penalty**counts)
        if torch.allclose(out, by_count, atol=1e-5):
            fail(
                f"{name} {where}: it applies the penalty once per occurrence (penalty ** count); CTRL's rule applies "
                "it once per distinct token, however often the token occurred."
            )
        anywhere = torch.zeros(logits.shape[-1], dtype=torch.bool).scatter(0, tokens.flatten(), True).expand_as(seen)
        penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
        if torch.allclose(out, torch.where(anywhere, penalised, logits), atol=1e-5):
            fail(f"{name} {where}: it penalises tokens seen anywhere in the batch; each row uses its own tokens.")
        if torch.allclose(out, torch.where(seen[:1].expand_as(seen), penalised, logits), atol=1e-5):
            fail(f"{name} {where}: every row is penalised for row 0's tokens; each row uses its own tokens.")
        if torch.allclose(out, torch.where(seen, logits - penalty, logits), atol=1e-5):
            fail(
                f"{name} {where}: it subtracts the penalty from each seen token's logit (OpenAI's presence penalty); "
                "CTRL's rule rescales it: divide a positive logit by the penalty, multiply a negative one."
            )
        inverse = torch.where(seen, torch.where(logits < 0, logits / penalty, logits * penalty), logits)
        if torch.allclose(out, inverse, atol=1e-5):
            fail(
                f"{name} {where}: it makes seen tokens likelier: divide a positive logit by the penalty and multiply "
                "a negative one, so that a penalty above 1 always lowers them."
            )
        wrong = (out - expected).abs() > 1e-5
        unseen_changed = (wrong & ~seen).nonzero()
        if len(unseen_changed):
            r, t = (int(i) for i in unseen_changed[0])
            fail(f"{name} {where}: row {r}'s token {t} never occurs in that row, yet its logit changed.")
        r, t = (int(i) for i in wrong.nonzero()[0])
        fail(
            f"{name} {where}: row {r}'s token {t} (seen {int(counts[r, t])} times, logit {logits[r, t].item():+.4g}) "
            f"became {out[r, t].item():+.4g}, expected {expected[r, t].item():+.4g}."
        )
    print(f"{name} passed: matches transformers' RepetitionPenaltyLogitsProcessor (CTRL), negative logits included.")


def _ngram_oracle(log_probs: Tensor, sequences: Tensor, n: int) -> Tensor:
    from transformers import NoRepeatNGramLogitsProcessor

    return NoRepeatNGramLogitsProcessor(n)(sequences, log_probs.clone())


def _ngram_without_last_window(log_probs: Tensor, sequences: Tensor, n: int) -> Tensor:
    banned = log_probs.clone()
    for row, seq in enumerate(sequences.tolist()):
        prefix = seq[len(seq) - n + 1 :]
        for start in range(len(seq) - n):
            if seq[start : start + n - 1] == prefix:
                banned[row, seq[start + n - 1]] = NEG_INF
    return banned


def ngram_ban_test(ban_repeated_ngrams) -> None:
    """Checks `ban_repeated_ngrams(log_probs [n_live d_vocab], sequences [n_live pos], n)` against transformers'
    `NoRepeatNGramLogitsProcessor`: -inf on every token that would complete an n-gram already in its row."""
    name = _name(ban_repeated_ngrams, "ban_repeated_ngrams")
    log_probs = _logits(16, batch=3, d_vocab=9).log_softmax(-1)
    sequences = torch.tensor(  # rows that repeat bigrams and trigrams, each its own way
        [[1, 2, 3, 1, 2, 4, 1, 2], [5, 5, 7, 6, 5, 7, 6, 6], [0, 3, 8, 0, 3, 8, 2, 0]]
    )  # row 1 ends "6 6": with n = 2 the window just before the end is the only one that bans 6
    cases = [(sequences, 2), (sequences, 3), (sequences, 1), (sequences[:, :2], 3), (sequences[:, :5], 4)]
    for seqs, n in cases:
        given, given_lp = seqs.clone(), log_probs.clone()
        out = as_tensor_output(
            call(ban_repeated_ngrams, given_lp, given, n, what=f"{name}(log_probs, sequences, {n})"), name
        )
        if not torch.equal(given, seqs) or not torch.equal(given_lp, log_probs):
            fail(f"{name} modified its input in place (`log_probs` or `sequences`): return a new tensor.")
        if tuple(out.shape) != tuple(log_probs.shape):
            fail(f"{name} returned shape {list(out.shape)}, expected {list(log_probs.shape)} (that of `log_probs`).")
        expected = _ngram_oracle(log_probs, seqs, n)
        if _same_filter(out, expected):
            continue
        where = f"with n={n} on sequences {seqs.tolist()}"
        if torch.equal(out <= -1e4, torch.isneginf(expected)) and not torch.isneginf(out).any():
            fail(f"{name} {where}: a banned token's log-probability must be -inf, not {out.min().item():g}.")
        if seqs.shape[1] < n and torch.isneginf(out).any():
            fail(f"{name} {where}: a sequence shorter than n holds no n-gram yet, so nothing may be banned.")
        for other in (n - 1, n + 1):
            if other >= 1 and _same_filter(out, _ngram_oracle(log_probs, seqs, other)):
                fail(
                    f"{name} {where}: it bans the tokens that would repeat {other}-grams, not {n}-grams: "
                    f"the last {n - 1} tokens are the prefix to look for, and the token after each earlier "
                    "occurrence is the one banned."
                )
        if _same_filter(out, _ngram_without_last_window(log_probs, seqs, n)):
            fail(
                f"{name} {where}: it never compares the last window that has a token after it (the one ending just "
                "before the final token): let the start run up to len(seq) - n, inclusive."
            )
        if _same_filter(out, _ngram_oracle(log_probs, seqs[:1].expand_as(seqs), n)):
            fail(f"{name} {where}: every row uses row 0's tokens; each row bans by its own sequence.")
        fail(f"{name} {where}: {_filter_evidence(out, expected, log_probs)}.")
    print(f"{name} passed: matches transformers' NoRepeatNGramLogitsProcessor for n = 1 to 4, short rows included.")


# --------------------------------------------------------------------------------------------------------------------
# The full sampler
# --------------------------------------------------------------------------------------------------------------------


def _processed(logits, tokens, temperature, top_k, top_p, penalty, order=("penalty", "temperature", "top_k", "top_p")):
    """The logits after the processors, in `order` (transformers' order by default), by independent code."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    x = logits.clone()
    for step in order:
        if step == "penalty" and penalty:
            x = x - penalty * _counts(tokens, x.shape[-1])
        elif step == "temperature" and temperature != 1.0:
            x = TemperatureLogitsWarper(temperature)(None, x)
        elif step == "top_k" and top_k is not None:
            x = TopKLogitsWarper(top_k=top_k, filter_value=NEG_INF)(None, x)
        elif step == "top_p" and top_p is not None:
            x = TopPLogitsWarper(top_p=top_p, filter_value=NEG_INF)(None, x)
    return x


def sample_next_token_test(sample_next_token) -> None:
    """Checks `sample_next_token(logits, tokens, temperature, top_k, top_p, frequency_penalty, generator)`.

    Three rows, each repeated N times in one batched call: the frequency of each token is compared with its exact
    probability after the processors. The tolerance on the total-variation distance, 0.06, is exceeded by a correct
    sampler with probability at most 2^V exp(-2 N 0.06^2) ~ 2e-6 per row (V=12, N=3000), and the seed is fixed.
    """
    name = _name(sample_next_token, "sample_next_token")
    rows = torch.tensor(
        [
            [3.0, 2.9, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, -1.0, -2.0, -3.0, -4.0],
            [0.0, 1.0, 2.0, 3.0, 2.5, 1.5, 0.5, -0.5, 2.2, 2.8, -1.0, 0.2],
            [1.0, 1.1, 0.9, 1.2, 0.1, -0.2, 0.35, -0.1, -1.0, -1.3, 2.0, -2.0],  # no ties after the penalty
        ]
    )
    history = torch.tensor([[0, 0, 0, 1, 5, 5], [3, 3, 9, 9, 9, 1], [10, 10, 10, 10, 0, 2]])
    n = 3000
    settings = {"temperature": 1.6, "top_k": 6, "top_p": 0.75, "frequency_penalty": 0.6}
    logits, tokens = rows.repeat_interleave(n, 0), history.repeat_interleave(n, 0)

    def draw(seed: int, **kw) -> Tensor:
        kwargs = {**settings, **kw, "generator": torch.Generator().manual_seed(seed)}
        out = _kcall(sample_next_token, logits.clone(), tokens.clone(), **kwargs, what=f"{name}(...)")
        out = as_tensor_output(out, name)
        if tuple(out.shape) != (logits.shape[0],):
            extra = " (a [batch, 1] column: take [:, 0] of torch.multinomial's output)" if out.dim() == 2 else ""
            fail(
                f"{name} returned shape {list(out.shape)} for {logits.shape[0]} rows: return one token id per row, "
                f"shape [batch]{extra}."
            )
        if out.dtype not in (torch.int64, torch.int32):
            fail(f"{name} returned dtype {out.dtype}: return token ids (torch.long).")
        return out.long()

    first = draw(0)
    if not torch.equal(first, draw(0)):
        fail(f"{name} gave different draws for the same seeded generator: pass `generator` to torch.multinomial.")
    if torch.equal(first, draw(1)):
        fail(f"{name} gave the same draws for two different seeds: it ignores `generator`, or does not sample.")

    def tv(freq: Tensor, probs: Tensor) -> float:
        return 0.5 * (freq - probs).abs().sum().item()

    freqs = torch.stack([torch.bincount(first[r * n : (r + 1) * n], minlength=12).float() / n for r in range(3)])
    args = (rows, history, settings["temperature"], settings["top_k"], settings["top_p"], settings["frequency_penalty"])
    expected = _processed(*args).softmax(-1)
    distances = [tv(freqs[r], expected[r]) for r in range(3)]
    if max(distances) > 0.06:
        for order in itertools.permutations(("penalty", "temperature", "top_k", "top_p")):
            variant = _processed(*args, order=order).softmax(-1)
            if tv(variant.flatten(), expected.flatten()) > 0.2 and all(
                tv(freqs[r], variant[r]) <= 0.06 for r in range(3)
            ):
                fail(
                    f"{name} applies the processors in the order {' -> '.join(order)}; transformers' order is "
                    "frequency penalty -> temperature -> top-k -> top-p, then one draw from the softmax."
                )
        skippable = {
            "penalty": settings["frequency_penalty"],
            "temperature": settings["temperature"] != 1.0,
            "top_k": settings["top_k"] is not None,
            "top_p": settings["top_p"] is not None,
        }
        for skipped in [step for step, used in skippable.items() if used]:
            kept = tuple(step for step in ("penalty", "temperature", "top_k", "top_p") if step != skipped)
            variant = _processed(*args, order=kept).softmax(-1)
            if tv(variant.flatten(), expected.flatten()) > 0.2 and all(
                tv(freqs[r], variant[r]) <= 0.06 for r in range(3)
            ):
                argument = {"penalty": "frequency_penalty"}.get(skipped, skipped)
                fail(
                    f"{name} ignores {argument}: its draws follow the probabilities with every other processor "
                    f"applied but not that one (this call passes {argument}={settings[argument]})."
                )
        outside = (freqs > 0) & (expected == 0)
        if outside.any():
            fail(
                f"{name} drew tokens that top-k/top-p must have removed (e.g. token {int(outside.nonzero()[0, 1])}): "
                "filter before the softmax, and sample from what is left."
            )
        fail(
            f"{name}: the frequencies of {n} draws per row differ from the probabilities after penalty, temperature, "
            f"top-k and top-p (total-variation distances {[round(d, 3) for d in distances]}, tolerance 0.06)."
        )
    greedy = draw(0, temperature=0.0, top_k=None, top_p=None)
    want = (rows - 0.6 * _counts(history, 12)).argmax(-1).repeat_interleave(n)
    if not torch.equal(greedy, want):
        fail(f"{name} at temperature 0 must return each row's argmax (after the frequency penalty).")
    # A negative penalty rewards repeats (OpenAI's API allows -2 to 2): row 1's argmax moves from 3 to 9.
    greedy = draw(0, temperature=0.0, top_k=None, top_p=None, frequency_penalty=-0.6)
    want = (rows + 0.6 * _counts(history, 12)).argmax(-1).repeat_interleave(n)
    if not torch.equal(greedy, want):
        fail(
            f"{name} with frequency_penalty=-0.6 at temperature 0 did not return each row's argmax after subtracting "
            "-0.6 * count (a negative penalty raises repeated tokens); the positive penalty was right."
        )
    print(f"{name} passed: {3 * n} draws match the processed distributions (TV <= 0.06); temperature 0 is greedy.")


# --------------------------------------------------------------------------------------------------------------------
# Scripted language models: logits that depend only on the last token, so the best answers are known exactly
# --------------------------------------------------------------------------------------------------------------------


class _Cfg:
    def __init__(self, d_vocab: int, n_ctx: int = 256):
        self.d_vocab, self.n_ctx = d_vocab, n_ctx


class ScriptedLM(nn.Module):
    """A "language model" whose next-token logits are a fixed row of `table` chosen by the current token."""

    def __init__(self, table: Tensor, n_ctx: int = 256):
        super().__init__()
        self.cfg = _Cfg(table.shape[-1], n_ctx)
        self.register_buffer("table", table.float())

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.shape[-1] > self.cfg.n_ctx:
            raise ValueError(f"{tokens.shape[-1]} tokens but n_ctx = {self.cfg.n_ctx}")
        return self.table[tokens]


def _successor_table(d_vocab: int, eos: int) -> Tensor:
    """Token t is followed by t + 1 (strongly), so a row reaches `eos` when it gets there; after eos comes 0."""
    table = torch.zeros(d_vocab, d_vocab)
    for t in range(d_vocab):
        table[t, (t + 1) % d_vocab] = 5.0
        table[t, (t + 3) % d_vocab] = 2.0
    return table


def _first_difference(out: Tensor, expected: Tensor) -> str:
    """Where two generated batches first part: the row and the step, or the lengths."""
    if out.shape[0] != expected.shape[0]:
        return f"{out.shape[0]} rows returned where {expected.shape[0]} are due"
    for row in range(out.shape[0]):
        got, want = out[row].tolist(), expected[row].tolist()
        for step, (a, b) in enumerate(zip(got, want)):
            if a != b:
                return f"row {row} first differs at position {step}: got {a}, expected {b}"
    return f"{out.shape[1]} positions returned where {expected.shape[1]} are due"


def _greedy_reference(model, tokens: Tensor, max_new: int, eos: int) -> Tensor:
    done = torch.zeros(tokens.shape[0], dtype=torch.bool)
    for _ in range(max_new):
        nxt = model(tokens[:, -model.cfg.n_ctx :])[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        done |= nxt == eos
        if done.all():
            break
    return tokens


# --------------------------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------------------------


def generate_test(generate) -> None:
    """Checks `generate(model, tokens [batch pos], max_new_tokens, eos_token_id=..., **sampling)`, greedy and sampled.

    With temperature 0 it must agree with an exact greedy decoder on a scripted model (rows finishing at different
    steps) and with `GPT2LMHeadModel.generate` on the reference's weights.
    """
    name = _name(generate, "generate")
    # <|endoftext|> in the middle of the vocabulary: ids above it are ordinary tokens (row 2 passes through them)
    d_vocab, eos = 12, 6
    model = ScriptedLM(_successor_table(d_vocab, eos))
    prompt = torch.tensor([[0, 3, 4], [0, 1, 2], [0, 8, 9]])  # row 0 ends after 2 new tokens, row 1 after 4
    out = as_tensor_output(
        _kcall(generate, model, prompt.clone(), 6, eos_token_id=eos, temperature=0.0, what=f"{name}(...)"), name
    )
    expected = _greedy_reference(model, prompt, 6, eos)
    if tuple(out.shape[:1]) != (3,) or out.dim() != 2:
        fail(f"{name} returned shape {list(out.shape)}: expected [batch, prompt + new tokens] = [3, 9].")
    if not torch.equal(out[:, :3], prompt):
        fail(f"{name} must return the prompt followed by the new tokens; the first 3 columns differ from the prompt.")
    if out.shape == expected.shape and torch.equal(out, expected):
        pass
    elif (out[:, 3:] == out[:1, 3:]).all() and not (expected[:, 3:] == expected[:1, 3:]).all():
        fail(f"{name} gave every row the same new tokens: sample each row from its own logits (batch dimension).")
    elif eos in out[0, :5].tolist() and (out[0, 5:] != eos).any():
        fail(
            f"{name} kept generating after row 0 emitted eos_token_id ({eos} here; got {out[0].tolist()}): once a "
            "row has finished, give it eos (padding) and stop when every row has finished."
        )
    else:
        fail(
            f"{name} with temperature 0 and eos_token_id={eos}: {_first_difference(out, expected)} "
            f"(expected {expected.tolist()}, got {out.tolist()})."
        )
    every_row_ends = as_tensor_output(
        _kcall(generate, model, prompt[:2].clone(), 8, eos_token_id=eos, temperature=0.0, what=name), name
    )
    expected = _greedy_reference(model, prompt[:2], 8, eos)
    if every_row_ends.shape[1] > expected.shape[1] and (every_row_ends[:, expected.shape[1] :] == eos).all():
        fail(
            f"{name} went on for all 8 new tokens after every row had emitted <|endoftext|> (by step "
            f"{expected.shape[1] - 3}): stop as soon as every row has finished, as the docstring says."
        )
    if every_row_ends.shape != expected.shape or not torch.equal(every_row_ends, expected):
        fail(f"{name} with rows that all finish: {_first_difference(every_row_ends, expected)}.")
    # A prompt that outgrows the model's context: the model must only ever see its last n_ctx tokens.
    short_context = ScriptedLM(_successor_table(d_vocab, eos), n_ctx=4)
    try:
        _kcall(generate, short_context, prompt[1:2].clone(), 4, eos_token_id=eos, temperature=0.0, what=name)
    except AssertionError as err:
        if "n_ctx" not in str(err):
            raise
        raise AssertionError(
            f"{name} fed the model more tokens than its context length (model.cfg.n_ctx = 4 here) once the sequence "
            "grew: pass only the last n_ctx tokens, model(tokens[:, -model.cfg.n_ctx:]). "
            f"({str(err).splitlines()[0]})"
        ) from err
    cropped = as_tensor_output(
        _kcall(generate, short_context, prompt[2:3].clone(), 4, eos_token_id=eos, temperature=0.0, what=name), name
    )
    want = _greedy_reference(short_context, prompt[2:3], 4, eos)
    if cropped.shape != want.shape or not torch.equal(cropped, want):
        fail(
            f"{name} on a model with n_ctx = 4 returned {cropped.tolist()}, expected {want.tolist()}: once the "
            "sequence is longer than n_ctx, the model sees its LAST n_ctx tokens, tokens[:, -n_ctx:]."
        )
    # The frequency penalty counts the prompt too: 2 three times in it turns the argmax after 1 from 2 into 4.
    penalised = as_tensor_output(
        _kcall(
            generate, model, torch.tensor([[2, 2, 2, 1]]), 1, eos_token_id=eos, temperature=0.0,
            frequency_penalty=1.5, what=f"{name}(..., frequency_penalty=1.5)",
        ),
        name,
    )  # fmt: skip
    if penalised[0, -1].item() != 4:
        fail(
            f"{name}(model, [[2, 2, 2, 1]], 1, temperature=0, frequency_penalty=1.5) chose {penalised[0, -1].item()}, "
            "expected 4: the penalty counts every token of the sequence so far, the prompt's included (token 2, "
            "three times in the prompt, loses 4.5 and falls below token 4); pass the whole sequence to "
            "sample_next_token, with the sampling options."
        )
    _generate_matches_hf(generate, name)
    g = torch.Generator().manual_seed(0)
    sampled = as_tensor_output(
        _kcall(generate, model, prompt[1:].clone(), 4, eos_token_id=eos, temperature=1.0, generator=g, what=name), name
    )
    if sampled.shape != (2, 7) or (sampled < 0).any() or (sampled >= d_vocab).any():
        fail(f"{name} with temperature 1 returned {sampled.tolist()}: expected 2 rows of 7 valid token ids.")
    print(f"{name} passed: greedy rows stop at <|endoftext|> one by one, and match GPT2LMHeadModel.generate.")


def _hf_reference_model():
    from transformers import GPT2LMHeadModel

    from harness.reference import load_reference_gpt2, reference_checkpoint

    reference = load_reference_gpt2()
    return reference, GPT2LMHeadModel.from_pretrained(reference_checkpoint(), dtype="float32").eval()


def _hf_greedy(hf, prompt: Tensor, **kwargs) -> Tensor:
    """`hf.generate` without sampling, 8 new tokens, <|endoftext|> as end and padding; quiet."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=50256,
            pad_token_id=50256,
            **kwargs,
        )


def _generate_matches_hf(generate, name: str) -> None:
    reference, hf = _hf_reference_model()
    prompt = reference.to_tokens("O Romeo, Romeo,").repeat(2, 1)
    want = _hf_greedy(hf, prompt)
    with torch.no_grad():
        got = as_tensor_output(
            _kcall(generate, reference, prompt.clone(), 8, eos_token_id=50256, temperature=0.0, what=name), name
        )
    if got.shape != want.shape or not torch.equal(got, want):
        fail(
            f"{name} with temperature 0 on the reference model differs from GPT2LMHeadModel.generate(do_sample="
            f"False): got {got[:, prompt.shape[1] :].tolist()}, expected {want[:, prompt.shape[1] :].tolist()}."
        )


# --------------------------------------------------------------------------------------------------------------------
# Beam search
# --------------------------------------------------------------------------------------------------------------------


def _exhaustive(model, prompt: Tensor, max_new: int, eos: int) -> tuple[list[int], float]:
    """The continuation with the highest summed log-probability over every sequence (ending at eos or max_new)."""
    best, best_score = None, -math.inf
    d_vocab = model.cfg.d_vocab
    for length in range(1, max_new + 1):
        for seq in itertools.product(range(d_vocab), repeat=length):
            if any(t == eos for t in seq[:-1]) or (length < max_new and seq[-1] != eos):
                continue
            tokens = torch.cat([prompt[0], torch.tensor(seq)])
            log_probs = model(tokens[None])[0].log_softmax(-1)
            score = sum(log_probs[prompt.shape[1] - 1 + i, t].item() for i, t in enumerate(seq))
            if score > best_score:
                best, best_score = list(seq), score
    return best, best_score


def _trap_table() -> Tensor:
    """From token 0, token 1 is likeliest, but every continuation of 1 is unlikely, while 2 -> 3 is near-certain.

    No two probabilities of a row are equal and no two three-token sequences tie, so greedy and beam search have
    one answer each.
    """
    probs = torch.full((5, 5), 1e-3)
    probs[0] = torch.tensor([1e-3, 0.5, 0.4, 0.06, 0.04])
    probs[1] = torch.tensor([0.26, 0.25, 0.24, 0.23, 2e-2])
    probs[2] = torch.tensor([1e-3, 2e-3, 3e-3, 0.99, 4e-3])
    probs[3] = torch.tensor([0.31, 0.22, 0.2, 0.1, 0.17])  # 0.4 * 0.99 * 0.31 beats 0.5 * 0.24 * 0.99 clearly
    probs[4] = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2])
    return (probs / probs.sum(-1, keepdim=True)).log()


def _completes_ngram(seq: list[int], token: int, n: int) -> bool:
    """Whether `token` after `seq` repeats an n-gram that `seq` already holds."""
    if len(seq) < n - 1:
        return False
    prefix = tuple(seq[len(seq) - n + 1 :]) if n > 1 else ()
    return any(tuple(seq[i : i + n - 1]) == prefix and seq[i + n - 1] == token for i in range(len(seq) - n + 1))


def _beam_reference(model, prompt: list[int], num_beams: int, max_new: int, ngram: int, eos: int) -> list[int]:
    """Beam search as the exercise states it: summed log-probabilities, the best 2 * num_beams candidates per step,
    <|endoftext|> moves a beam to the finished ones, n-gram bans; the best of finished and live at the end."""
    live, finished = [(0.0, list(prompt))], []
    for _ in range(max_new):
        candidates = []
        for score, seq in live:
            log_probs = model(torch.tensor([seq]))[0, -1].log_softmax(-1).tolist()
            for token, lp in enumerate(log_probs):
                if ngram and _completes_ngram(seq, token, ngram):
                    continue
                candidates.append((score + lp, seq + [token]))
        candidates.sort(key=lambda c: -c[0])
        live = []
        for score, seq in candidates[: 2 * num_beams]:
            (finished if seq[-1] == eos else live).append((score, seq))
            if len(live) == num_beams:
                break
        if not live:
            break
    return max(finished + live, key=lambda beam: beam[0])[1][len(prompt) :]


def beam_search_test(beam_search) -> None:
    """Checks `beam_search(model, tokens [1 pos], num_beams, max_new_tokens, no_repeat_ngram_size=0, eos_token_id)`."""
    name = _name(beam_search, "beam_search")
    eos = 4
    model = ScriptedLM(_trap_table())
    prompt = torch.tensor([[0]])

    def run(num_beams, max_new, ngram=0, m=model, p=prompt, eos_id=eos):
        out = _kcall(
            beam_search,
            m,
            p.clone(),
            num_beams,
            max_new,
            no_repeat_ngram_size=ngram,
            eos_token_id=eos_id,
            what=f"{name}(model, tokens, num_beams={num_beams}, max_new_tokens={max_new})",
        )
        out = as_tensor_output(out, name)
        if out.dim() != 2 or out.shape[0] != 1 or not torch.equal(out[:, : p.shape[1]], p):
            fail(f"{name} must return [1, prompt + new tokens] starting with the prompt; got {out.tolist()}.")
        return out[0, p.shape[1] :].tolist()

    greedy = _greedy_reference(model, prompt, 3, eos)[0, 1:].tolist()
    got = run(1, 3)
    if got != greedy:
        fail(f"{name} with num_beams=1 must equal greedy decoding {greedy}; got {got}.")
    best, _ = _exhaustive(model, prompt, 3, eos)
    got = run(25, 3)  # 25 >= 5^2 beams: beam search is then exhaustive
    if got != best:
        hint = ""
        if got[:1] == greedy[:1]:
            hint = (
                " It followed the likeliest first token: keep the best `num_beams` candidates among the children "
                "of every beam, not only the best parent's."
            )
        fail(
            f"{name} with enough beams to be exhaustive must find {best} (highest summed log-probability); got "
            f"{got}.{hint}"
        )
    # 40 steps of probabilities near 1/50 multiply to ~1e-68: zero in float32, so products cannot rank the beams.
    flat = torch.zeros(50, 50)
    flat[torch.arange(50), (torch.arange(50) * 7 + 3) % 50] = 0.3
    long_model = ScriptedLM(flat)
    want = _greedy_reference(long_model, torch.tensor([[1]]), 40, 49)[0, 1:].tolist()
    got = run(2, 40, m=long_model, p=torch.tensor([[1]]), eos_id=49)
    if got != want:
        fail(
            f"{name} over 40 steps differs from the best sequence ({want[:6]}...): products of probabilities "
            "underflow to 0 in float32; add log-probabilities instead."
        )
    loop = torch.full((6, 6), -4.0)
    for a, b in ((0, 1), (1, 0), (2, 3), (3, 2)):
        loop[a, b] = 3.0
    loop[0, 2] = loop[1, 2] = 1.0
    loop_model = ScriptedLM(loop)
    got = run(2, 8, ngram=2, m=loop_model, p=torch.tensor([[0]]), eos_id=5)
    seq = [0] + got
    bigrams = list(itertools.pairwise(seq))
    if len(bigrams) != len(set(bigrams)):
        fail(
            f"{name} with no_repeat_ngram_size=2 repeated a 2-gram: {seq}. Ban any token that would complete an "
            "n-gram already in the sequence (its logit -> -inf) before choosing."
        )
    # <|endoftext|> in the middle of the vocabulary: the trap's tokens renamed so that eos is id 2, not the largest
    rename = torch.tensor([0, 1, 3, 4, 2])  # old id -> new id
    renamed = torch.empty(5, 5)
    renamed[rename[:, None], rename[None, :]] = _trap_table()
    renamed_model = ScriptedLM(renamed)
    best, _ = _exhaustive(renamed_model, prompt, 3, 2)
    got = run(25, 3, m=renamed_model, eos_id=2)
    if got != best:
        fail(
            f"{name} with eos_token_id=2 (ids 3 and 4 are ordinary tokens) and enough beams to be exhaustive must "
            f"find {best}; got {got}. Only eos_token_id itself ends a beam."
        )
    # <|endoftext|> at once is the likeliest sequence: a beam that ends there must be kept and win.
    early = torch.full((5, 5), 0.2)
    early[0] = torch.tensor([0.05, 0.2, 0.5, 0.15, 0.1])
    early_model = ScriptedLM(early.log())
    best, _ = _exhaustive(early_model, prompt, 4, 2)
    got = run(2, 4, m=early_model, eos_id=2)
    if got != best:
        fail(
            f"{name} with eos_token_id=2, where <|endoftext|> right away is the likeliest sequence ({best}), returned "
            f"{got}: a beam that emits eos_token_id is finished, and the finished beams compete with the live ones."
        )
    # Summed, not averaged: <|endoftext|> at once (0.4) beats 1 -> 3 -> eos (0.35 * 0.9 * 0.9 = 0.28), though the
    # longer one has the better mean log-probability per token.
    mean_trap = torch.full((5, 5), 0.025)
    mean_trap[0] = torch.tensor([0.05, 0.35, 0.4, 0.1, 0.1])
    mean_trap[1] = torch.tensor([0.025, 0.025, 0.025, 0.9, 0.025])
    mean_trap[3] = torch.tensor([0.025, 0.025, 0.9, 0.025, 0.025])
    mean_model = ScriptedLM(mean_trap.log())
    best, _ = _exhaustive(mean_model, prompt, 3, 2)
    got = run(3, 3, m=mean_model, eos_id=2)
    if got == [1, 3, 2] and best != got:
        fail(
            f"{name} returned {got}, whose mean log-probability per token is the best, where the summed "
            f"log-probability ranks {best} first: rank beams by their summed log-probability (no length "
            "normalisation; transformers' length_penalty=0)."
        )
    if got != best:
        fail(f"{name} with eos_token_id=2 and 3 beams returned {got}; the likeliest sequence is {best}.")
    # A model that repeats its last token: every n-gram ban bites, from the first step where one can.
    echo = torch.full((6, 6), -2.0) + torch.arange(6) * 0.1
    echo[torch.arange(6), torch.arange(6)] = 4.0
    echo[:, 5] = -10.0  # <|endoftext|> (5) unlikely: the beams run to max_new_tokens
    echo_model = ScriptedLM(echo)
    for ngram, max_new in ((1, 4), (2, 9), (3, 9)):
        got = run(2, max_new, ngram=ngram, m=echo_model, p=torch.tensor([[0]]), eos_id=5)
        seq = [0] + got
        grams = [tuple(seq[i : i + ngram]) for i in range(len(seq) - ngram + 1)]
        repeated = [g for g in grams if grams.count(g) > 1]
        if repeated:
            fail(
                f"{name} with no_repeat_ngram_size={ngram} on a model that repeats its last token returned {seq}: "
                f"the {ngram}-gram {list(repeated[0])} occurs twice. Every n-gram of the sequence so far (prompt "
                "included, the newest one too) bans the token that would complete it again."
            )
        want = [0] + _beam_reference(echo_model, [0], 2, max_new, ngram, 5)
        if seq != want:
            step = next(i for i, (a, b) in enumerate(zip(seq + [None], want + [None])) if a != b)
            allowed = want[step] is not None and not _completes_ngram(seq[:step], want[step], ngram)
            fail(
                f"{name} with no_repeat_ngram_size={ngram} returned {seq}, expected {want}: they part at position "
                f"{step}"
                + (
                    f", where {want[step]} completes no earlier {ngram}-gram and so is allowed: a token was banned "
                    "that no n-gram of the sequence bans."
                    if allowed
                    else "."
                )
            )
    reference, hf = _hf_reference_model()
    for text in ("O Romeo, Romeo,", "KING.\nWhat"):
        prompt = reference.to_tokens(text)
        # length_penalty=0: transformers then ranks beams by their summed log-probability, as the exercise does.
        want = _hf_greedy(hf, prompt, num_beams=3, length_penalty=0.0, early_stopping=True)[0, prompt.shape[1] :]
        want = want.tolist()
        with torch.no_grad():
            got = run(3, 8, m=reference, p=prompt, eos_id=50256)
        if got != want:
            fail(
                f"{name} with 3 beams on the reference model differs from GPT2LMHeadModel.generate(num_beams=3): "
                f"got {got}, expected {want}."
            )
    print(
        f"{name} passed: width 1 is greedy, enough beams is exhaustive, log-probabilities add, no repeated n-grams, "
        "and 3 beams match transformers' beam search."
    )
