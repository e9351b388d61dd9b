"""Tools for notebook 08 (interpretability): the shipped induction model, TransformerLens views, offline figures.

- `load_induction_model()`: the 2-layer attention-only model that `python -m harness.train_induction` trains and
  the repository ships, with its training history (loss on the repeated part and induction score per step).
- `to_hooked_transformer(model)`: the same weights in a TransformerLens `HookedTransformer`, for `run_with_cache`
  and `run_with_hooks`.
- `show_attention(pattern, tokens)`: a circuitsvis attention figure with its JavaScript inlined, drawn without
  touching the network.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from harness.config import Config

INDUCTION_MODEL_DIR = Path(__file__).resolve().parent / "induction_model"


def to_hooked_transformer(model: torch.nn.Module):
    """A TransformerLens `HookedTransformer` holding `model`'s weights (a course GPT-2, attention-only or not).

    The course's parameter names are TransformerLens's, so the state dict loads one to one; every parameter must
    be used (only TransformerLens's own buffers, the causal mask and IGNORE, are left to it).
    """
    from transformer_lens import HookedTransformer

    cfg = model.cfg
    attn_only = not any(hasattr(block, "mlp") for block in model.blocks)
    tl_cfg = Config.to_transformer_lens(cfg)
    tl_cfg.attn_only = attn_only
    if attn_only:
        tl_cfg.d_mlp = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TransformerLens's deprecation notice would reach stderr
        hooked = HookedTransformer(tl_cfg, move_to_device=False)
    state_dict = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    missing, unexpected = hooked.load_state_dict(state_dict, strict=False)
    missing = [name for name in missing if not name.endswith(("attn.mask", "attn.IGNORE"))]
    if missing or unexpected:
        raise ValueError(f"Weights do not map one to one: missing {missing}, unexpected {unexpected}.")
    return hooked.eval()


def load_induction_model(model_dir: Path | str | None = None) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """(config fields, state dict, metrics) of the shipped induction model; build it with the notebook's class."""
    from safetensors.torch import load_file

    path = Path(model_dir) if model_dir is not None else INDUCTION_MODEL_DIR
    if not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"No induction model in {path}: run `python -m harness.train_induction`.")
    metrics = json.loads((path / "metrics.json").read_text(encoding="utf-8"))
    return metrics["config"], load_file(path / "model.safetensors"), metrics


class OfflineFigure:
    """A circuitsvis figure that renders its inlined JavaScript: no network probe, no CDN import."""

    def __init__(self, html: str):
        self.html = html

    def _repr_html_(self) -> str:
        return self.html


def show_attention(pattern: torch.Tensor, tokens: list[str], head_names: list[str] | None = None) -> OfflineFigure:
    """circuitsvis's `attention_heads` figure for `pattern [n_heads query key]`, drawn offline.

    circuitsvis decides between inlining its 1.3 MB bundle and importing it from a CDN by probing the internet each
    time a figure is displayed; a CDN import breaks as soon as the notebook is opened without a network. This
    renders the inlined version only, so a saved notebook draws anywhere.
    """
    from circuitsvis.utils.render import render_local

    pattern = pattern.detach().float().cpu()
    if pattern.ndim != 3 or pattern.shape[1] != pattern.shape[2] or pattern.shape[1] != len(tokens):
        raise ValueError(
            f"pattern must be [n_heads query key] with query = key = len(tokens) = {len(tokens)}; "
            f"got {list(pattern.shape)}."
        )
    names = head_names or [f"head {h}" for h in range(pattern.shape[0])]
    return OfflineFigure(
        render_local(
            "AttentionHeads",
            attention=pattern.numpy(),
            tokens=list(tokens),
            attentionHeadNames=names,
            maskUpperTri=True,
        )
    )
