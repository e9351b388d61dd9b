"""Checks and reference models for the Transformer-from-Scratch course.

A learner imports only what is listed in `__all__`.
"""

from harness._assertions import learner_facing as _learner_facing
from harness.attention_checks import causal_mask_test
from harness.checks import load_gpt2_test, rand_float_test, rand_int_test
from harness.config import Config
from harness.course import components
from harness.embedding_checks import sinusoidal_test
from harness.gpt2_checks import cross_entropy_test, gelu_new_test, greedy_generate_test, hf_conversion_test
from harness.kv_cache_checks import cached_generate_test, kv_cache_test
from harness.primer_checks import head_scores_test, merge_heads_test, split_heads_test
from harness.reference import load_reference_gpt2, reference_checkpoint
from harness.sampling_checks import (
    beam_search_test,
    frequency_penalty_test,
    generate_test,
    sample_next_token_test,
    temperature_test,
    top_k_test,
    top_p_test,
)
from harness.tokenizer import gpt2_encoding, gpt2_tokenizer
from harness.tour_checks import param_count_test
from harness.training_checks import lm_loss_test, masked_loss_test, reversal_floor_test, train_test

__all__ = [
    "Config",
    "beam_search_test",
    "cached_generate_test",
    "causal_mask_test",
    "components",
    "cross_entropy_test",
    "frequency_penalty_test",
    "gelu_new_test",
    "generate_test",
    "gpt2_encoding",
    "gpt2_tokenizer",
    "greedy_generate_test",
    "head_scores_test",
    "hf_conversion_test",
    "kv_cache_test",
    "lm_loss_test",
    "load_gpt2_test",
    "load_reference_gpt2",
    "masked_loss_test",
    "merge_heads_test",
    "param_count_test",
    "rand_float_test",
    "rand_int_test",
    "reference_checkpoint",
    "reversal_floor_test",
    "sample_next_token_test",
    "sinusoidal_test",
    "split_heads_test",
    "temperature_test",
    "top_k_test",
    "top_p_test",
    "train_test",
]

# Every public check hides the harness's own frames and names an unfinished exercise (see `learner_facing`).
for _name in __all__:
    if _name.endswith("_test"):
        globals()[_name] = _learner_facing(globals()[_name])
del _name
