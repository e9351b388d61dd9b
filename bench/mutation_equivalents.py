"""Surviving mutants that compute what the solution computes, each with the reason (reviewed here, in one place).

`bench/mutation_score.py` counts a survivor as equivalent only when an entry here matches its exercise (grade id)
and its changed line, before and after (whitespace stripped), and the operator when one is given. Any other survivor
is a blind spot of the check: change the check so that it fails the mutant, do not add it here.
"""

from __future__ import annotations

# Reasons shared by several entries.
LAST_AXIS_OF_2D = "on a [batch, d_vocab] tensor dim=+1 and dim=-1 are the same axis"
LAST_TWO_OF_4D = "on a 4-dimensional tensor axis +2 is axis -2"
SIZE_ONE = "the axis indexed has size 1 (gather with index[..., None]): [..., 0] and [..., -1] are the same element"
KEY_BIAS = (
    "a key bias adds q . b_K to every score of one query, the same for all its keys, and the softmax over the keys "
    "is unchanged by a constant: the attention pattern, and so the output, do not depend on the sign of b_K"
)
ONE_TUPLE = "a forward pre-hook's `inputs` here is a 1-tuple: inputs[0] and inputs[-1] are the same tensor"
SMALL_INT_IS = "CPython caches small ints: `is` and `==` agree for the ids and counts these checks use"

EQUIVALENTS: list[dict] = [
    # 03 attention
    {"exercise": "apply_causal_mask", "before": "query_pos, key_pos = attn_scores.shape[-2:]",
     "after": "query_pos, key_pos = attn_scores.shape[+2:]", "why": LAST_TWO_OF_4D},
    {"exercise": "attention",
     "before": 'k = einops.einsum(x, self.W_K, "batch pos d_model, n_heads d_model d_head -> batch pos n_heads d_head") + self.b_K',
     "after": 'k = einops.einsum(x, self.W_K, "batch pos d_model, n_heads d_model d_head -> batch pos n_heads d_head") - self.b_K',
     "why": KEY_BIAS},
    # 05
    {"exercise": "convert_hf_gpt2_state_dict", "before": 'bs = hf[h + "attn.c_attn.bias"].split(cfg.n_heads * cfg.d_head, dim=0)',
     "after": 'bs = hf[h + "attn.c_attn.bias"].split(cfg.n_heads * cfg.d_head, dim= -1)',
     "why": "the fused bias is 1-dimensional: dim=0 and dim=-1 are its only axis"},
    {"exercise": "cross_entropy_loss", "before": "correct = log_probs.gather(dim=-1, index=tokens[:, 1:, None])[..., 0]  # [batch pos-1]",
     "after": "correct = log_probs.gather(dim=-1, index=tokens[:, 1:, None])[..., -1]  # [batch pos-1]", "why": SIZE_ONE},
    {"exercise": "greedy_generate", "before": "next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # [batch 1]",
     "after": "next_token = logits[:, -1].argmax(dim=+1, keepdim=True)  # [batch 1]", "why": LAST_AXIS_OF_2D},
    # 06
    {"exercise": "masked_lm_loss", "before": "correct = log_probs.gather(dim=-1, index=tokens[:, 1:, None])[..., 0]",
     "after": "correct = log_probs.gather(dim=-1, index=tokens[:, 1:, None])[..., -1]", "why": SIZE_ONE},
    {"exercise": "reversal_loss_floor", "before": "unpredictable = seq_len // 2 - 1", "after": "unpredictable = seq_len / 2 - 1",
     "why": "reversal_data makes a half and its mirror, an even length: for the even seq_len the exercise uses, seq_len // 2 == seq_len / 2"},
    *[
        {"exercise": "train_addition",
         "before": "tokens, loss_mask = addition_data(args.batch_size, n_digits, seed=args.seed + 1 + step)",
         "after": f"tokens, loss_mask = addition_data(args.batch_size, n_digits, seed={seed})",
         "why": "any seed per step that differs from step to step draws fresh problems: which seeds is the learner's "
                "choice (the check judges the trained model, not the data order)"}
        for seed in ("args.seed - 1 + step", "args.seed + 1 - step", "args.seed + 2 + step", "args.seed + 0 + step")
    ],
    # 07
    {"exercise": "apply_temperature", "before": "best = logits.argmax(dim=-1, keepdim=True)  # [batch 1]",
     "after": "best = logits.argmax(dim=+1, keepdim=True)  # [batch 1]", "why": LAST_AXIS_OF_2D},
    {"exercise": "apply_temperature", "before": 'return torch.full_like(logits, float("-inf")).scatter(-1, best, logits.gather(-1, best))',
     "after": 'return torch.full_like(logits, float("-inf")).scatter(+1, best, logits.gather(-1, best))', "why": LAST_AXIS_OF_2D},
    {"exercise": "apply_temperature", "before": 'return torch.full_like(logits, float("-inf")).scatter(-1, best, logits.gather(-1, best))',
     "after": 'return torch.full_like(logits, float("-inf")).scatter(-1, best, logits.gather(+1, best))', "why": LAST_AXIS_OF_2D},
    {"exercise": "apply_temperature", "before": "if temperature == 0:", "after": "if temperature <= 0:",
     "why": "a temperature is 0 (greedy) or positive; the exercise defines nothing for negative ones"},
    {"exercise": "top_k_filter", "before": "k = min(k, logits.shape[-1])", "after": "k = min(k, logits.shape[+1])", "why": LAST_AXIS_OF_2D},
    {"exercise": "top_k_filter", "before": "threshold = logits.topk(k, dim=-1).values[:, -1:]  # [batch 1]",
     "after": "threshold = logits.topk(k, dim=+1).values[:, -1:]  # [batch 1]", "why": LAST_AXIS_OF_2D},
    {"exercise": "top_p_filter", "before": "sorted_logits, order = logits.sort(dim=-1, descending=True)  # [batch d_vocab] each",
     "after": "sorted_logits, order = logits.sort(dim=+1, descending=True)  # [batch d_vocab] each", "why": LAST_AXIS_OF_2D},
    {"exercise": "top_p_filter", "before": "probs = sorted_logits.softmax(dim=-1)", "after": "probs = sorted_logits.softmax(dim=+1)",
     "why": LAST_AXIS_OF_2D},
    {"exercise": "top_p_filter", "before": "mass_before = probs.cumsum(dim=-1) - probs", "after": "mass_before = probs.cumsum(dim=+1) - probs",
     "why": LAST_AXIS_OF_2D},
    {"exercise": "top_p_filter", "before": "remove = remove_sorted.scatter(-1, order, remove_sorted)  # back to vocabulary order",
     "after": "remove = remove_sorted.scatter(+1, order, remove_sorted)  # back to vocabulary order", "why": LAST_AXIS_OF_2D},
    {"exercise": "top_p_filter", "before": "remove_sorted = mass_before >= p", "after": "remove_sorted = mass_before > p",
     "why": "differs only where a float32 cumulative softmax mass equals p to the last bit, which no input can be "
            "relied on to produce (the softmax rounds); the checks avoid exact ties"},
    {"exercise": "min_p_filter", "before": "probs = logits.softmax(dim=-1)  # [batch d_vocab]",
     "after": "probs = logits.softmax(dim=+1)  # [batch d_vocab]", "why": LAST_AXIS_OF_2D},
    {"exercise": "min_p_filter", "before": "threshold = min_p * probs.amax(dim=-1, keepdim=True)  # [batch 1]",
     "after": "threshold = min_p * probs.amax(dim=+1, keepdim=True)  # [batch 1]", "why": LAST_AXIS_OF_2D},
    {"exercise": "min_p_filter",
     "before": "always_kept = probs.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=-1).indices  # [batch k]",
     "after": "always_kept = probs.topk(min(min_tokens_to_keep, logits.shape[+1]), dim=-1).indices  # [batch k]",
     "why": LAST_AXIS_OF_2D},
    {"exercise": "min_p_filter",
     "before": "always_kept = probs.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=-1).indices  # [batch k]",
     "after": "always_kept = probs.topk(min(min_tokens_to_keep, logits.shape[-1]), dim=+1).indices  # [batch k]",
     "why": LAST_AXIS_OF_2D},
    {"exercise": "min_p_filter", "before": "remove = remove.scatter(-1, always_kept, False)",
     "after": "remove = remove.scatter(+1, always_kept, False)", "why": LAST_AXIS_OF_2D},
    {"exercise": "apply_repetition_penalty",
     "before": "seen = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, tokens, True)  # [batch d_vocab]",
     "after": "seen = torch.zeros_like(logits, dtype=torch.bool).scatter(+1, tokens, True)  # [batch d_vocab]",
     "why": LAST_AXIS_OF_2D},
    {"exercise": "apply_repetition_penalty",
     "before": "penalised = torch.where(logits < 0, logits * penalty, logits / penalty)",
     "after": "penalised = torch.where(logits <= 0, logits * penalty, logits / penalty)",
     "why": "differs only at a logit of exactly 0, where 0 * penalty and 0 / penalty are both 0"},
    {"exercise": "k_composition_scores", "before": "return product.norm(dim=(-2, -1)) / norms",
     "after": "return product.norm(dim=(+2, -1)) / norms", "why": LAST_TWO_OF_4D},
    {"exercise": "apply_frequency_penalty",
     "before": "counts = torch.zeros_like(logits).scatter_add_(-1, tokens, torch.ones_like(tokens, dtype=logits.dtype))",
     "after": "counts = torch.zeros_like(logits).scatter_add_(+1, tokens, torch.ones_like(tokens, dtype=logits.dtype))",
     "why": LAST_AXIS_OF_2D},
    {"exercise": "sample_next_token",
     "before": "return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]",
     "after": "return torch.multinomial(logits.softmax(dim=-1), num_samples= 2, generator=generator)[:, 0]",
     "why": "the first of two draws without replacement has the same distribution as one draw"},
    {"exercise": "sample_next_token",
     "before": "return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]",
     "after": "return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, -1]", "why": SIZE_ONE},
    {"exercise": "sample_next_token",
     "before": "return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)[:, 0]",
     "after": "return torch.multinomial(logits.softmax(dim=+1), num_samples=1, generator=generator)[:, 0]", "why": LAST_AXIS_OF_2D},
    {"exercise": "beam_search", "operator": "ReplaceBreakWithContinue", "before": "break", "after": "continue",
     "why": "the two `break`s whose `continue` survives: after a -inf candidate every later one is -inf too (the "
            "candidates are sorted), so skipping them all is the same; and `live` is empty only when every candidate "
            "was -inf, after which every later step has none either"},
    {"exercise": "beam_search", "before": "live = [(0.0, tokens[0])]  # (summed log-probability, tokens)",
     "after": "live = [( 1.0, tokens[0])]  # (summed log-probability, tokens)",
     "why": "a constant added to every beam's score changes no ranking and the function returns tokens, not scores"},
    {"exercise": "beam_search", "before": "live = [(0.0, tokens[0])]  # (summed log-probability, tokens)",
     "after": "live = [( -1.0, tokens[0])]  # (summed log-probability, tokens)",
     "why": "a constant added to every beam's score changes no ranking and the function returns tokens, not scores"},
    {"exercise": "beam_search", "before": "live = [(0.0, tokens[0])]  # (summed log-probability, tokens)",
     "after": "live = [(0.0, tokens[ -1])]  # (summed log-probability, tokens)", "why": "tokens is [1, pos]: row 0 is row -1"},
    {"exercise": "beam_search",
     "before": "top = scores.flatten().topk(min(2 * num_beams, scores.numel()))  # the best of all n_live * d_vocab",
     "after": "top = scores.flatten().topk(min( 3 * num_beams, scores.numel()))  # the best of all n_live * d_vocab",
     "why": "at most one candidate per live beam ends in eos, so the best 2 * num_beams always hold num_beams live "
            "ones and the loop stops before any third num_beams is read"},
    {"exercise": "beam_search",
     "before": "top = scores.flatten().topk(min(2 * num_beams, scores.numel()))  # the best of all n_live * d_vocab",
     "after": "top = scores.flatten().topk(min( 1 * num_beams, scores.numel()))  # the best of all n_live * d_vocab",
     "why": "a beam dropped for lack of candidates ranks below an eos candidate that was kept; scores only fall as "
            "beams grow, so nothing it could become beats that finished beam: the returned sequence is the same"},
    {"exercise": "beam_search", "before": "log_probs = model(batch[:, -model.cfg.n_ctx :])[:, -1].log_softmax(dim=-1)  # [n_live d_vocab]",
     "after": "log_probs = model(batch[:, -model.cfg.n_ctx :])[:, -1].log_softmax(dim=+1)  # [n_live d_vocab]", "why": LAST_AXIS_OF_2D},
    {"exercise": "beam_search", "before": "d_vocab = scores.shape[-1]", "after": "d_vocab = scores.shape[+1]", "why": LAST_AXIS_OF_2D},
    {"exercise": "beam_search", "before": "if len(new_live) == num_beams:", "after": "if len(new_live) >= num_beams:",
     "why": "new_live grows by one at a time from 0, so it reaches num_beams before it could pass it"},
    {"exercise": "beam_search", "before": "if len(new_live) == num_beams:", "after": "if len(new_live) is num_beams:", "why": SMALL_INT_IS},
    {"exercise": "beam_search", "before": "if token == eos_token_id:", "after": "if token is eos_token_id:", "why": SMALL_INT_IS},
    *[
        {"exercise": "beam_search", "before": 'if score == float("-inf"):', "after": after,
         "why": "a -inf candidate kept as a live beam can never win against a finite one, and its children are -inf: "
                "the `break` there only saves work"}
        for after in ('if score is float("-inf"):', 'if score < float("-inf"):', 'if score <= float("-inf"):')
    ],
    {"exercise": "kv_cache_transformer", "before": "offset = 0 if past_kvs is None else past_kvs[0][0].shape[1]",
     "after": "offset = 0 if past_kvs is None else past_kvs[ 1][0].shape[1]",
     "why": "every layer caches the same number of positions: layer 1's cache length is layer 0's"},
    {"exercise": "kv_cache_transformer", "before": "offset = 0 if past_kvs is None else past_kvs[0][0].shape[1]",
     "after": "offset = 0 if past_kvs is None else past_kvs[ -1][0].shape[1]",
     "why": "every layer caches the same number of positions: the last layer's cache length is layer 0's"},
    {"exercise": "kv_cache_transformer", "before": "offset = 0 if past_kvs is None else past_kvs[0][0].shape[1]",
     "after": "offset = 0 if past_kvs is None else past_kvs[0][ 1].shape[1]",
     "why": "keys and values are cached with the same shape: the values' length is the keys'"},
    {"exercise": "kv_cache_transformer", "before": "offset = 0 if past_kvs is None else past_kvs[0][0].shape[1]",
     "after": "offset = 0 if past_kvs is None else past_kvs[0][ -1].shape[1]",
     "why": "keys and values are cached with the same shape: the values' length is the keys'"},
    {"exercise": "beam_search", "before": "if no_repeat_ngram_size > 0:", "after": "if no_repeat_ngram_size != 0:",
     "why": "the two differ only for a negative n-gram size, which means nothing (transformers requires n > 0)"},
    {"exercise": "cached_generate", "before": "if step < max_new_tokens - 1:  # the last token needs no forward of its own",
     "after": "if step != max_new_tokens - 1:  # the last token needs no forward of its own",
     "why": "step runs over range(max_new_tokens): below max_new_tokens - 1 and unequal to it are the same"},
    {"exercise": "cached_generate", "before": "if step < max_new_tokens - 1:  # the last token needs no forward of its own",
     "after": "if step is not max_new_tokens - 1:  # the last token needs no forward of its own",
     "why": "step runs over range(max_new_tokens), and " + SMALL_INT_IS},
    {"exercise": "cached_generate", "before": "next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # [batch 1]",
     "after": "next_token = logits[:, -1].argmax(dim=+1, keepdim=True)  # [batch 1]", "why": LAST_AXIS_OF_2D},
    # 08
    {"exercise": "cache_activations", "before": "cache[name] = inputs[0].detach()", "after": "cache[name] = inputs[ -1].detach()", "why": ONE_TUPLE},
    {"exercise": "cache_activations", "before": "cache[name] = recompute_pattern(attn, inputs[0]).detach()",
     "after": "cache[name] = recompute_pattern(attn, inputs[ -1]).detach()", "why": ONE_TUPLE},
    {"exercise": "recompute_pattern",
     "before": "q, k = q + attn.b_Q[:, None], k + attn.b_K[:, None]  # [batch n_heads pos d_head]: biases broadcast over positions",
     "after": "q, k = q + attn.b_Q[:, None], k - attn.b_K[:, None]  # [batch n_heads pos d_head]: biases broadcast over positions",
     "why": KEY_BIAS},
    {"exercise": "recompute_pattern",
     "before": "scores = q @ k.transpose(-1, -2) / math.sqrt(attn.cfg.d_head)  # [batch n_heads query key]",
     "after": "scores = q @ k.transpose(-1, +2) / math.sqrt(attn.cfg.d_head)  # [batch n_heads query key]",
     "why": LAST_TWO_OF_4D},
    {"exercise": "head_detector_scores",
     "before": "previous = pattern.diagonal(offset=-1, dim1=-2, dim2=-1)  # [batch n_heads query-1]: (q, q-1) for q = 1..",
     "after": "previous = pattern.diagonal(offset=-1, dim1=+2, dim2=-1)  # [batch n_heads query-1]: (q, q-1) for q = 1..",
     "why": LAST_TWO_OF_4D},
    {"exercise": "head_detector_scores", "before": "current = pattern.diagonal(dim1=-2, dim2=-1)[..., 1:]  # [batch n_heads query-1]: (q, q)",
     "after": "current = pattern.diagonal(dim1=+2, dim2=-1)[..., 1:]  # [batch n_heads query-1]: (q, q)", "why": LAST_TWO_OF_4D},
    {"exercise": "induction_scores", "before": "offset=-(seq_len - 1), dim1=-2, dim2=-1", "after": "offset=-(seq_len - 1), dim1=+2, dim2=-1",
     "why": LAST_TWO_OF_4D},
    {"exercise": "mean_ablate_heads", "before": "z[:, :, heads] = z[:, :, heads].mean(dim=0, keepdim=True)",
     "after": "z[:, :, heads] = z[:, :, heads].mean(dim=0, keepdim=False)",
     "why": "the mean over the batch, with or without its size-1 batch axis, broadcasts into z[:, :, heads] the same way"},
    # 09
    {"exercise": "multi_head_attention",
     "before": 'k = einops.einsum(x_kv, self.W_K, "b k m, n m h -> b k n h") + self.b_K  # [batch key n_heads d_head]',
     "after": 'k = einops.einsum(x_kv, self.W_K, "b k m, n m h -> b k n h") - self.b_K  # [batch key n_heads d_head]',
     "why": KEY_BIAS},
    {"exercise": "multi_head_attention", "before": "n_q, n_k = scores.shape[-2:]", "after": "n_q, n_k = scores.shape[+2:]",
     "why": LAST_TWO_OF_4D},
    {"exercise": "greedy_decode", "before": "next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=-1)  # [batch]",
     "after": "next_token = model.decode(tgt, memory, src)[:, -1].argmax(dim=+1)  # [batch]", "why": LAST_AXIS_OF_2D},
]  # fmt: skip
