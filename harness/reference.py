"""The reference GPT-2: the real `gpt2-small` when the Hugging Face hub can be had, else the shipped offline model.

Both arrive as a Hugging Face `GPT2LMHeadModel` and go through the same path: TransformerLens's own GPT-2 weight
conversion into a `HookedTransformer`, with no LayerNorm folding and no centering, so that its parameters are
GPT-2's raw weights and a learner's modules can load them one to one.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

OFFLINE_MODEL_DIR = Path(__file__).resolve().parent / "offline_gpt2"
SOURCES = ("auto", "gpt2-small", "offline")
_HUB_REPO = "openai-community/gpt2"
_loaded: dict = {}


def _hub_cached() -> bool:
    from huggingface_hub import try_to_load_from_cache

    return all(
        isinstance(try_to_load_from_cache(_HUB_REPO, filename), str)
        for filename in ("config.json", "model.safetensors")
    )


def _hub_reachable(timeout: float = 2.0) -> bool:
    """One TCP connection attempt to the hub: no retries, so an offline machine decides in seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def hooked_from_hf_gpt2(hf_model, tokenizer, model_name: str):
    """A `HookedTransformer` holding the raw weights of a Hugging Face `GPT2LMHeadModel`."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    hf = hf_model.config
    cfg = HookedTransformerConfig(
        model_name=model_name,
        original_architecture="GPT2LMHeadModel",
        d_model=hf.n_embd,
        d_head=hf.n_embd // hf.n_head,
        n_heads=hf.n_head,
        d_mlp=hf.n_inner or 4 * hf.n_embd,
        n_layers=hf.n_layer,
        n_ctx=hf.n_positions,
        eps=hf.layer_norm_epsilon,
        d_vocab=hf.vocab_size,
        act_fn=hf.activation_function,
        normalization_type="LN",
        positional_embedding_type="standard",
        use_attn_scale=hf.scale_attn_weights,
        scale_attn_by_inverse_layer_idx=hf.scale_attn_by_inverse_layer_idx,
        initializer_range=hf.initializer_range,
        default_prepend_bos=True,
        tokenizer_prepends_bos=False,
        init_weights=False,
        device="cpu",
        dtype=torch.float32,
    )
    state_dict = {k: v.detach().to(torch.float32) for k, v in convert_gpt2_weights(hf_model, cfg).items()}
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    model.load_and_process_state_dict(
        state_dict, fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False
    )
    loaded = model.state_dict()
    for name, tensor in state_dict.items():
        if not torch.equal(loaded[name], tensor):
            raise RuntimeError(f"Reference weight {name} did not load unchanged.")
    return model.eval()


def _load(source: str):
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    from harness.tokenizer import gpt2_tokenizer

    hf_logging.disable_progress_bar()
    if source == "offline":
        if not (OFFLINE_MODEL_DIR / "config.json").exists():
            raise FileNotFoundError(f"The offline reference model is missing from {OFFLINE_MODEL_DIR}.")
        hf_model = GPT2LMHeadModel.from_pretrained(OFFLINE_MODEL_DIR, dtype="float32")
        return hooked_from_hf_gpt2(hf_model, gpt2_tokenizer(add_bos_token=True), "offline-gpt2")
    cached = _hub_cached()
    if not cached and not _hub_reachable():
        raise RuntimeError(
            "The real gpt2-small is not cached and the Hugging Face hub cannot be reached "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', 'unset')}). "
            'Use load_reference_gpt2("offline"), or "auto" to fall back to it.'
        )
    try:
        hf_model = GPT2LMHeadModel.from_pretrained(_HUB_REPO, dtype="float32", local_files_only=cached)
    except OSError as err:
        raise RuntimeError(f"Could not load gpt2-small from the Hugging Face hub: {err}") from err
    return hooked_from_hf_gpt2(hf_model, gpt2_tokenizer(add_bos_token=True), "gpt2-small")


def resolve_source(source: str = "auto") -> str:
    """Which model `source` means on this machine now: "gpt2-small" or "offline"."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, not {source!r}.")
    if source != "auto":
        return source
    for loaded in ("gpt2-small", "offline"):
        if loaded in _loaded:
            return loaded
    return "gpt2-small" if _hub_cached() or _hub_reachable() else "offline"


def reference_checkpoint(source: str = "auto") -> str:
    """Where the reference's weights come from, for `GPT2LMHeadModel.from_pretrained`: the hub's id of GPT-2 small,
    or the folder of the course's offline model (whichever `load_reference_gpt2(source)` loads)."""
    return _HUB_REPO if resolve_source(source) == "gpt2-small" else str(OFFLINE_MODEL_DIR)


def load_reference_gpt2(source: str = "auto"):
    """The course's reference GPT-2 as a TransformerLens `HookedTransformer` (loaded once per process).

    source: "gpt2-small" (the real model, from the Hugging Face hub or its cache), "offline" (the small
    GPT-2-architecture model shipped with the course), or "auto" (the real one when it can be had, else offline).
    """
    resolved = resolve_source(source)
    if resolved not in _loaded:
        if source == "auto" and resolved == "gpt2-small":
            try:
                _loaded[resolved] = _load(resolved)
            except RuntimeError as err:
                print(f"Using the offline reference model: gpt2-small could not be loaded ({err}).")
                resolved = "offline"
        elif source == "auto":
            print("Hugging Face hub unreachable: using the course's offline reference model (a small GPT-2).")
        if resolved not in _loaded:
            _loaded[resolved] = _load(resolved)
    return _loaded[resolved]
