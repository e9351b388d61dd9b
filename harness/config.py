"""The model configurations shared by the learner's modules and the checks (GPT-2's and the encoder-decoder's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Config:
    """Hyperparameters of a GPT-2-architecture model; the defaults are GPT-2 small's."""

    d_model: int = 768
    debug: bool = True
    layer_norm_eps: float = 1e-5
    d_vocab: int = 50257
    init_range: float = 0.02
    n_ctx: int = 1024
    d_head: int = 64
    d_mlp: int = 3072
    n_heads: int = 12
    n_layers: int = 12

    @classmethod
    def from_reference(cls, model) -> Config:
        """The `Config` that matches a TransformerLens `HookedTransformer` (e.g. the course's reference)."""
        c = model.cfg
        return cls(
            d_model=c.d_model,
            layer_norm_eps=c.eps,
            d_vocab=c.d_vocab,
            init_range=c.initializer_range,
            n_ctx=c.n_ctx,
            d_head=c.d_head,
            d_mlp=c.d_mlp,
            n_heads=c.n_heads,
            n_layers=c.n_layers,
        )

    def to_transformer_lens(self):
        """The equivalent TransformerLens `HookedTransformerConfig` (GPT-2: LayerNorm, tanh GELU, learned positions)."""
        import torch
        from transformer_lens import HookedTransformerConfig

        return HookedTransformerConfig(
            d_model=self.d_model,
            d_head=self.d_head,
            n_heads=self.n_heads,
            d_mlp=self.d_mlp,
            n_layers=self.n_layers,
            n_ctx=self.n_ctx,
            d_vocab=self.d_vocab,
            eps=self.layer_norm_eps,
            act_fn="gelu_new",
            normalization_type="LN",
            positional_embedding_type="standard",
            init_weights=False,
            default_prepend_bos=False,
            device="cpu",
            dtype=torch.float32,
        )


@dataclass
class EncoderDecoderConfig:
    """Hyperparameters of an encoder-decoder Transformer; the defaults are the paper's base model (EN-DE)."""

    d_model: int = 512
    n_heads: int = 8
    d_head: int = 64
    d_ff: int = 2048
    n_layers: int = 6  # in the encoder, and again in the decoder
    d_vocab: int = 37000  # one BPE vocabulary shared by source and target
    n_ctx: int = 256  # rows of the sinusoidal table: the longest sequence the model can take
    layer_norm_eps: float = 1e-5
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
