"""Checks and reference models for the Transformer-from-Scratch course.

A learner imports only what is listed in `__all__`.
"""

from harness._assertions import learner_facing as _learner_facing
from harness.attention_checks import (
    attention_pattern_test,
    attention_scores_test,
    causal_mask_test,
    project_heads_test,
    weighted_values_test,
)
from harness.checks import load_gpt2_test, rand_float_test, rand_int_test
from harness.config import Config, EncoderDecoderConfig
from harness.course import components, yours_or_course
from harness.embedding_checks import sinusoidal_test
from harness.encoder_decoder_checks import (
    decoder_layer_test,
    encoder_decoder_test,
    encoder_layer_test,
    feed_forward_test,
    greedy_decode_test,
    make_batch_test,
    multi_head_attention_test,
    seq2seq_loss_test,
    shared_embedding_test,
)
from harness.gpt2_checks import cross_entropy_test, gelu_new_test, greedy_generate_test, hf_conversion_test
from harness.interp import load_induction_model, show_attention, to_hooked_transformer
from harness.interp_checks import (
    cache_activations_test,
    composition_test,
    head_detector_test,
    induction_score_test,
    logit_attribution_test,
    logit_lens_test,
    mean_ablation_test,
    patching_test,
    pattern_test,
    repeated_segments_test,
)
from harness.kv_cache_checks import cached_generate_test, kv_cache_test
from harness.padding_checks import left_pad_test, padded_generate_test, padded_transformer_test
from harness.primer_checks import head_scores_test, merge_heads_test, split_heads_test
from harness.reference import load_reference_gpt2, reference_checkpoint
from harness.sampling_checks import (
    beam_search_test,
    frequency_penalty_test,
    generate_test,
    min_p_test,
    ngram_ban_test,
    repetition_penalty_test,
    sample_next_token_test,
    select_beams_test,
    temperature_test,
    top_k_test,
    top_p_test,
)
from harness.tokenizer import gpt2_encoding, gpt2_tokenizer
from harness.tour_checks import param_count_test
from harness.training_checks import (
    lm_loss_test,
    lr_schedule_test,
    masked_loss_test,
    reversal_floor_test,
    train_addition_test,
    train_test,
    weight_decay_groups_test,
)

__all__ = [
    "Config",
    "EncoderDecoderConfig",
    "attention_pattern_test",
    "attention_scores_test",
    "beam_search_test",
    "cache_activations_test",
    "cached_generate_test",
    "causal_mask_test",
    "components",
    "composition_test",
    "cross_entropy_test",
    "decoder_layer_test",
    "encoder_decoder_test",
    "encoder_layer_test",
    "feed_forward_test",
    "frequency_penalty_test",
    "gelu_new_test",
    "generate_test",
    "gpt2_encoding",
    "gpt2_tokenizer",
    "greedy_decode_test",
    "greedy_generate_test",
    "head_detector_test",
    "head_scores_test",
    "hf_conversion_test",
    "induction_score_test",
    "kv_cache_test",
    "left_pad_test",
    "lm_loss_test",
    "load_gpt2_test",
    "load_induction_model",
    "load_reference_gpt2",
    "logit_attribution_test",
    "logit_lens_test",
    "lr_schedule_test",
    "make_batch_test",
    "masked_loss_test",
    "mean_ablation_test",
    "merge_heads_test",
    "min_p_test",
    "multi_head_attention_test",
    "ngram_ban_test",
    "padded_generate_test",
    "padded_transformer_test",
    "param_count_test",
    "patching_test",
    "pattern_test",
    "project_heads_test",
    "rand_float_test",
    "rand_int_test",
    "reference_checkpoint",
    "repeated_segments_test",
    "repetition_penalty_test",
    "reversal_floor_test",
    "sample_next_token_test",
    "select_beams_test",
    "seq2seq_loss_test",
    "shared_embedding_test",
    "show_attention",
    "sinusoidal_test",
    "split_heads_test",
    "temperature_test",
    "to_hooked_transformer",
    "top_k_test",
    "top_p_test",
    "train_addition_test",
    "train_test",
    "weight_decay_groups_test",
    "weighted_values_test",
    "yours_or_course",
]

# Every public check hides the harness's own frames and names an unfinished exercise (see `learner_facing`).
for _name in __all__:
    if _name.endswith("_test"):
        globals()[_name] = _learner_facing(globals()[_name])
del _name
