"""What the judge's probes may not run: for each notebook and exercise, the operators (by family, in every
namespace) and the Python code (torch's own implementations, the course's oracles) it forbids, by any name.

`instructor.judge` hands each probe its rules; the probe child takes the operators out of its process and withdraws
the Python functions while a call runs (`instructor.probe_runner`); the probe templates cover the files those rules
name, so that their source cannot be read and compiled afresh under another name (`instructor.template`).
"""

from __future__ import annotations

from pathlib import Path

# Operators an exercise may not reach while the judge runs it, by any name (the profiler in the probe runner
# records them at the dispatcher: `F.layer_norm`, `torch.native_layer_norm` and `torch.ops.aten.native_layer_norm`
# all run aten::native_layer_norm). notebook -> {target, or "*" for all of its probes: operator names or prefixes}.
# Each a pattern (`*` anywhere) over the whole family of an operator, in every namespace: a layer norm computed
# through a batch norm's kernel (`aten::_batch_norm_with_update` on one row per position) scored full marks while
# only the names a learner would write were listed, and `quantized::layer_norm` on a quantized tensor while only
# `aten::` was ruled on.
_NORMS = (
    "*::*layer_norm*",
    "*::*group_norm*",
    "*::*batch_norm*",
    "*::*instance_norm*",
    "*::*rms_norm*",
)
_ATTENTION = (
    "*::*scaled_dot_product*",
    "*::*multi_head_attention*",
    "*::*flash_attention*",
    "*::*efficient_attention*",
    "*::*cudnn_attention*",
    "*::_fused_sdp_choice",
    "*::_transformer_encoder_layer_fwd",
)
# F.cross_entropy, nn.CrossEntropyLoss and F.nll_loss (cross-entropy's second half) all reach these; so do a KL
# divergence against one-hot targets, a binary cross-entropy over one-hot targets and `Categorical.log_prob`. Every
# loss torch has is refused, not only these: a CTC loss over one time step is a cross-entropy too (it scored full
# marks while only the cross-entropy family was listed), and so is an adaptive softmax with one cluster.
_CROSS_ENTROPY = (
    "*::*loss*",
    # its operator is refused as every operator outside `aten` is (`FOREIGN_OPERATORS`); its Python, here
    "py:torch/nn/modules/linear_cross_entropy.py",
    "py:torch/nn/functional.py:linear_cross_entropy",
    "*::kl_div*",
    "*::binary_cross_entropy*",
    "py:torch/distributions/",
    "py:torch/nn/modules/loss.py",
    "py:torch/nn/modules/adaptive.py",
)
_MHA = ("*::_native_multi_head_attention", "py:torch/nn/functional.py:multi_head_attention_forward")
# The course's oracles: no exercise's probe may run their code (`py:` rules match a Python function's file). The
# harness is one too: its checks hold independent answers (a beam search, a training loop, a sampler). Learner code
# may run only the harness's plain parts: `Config`, the tokenizer and `components` (whose code, compiled from the
# solutions, carries the solutions' file names and is ruled on by notebook, below).
_HARNESS_PLAIN = {"__init__.py", "config.py", "course.py", "tokenizer.py"}
HARNESS_ORACLES = tuple(
    f"py:harness/{path.name}"
    for path in sorted((Path(__file__).resolve().parent.parent / "harness").glob("*.py"))
    if path.name not in _HARNESS_PLAIN
)


def _torch_folders(package: str) -> list[str]:
    """The sub-packages of torch's `package` as installed, found without importing torch."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return []
    top = Path(next(iter(spec.submodule_search_locations))) / package
    return sorted(p.name for p in top.iterdir() if p.is_dir() and (p / "__init__.py").exists()) if top.is_dir() else []


# Torch carries Python implementations of its own operators, made of plain ones, that the dispatcher never sees
# as the operator they implement: reference implementations (`torch._refs`, `torch._prims`), decomposition tables
# (`torch._decomp`, and those of the compilers and exporters), the math fallbacks of higher-order ops (flex
# attention) and the test suite's reference functions. `torch._refs.nn.functional.gelu(x, approximate="tanh")`
# never runs aten::gelu, a decomposed `native_layer_norm` never runs aten::native_layer_norm (both scored full
# marks before this rule). No exercise needs them: every probe is refused them, whatever name reached them. Not
# the utilities that public eager functions call (`torch.broadcast_shapes` runs `torch._refs._broadcast_shapes`,
# `Tensor.dim_order` `torch._prims_common`): of `torch/_refs/__init__.py`, only the norms' implementations.
TORCH_INTERNAL_IMPLEMENTATIONS = (
    *(
        f"py:{package}" if package.endswith(".py") else f"py:{package}/"
        for package in (
            "torch/_refs/nn",
            "torch/_refs/linalg",
            "torch/_refs/special",
            "torch/_prims",
            "torch/_decomp",
            "torch/_inductor",
            # the compilers' parts of functorch, not its public transforms (`torch.vmap`, `torch.func`: honest
            # code, refused before)
            *(
                f"torch/_functorch/{part}"
                for part in (
                    "_aot_autograd",
                    "aot_autograd.py",
                    "compilers.py",
                    "partitioners.py",
                    "compile_utils.py",
                    "fx_minifier.py",
                    "python_key.py",
                    "_activation_checkpointing",
                    "_activation_offloading",
                    "top_operators_github_usage.py",
                )
            ),
            "functorch",
            "torch/_higher_order_ops",
            "torch/nn/attention",
            "torch/_native",
            "torch/export/decomp_utils.py",  # not the rest of the exporters: `torch.vmap` runs torch._export's utils
            "torch/onnx",
            "torch/testing/_internal",  # the test suite's reference functions; `assert_close` stays allowed
            # the quantization toolkit's float reference modules: a multi-head attention written in Python over
            # bmm and softmax (`torch.ao.nn.quantizable.MultiheadAttention`) scored full marks in 03
            "torch/ao",
            # vendored kernels' packages, with reference implementations in Python (`layernorm_rstd_ref`)
            "torch/_vendor/quack",
            # tensor subclasses' Python implementations of aten operators, over other operators: the jagged nested
            # tensor's `native_layer_norm_default` normalises over its ragged dimension with sum, square and sqrt,
            # and one "sequence" per position made it a layer norm that no norm operator ran (full marks in 01,
            # red-team round 21); masked tensors' reductions and normalisations likewise
            "torch/nested/_internal",
            "torch/masked",
            # the Python parts of distributed training, which hold their own losses and softmaxes over plain
            # operators for split tensors: the tensor-parallel cross-entropy, its collectives made the identity on
            # one rank, had full marks in 05 (red-team round 26). Every folder of it, whichever this torch has; not
            # its top-level modules, which honest code reaches (`is_available`, `is_initialized`)
            *(f"torch/distributed/{folder}" for folder in _torch_folders("distributed")),
        )
    ),
    *(
        f"py:torch/_refs/__init__.py:{function}"
        for function in (
            "_normalize",
            "native_layer_norm",
            "native_group_norm",
            "native_batch_norm",
            "softmax",
            "log_softmax",
            "_softmax",
            "_log_softmax",
        )
    ),
)
ORACLES = ("py:transformer_lens/", "py:transformers/", *HARNESS_ORACLES, *TORCH_INTERNAL_IMPLEMENTATIONS)
# Torch's normalisations written in Python over other operators (a local response norm whose window covers every
# feature is a layer norm: full marks in 01 in a red-team batch while only the norm operators were ruled on).
_PYTHON_NORMS = (
    "py:torch/nn/modules/normalization.py",
    *(
        f"py:torch/nn/functional.py:{name}"
        for name in ("local_response_norm", "normalize", "layer_norm", "group_norm", "batch_norm", "instance_norm")
    ),
)
# Operators outside `aten` (and the profiler's own, which `record_function` labels run): torch's compilers, fused
# backends and quantized kernels, and the operators torch's Python libraries register when first used. No exercise
# needs one, and they compute under names no rule on `aten` foresees: `mkldnn::_linear_pointwise(x, w, None,
# "gelu", [], "tanh")` is a tanh GELU (full marks in 04 while only operator names were ruled on), and
# `F.linear_cross_entropy` with `LinearCrossEntropyOptions` runs `torch_nn::_linear_cross_entropy_batch_chunked`,
# a cross-entropy registered only when first called (full marks in 05, red-team round 14). Every probe is refused
# every one of them, registered at any time, but the learner's own (`torch.library.custom_op` in the notebook:
# `probe_runner._is_operator`). A rule `!NAMESPACE,...`: any operator outside those namespaces.
FOREIGN_OPERATORS = "!aten,profiler"
# torch's encoder and decoder layers compute 09's answers in their forwards; the file's helpers do not, and
# `nn.Transformer.generate_square_subsequent_mask`, the causal mask 09's own demonstration builds, failed honest
# attention there while the whole file was ruled on (red-team round 11)
_TRANSFORMER_LAYERS = tuple(
    f"py:torch/nn/modules/transformer.py:{name}" for name in ("forward", "_sa_block", "_mha_block", "_ff_block")
)
FORBIDDEN_OPS: dict[str, dict[str, tuple[str, ...]]] = {
    "01_layernorm": {"*": _NORMS + _PYTHON_NORMS},
    "03_attention": {"*": _ATTENTION + _MHA},
    "04_mlp_and_block": {"gelu_new": ("*::gelu*",)},  # "without F.gelu", says the exercise
    "05_full_gpt2": {"cross_entropy_loss": _CROSS_ENTROPY},  # "without F.cross_entropy"
    # 09's attention is 03's, with masks: refused what 03's is (SDPA scored full marks here while only the
    # Transformer modules were ruled on)
    "09_encoder_decoder": {"*": (*_TRANSFORMER_LAYERS, *_MHA, *_ATTENTION)},
}


# Exercises whose contract is to use TransformerLens (its hooks): its code runs, only its ready-made answers may not.
_CACHE_ANSWERS = tuple(  # ActivationCache's own logit lens and direct logit attribution
    f"py:transformer_lens/ActivationCache.py:{method}"
    for method in (
        "accumulated_resid",
        "decompose_resid",
        "apply_ln_to_stack",
        "logit_attrs",
        "get_full_resid_decomposition",
        "stack_head_results",
        "stack_neuron_results",
    )
)
TL_EXERCISES = {
    ("08_interpretability", "mean_ablate_heads"): ("py:transformer_lens/patching.py",),
    ("08_interpretability", "patch_resid_pre"): ("py:transformer_lens/patching.py",),
    ("08_interpretability", "k_composition_scores"): (
        "py:transformer_lens/HookedTransformer.py:all_composition_scores",
        "py:transformer_lens/utilities/matrix.py:composition_scores",
    ),
    ("08_interpretability", "logit_lens"): _CACHE_ANSWERS,
    ("08_interpretability", "logit_attribution"): _CACHE_ANSWERS,
}


# The probe child withdraws for good, before any learner code runs, everything its probes forbid, so the probes of
# one process must forbid the same (`probe_runner.phases`): every exercise that uses TransformerLens is refused
# every ready-made answer any of them is (none answers with another's: TransformerLens's patching run in the
# composition scores' call, on inputs kept from the patching probe, scored full marks while each call was refused
# its own only), and may run `harness.interp`'s `to_hooked_transformer`, with which the judge's child builds their
# models (it holds no answer).
_TL_ANSWERS = tuple(dict.fromkeys(rule for rules in TL_EXERCISES.values() for rule in rules))
_JUDGE_BUILDS_WITH = "py:harness/interp.py"


def forbidden_ops(notebook: str, target: str) -> tuple[str, ...]:
    """The rules for one probe. Besides the exercise's own, the oracles and the course's answers for this very
    notebook: code compiled from `solutions/<notebook>.ipynb` (`harness.components`, reached by any route) runs
    under that file name, so the record shows it however it was called; earlier notebooks' stay allowed."""
    rules = FORBIDDEN_OPS.get(notebook, {})
    oracles = ORACLES
    if (notebook, target) in TL_EXERCISES:
        oracles = (*(o for o in ORACLES if o not in ("py:transformer_lens/", _JUDGE_BUILDS_WITH)), *_TL_ANSWERS)
    return (
        *oracles,
        f"py:<solutions/{notebook}.ipynb>",
        FOREIGN_OPERATORS,
        *rules.get("*", ()),
        *rules.get(target, ()),
    )


def all_python_paths() -> frozenset[str]:
    """Every file or folder a `py:` rule names, in every notebook's rules (the probe templates learn which loaded
    functions lie under which, `probe_runner.learn_rule_files`)."""
    rules = {*ORACLES, *(r for table in FORBIDDEN_OPS.values() for group in table.values() for r in group)}
    rules |= {r for group in TL_EXERCISES.values() for r in group}
    return frozenset(rule[3:].partition(":")[0] for rule in rules if rule.startswith("py:"))


def template_rules(kind: str) -> tuple[str, ...]:
    """What every probe a probe template runs forbids (`probe_runner.take_out_for_good`): the oracles and the
    backends' operators; in 08's (`transformer_lens`), not TransformerLens nor the harness's `interp`, which its
    exercises and the judge's child use."""
    if kind == "transformer_lens":
        return (*(o for o in ORACLES if o not in ("py:transformer_lens/", _JUDGE_BUILDS_WITH)), FOREIGN_OPERATORS)
    return (*ORACLES, FOREIGN_OPERATORS)
