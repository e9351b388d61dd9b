"""Checks for notebook 00 (a tour of GPT-2): counting the model's parameters from its config."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import numbers
import warnings
from collections.abc import Callable

from harness._assertions import call, fail
from harness.config import Config

__all__ = ["param_count_test"]

# GPT-2 small first (the count the learner compares with), then small configs whose sizes are all different, so
# that each group of parameters has its own size and a wrong count points at one cause: n_heads*d_head != d_model,
# d_mlp != 4*d_model, n_ctx != d_vocab.
TEST_CONFIGS = (
    Config(),
    Config(d_model=12, d_head=5, n_heads=3, d_mlp=20, n_layers=2, n_ctx=9, d_vocab=37),
    Config(d_model=16, d_head=4, n_heads=4, d_mlp=64, n_layers=3, n_ctx=7, d_vocab=101),
    Config(d_model=10, d_head=7, n_heads=2, d_mlp=26, n_layers=5, n_ctx=23, d_vocab=61),
)


@dataclasses.dataclass(frozen=True)
class _Group:
    """Parameter tensors that always have the same number of elements, whichever the config."""

    formula: str  # its size, in the config's field names
    names: tuple[str, ...]  # TransformerLens's names of the tensors (or sets of tensors) of that size
    what: str
    size: Callable[[Config], int]


GROUPS = (
    _Group("d_vocab*d_model", ("W_E", "W_U"), "the embedding/unembedding matrices", lambda c: c.d_vocab * c.d_model),
    _Group("d_vocab", ("b_U",), "the unembedding bias", lambda c: c.d_vocab),
    _Group("n_ctx*d_model", ("W_pos",), "the positional embedding", lambda c: c.n_ctx * c.d_model),
    _Group(
        "n_layers*2*d_model",
        ("ln1.w+ln2.w", "ln1.b+ln2.b"),
        "the blocks' LayerNorm weights/biases",
        lambda c: c.n_layers * 2 * c.d_model,
    ),
    _Group("d_model", ("ln_final.w", "ln_final.b"), "the final LayerNorm's weight/bias", lambda c: c.d_model),
    _Group(
        "n_layers*n_heads*d_model*d_head",
        ("W_Q", "W_K", "W_V", "W_O"),
        "the attention weights",
        lambda c: c.n_layers * c.n_heads * c.d_model * c.d_head,
    ),
    _Group(
        "n_layers*n_heads*d_head",
        ("b_Q", "b_K", "b_V"),
        "the attention's query/key/value biases",
        lambda c: c.n_layers * c.n_heads * c.d_head,
    ),
    _Group(
        "n_layers*d_model", ("b_O", "b_out"), "the biases of attention/MLP outputs", lambda c: c.n_layers * c.d_model
    ),
    _Group("n_layers*d_model*d_mlp", ("W_in", "W_out"), "the MLP weights", lambda c: c.n_layers * c.d_model * c.d_mlp),
    _Group("n_layers*d_mlp", ("b_in",), "the MLP's hidden bias", lambda c: c.n_layers * c.d_mlp),
)


def _biases(c: Config) -> int:
    """b_Q, b_K, b_V, b_O, b_in, b_out in every block, and b_U (LayerNorm biases aside)."""
    return c.n_layers * (3 * c.n_heads * c.d_head + 2 * c.d_model + c.d_mlp) + c.d_vocab


# Mistakes that are not one or two missing groups: a size assumed from GPT-2's usual ratios, or no biases at all.
# Each is (the count it gives, why).
_MISTAKES = (
    (
        lambda c: true_param_count(dataclasses.replace(c, d_mlp=4 * c.d_model)),
        (
            "it matches the count with d_mlp = 4*d_model: use cfg.d_mlp for the MLP's hidden size "
            "(4*d_model is only GPT-2's choice)."
        ),
    ),
    (
        lambda c: true_param_count(dataclasses.replace(c, d_head=c.d_model // c.n_heads)),
        (
            "it matches the count with d_head = d_model // n_heads (or n_heads*d_head = d_model): W_Q, W_K, W_V and "
            "W_O have n_heads*d_model*d_head elements each, and cfg.d_head need not be d_model / n_heads."
        ),
    ),
    (
        lambda c: true_param_count(dataclasses.replace(c, n_layers=1)),
        "it matches the count of a single block: multiply the per-block parameters by cfg.n_layers.",
    ),
    (
        lambda c: true_param_count(c) - _biases(c),
        (
            "it matches the count without the biases b_Q, b_K, b_V, b_O, b_in, b_out and b_U: each Linear-like "
            "map in GPT-2 has a bias, with one number per output feature."
        ),
    ),
    (
        lambda c: true_param_count(c) - _biases(c) - (2 * c.n_layers + 1) * c.d_model,
        (
            "it matches the count without any biases (b_Q, b_K, b_V, b_O, b_in, b_out, b_U and the LayerNorms' b): "
            "each Linear-like map and each LayerNorm in GPT-2 has a bias, with one number per output feature."
        ),
    ),
)


def true_param_count(cfg: Config) -> int:
    """The number of parameters of a TransformerLens GPT-2 with this config (counted, not computed)."""
    return _true_param_count(dataclasses.astuple(cfg))


@functools.cache
def _true_param_count(fields: tuple) -> int:
    import torch
    from transformer_lens import HookedTransformer

    tl_cfg = Config(*fields).to_transformer_lens()
    # On the meta device no memory is allocated: only the shapes are needed.
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")  # TransformerLens's deprecation notice would go to stderr
        model = HookedTransformer(tl_cfg, move_to_device=False)
    return sum(p.numel() for p in model.parameters())


def _explain(deltas: list[tuple[Config, int]]) -> str:
    """The smallest combination of parameter groups, each missing or counted too often, that explains every delta."""
    best = None
    for n_terms in (1, 2, 3):
        for groups in itertools.combinations(GROUPS, n_terms):
            ranges = [[k for k in range(-len(g.names), len(g.names) + 1) if k] for g in groups]
            for coefs in itertools.product(*ranges):
                if all(sum(k * g.size(c) for k, g in zip(coefs, groups)) == d for c, d in deltas):
                    weight = sum(abs(k) for k in coefs)
                    if best is None or weight < best[0]:
                        best = (weight, groups, coefs)
        if best is not None:
            break
    if best is None:
        return (
            f"The difference is not a simple combination of parameter groups: count each group once, {_all_groups()}."
        )
    _, groups, coefs = best
    missing = [_describe(g, k) for g, k in zip(groups, coefs) if k > 0]
    extra = [_describe(g, -k) for g, k in zip(groups, coefs) if k < 0]
    parts = []
    if missing:
        parts.append(f"The count is short by exactly {' + '.join(missing)}: did you leave that out?")
    if extra:
        parts.append(f"The count has {' + '.join(extra)} too many: is that counted twice, or not in GPT-2?")
    if any("W_U" in g.names or "b_U" in g.names for g, k in zip(groups, coefs) if k > 0):
        parts.append(
            "The course's models, like TransformerLens's, keep the unembedding W_U [d_model, d_vocab] as its own "
            "parameter (even where GPT-2 ties it to W_E) and give it a bias b_U [d_vocab]: count both."
        )
    return " ".join(parts)


def _describe(group: _Group, k: int) -> str:
    names = group.names
    if k == len(names):
        which = ", ".join(names)
    elif k == 1:
        which = " or ".join(names)
    else:
        which = f"{k} of {', '.join(names)}"
    size = group.formula if k == 1 else f"{k}*{group.formula}"
    return f"{size} ({which}: {group.what})"


def _all_groups() -> str:
    return "; ".join(f"{', '.join(g.names)}: {g.formula} each" for g in GROUPS)


def _show(cfg: Config) -> str:
    fields = ("d_vocab", "n_ctx", "d_model", "n_layers", "n_heads", "d_head", "d_mlp")
    return "Config(" + ", ".join(f"{f}={getattr(cfg, f)}" for f in fields) + ")"


def param_count_test(count_params) -> None:
    """Check `count_params(cfg) -> int` against the parameter count of TransformerLens models built from configs."""
    if not callable(count_params):
        fail(f"Pass the function itself, count_params, not {type(count_params).__name__} {count_params!r}.")
    results = []
    for cfg in TEST_CONFIGS:
        got = call(count_params, dataclasses.replace(cfg), what=f"count_params({_show(cfg)})")
        if isinstance(got, numbers.Integral) and not isinstance(got, bool):
            got = int(got)  # NumPy integers too
        else:
            kind = f"{type(got).__module__}.{type(got).__name__}"
            hint = ""
            if kind.startswith("torch."):
                hint = " Use .item() to turn a one-element tensor into a number, or count with Python ints."
            elif isinstance(got, float):
                hint = " Use integer arithmetic (* and +, or // rather than /)."
            elif got is None:
                hint = " Did you forget `return`?"
            fail(f"count_params({_show(cfg)}) returned {kind} {got!r}; it must return a Python int.{hint}")
        results.append((cfg, got, true_param_count(cfg)))

    wrong = [(cfg, got, true) for cfg, got, true in results if got != true]
    if not wrong:
        print(f"param_count_test passed: count_params matches the true count on {len(results)} configs.")
        return
    if len({got for _, got, _ in results}) == 1:
        fail(
            f"count_params returned {results[0][1]:,} for every config, e.g. for {_show(results[1][0])}, whose "
            f"model has {results[1][2]:,} parameters: compute the count from the fields of cfg (cfg.d_model, "
            "cfg.n_layers, ...), not from a fixed model."
        )
    cfg, got, true = wrong[0]
    delta = true - got
    off = f"{abs(delta):,} too {'few' if delta > 0 else 'many'}"
    intro = f"count_params({_show(cfg)}) returned {got:,}, but a GPT-2 with that config has {true:,} parameters: {off}."
    if len(wrong) < len(results):
        intro += f" (It is right for {len(results) - len(wrong)} of the {len(results)} test configs.)"
    for mistake, why in _MISTAKES:
        if all(got == mistake(c) for c, got, _ in results):
            fail(f"{intro} The count is off because {why}")
    fail(f"{intro} {_explain([(c, true - got) for c, got, true in wrong])}")
