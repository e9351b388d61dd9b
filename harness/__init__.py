"""Checks and reference models for the Transformer-from-Scratch course.

A learner imports only what is listed in `__all__`.
"""

from harness.checks import load_gpt2_test, rand_float_test, rand_int_test
from harness.config import Config
from harness.course import components
from harness.reference import load_reference_gpt2
from harness.tokenizer import gpt2_encoding, gpt2_tokenizer
from harness.tour_checks import *  # noqa: F403
from harness.embedding_checks import *  # noqa: F403
from harness.gpt2_checks import *  # noqa: F403
from harness.training_checks import *  # noqa: F403
from harness import embedding_checks, gpt2_checks, tour_checks, training_checks

__all__ = [
    "Config",
    "components",
    "gpt2_encoding",
    "gpt2_tokenizer",
    "load_gpt2_test",
    "load_reference_gpt2",
    "rand_float_test",
    "rand_int_test",
    *tour_checks.__all__,
    *embedding_checks.__all__,
    *gpt2_checks.__all__,
    *training_checks.__all__,
]
