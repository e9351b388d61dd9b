"""Checks for notebook 06 (training): the language-model loss, the learning-rate schedule, the weight-decay groups,
the training loop, the reversal task's loss floor and the masked loss of the bonus addition task.

Each check runs the learner's code on small inputs built here, compares the result with an independent computation
(`torch.nn.functional.cross_entropy`, a closed form, a gradient recomputed at every optimizer step) and raises
AssertionError naming the likely mistake. On success it prints one line to stdout and returns None.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness._assertions import as_tensor_output, assert_unchanged, call, defaults_as_given, fail

__all__ = [
    "lm_loss_test",
    "lr_schedule_test",
    "masked_loss_test",
    "reversal_floor_test",
    "train_addition_test",
    "train_test",
    "weight_decay_groups_test",
]

_TOL = 1e-4  # absolute and relative, on losses computed in float32


def _close(value: float, expected: float, tol: float = _TOL) -> bool:
    return math.isfinite(value) and abs(value - expected) <= tol + tol * abs(expected)


def _first_match(value: float, candidates: list[tuple[float, str]]) -> str:
    for candidate, hint in candidates:
        if _close(value, candidate):
            return " " + hint
    return ""


def _scalar_loss(out, name: str) -> Tensor:
    """The learner's loss as a 0-dimensional float32 tensor that still carries the autograd graph."""
    if isinstance(out, float | int):
        fail(
            f"{name} returned a Python {type(out).__name__}: return the tensor itself (no .item()), so it can be backpropagated."
        )
    out = as_tensor_output(out, name)
    if out.ndim != 0:
        hint = (
            " Return a 0-dimensional tensor (the result of .mean()), not one of shape [1]."
            if out.numel() == 1
            else (" It seems to keep one loss per sequence or position: average them into one number.")
        )
        fail(f"{name} returned a tensor of shape {list(out.shape)}; a loss is a scalar (shape []).{hint}")
    if out.dtype != torch.float32:
        fail(f"{name} returned dtype {out.dtype}; with float32 logits the loss should be float32.")
    if not out.requires_grad:
        fail(
            f"{name} returned a tensor that does not depend on the logits: no .item(), .detach(), torch.no_grad() "
            "or NumPy inside a loss, or training cannot backpropagate through it."
        )
    return out


def _nll(logits: Tensor, tokens: Tensor) -> Tensor:
    """-log p(tokens[:, i+1] | logits[:, i]) for every position that has a next token, in float64: [batch, pos-1]."""
    d_vocab = logits.shape[-1]
    flat = F.cross_entropy(logits[:, :-1].reshape(-1, d_vocab).double(), tokens[:, 1:].reshape(-1), reduction="none")
    return flat.view(tokens.shape[0], -1)


# --------------------------------------------------------------------------------------------------------------------
# lm_loss_test
# --------------------------------------------------------------------------------------------------------------------


def _loss_inputs(
    seed: int, batch: int = 3, pos: int = 7, d_vocab: int = 13, scale: float = 2.0
) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(batch, pos, d_vocab, generator=gen)
    tokens = torch.randint(0, d_vocab, (batch, pos), generator=gen)
    return logits, tokens


def _large_logits() -> tuple[Tensor, Tensor]:
    """Logits where softmax underflows to exactly 0 for some correct tokens: only a log-sum-exp survives them."""
    logits, tokens = _loss_inputs(seed=3, scale=1.0)
    logits[:, :, 0] += 100.0
    logits[0, :-1].scatter_(-1, tokens[0, 1:, None], -100.0)
    return logits, tokens


def _lm_loss_diagnosis(value: float, logits: Tensor, tokens: Tensor) -> str:
    batch, pos, d_vocab = logits.shape
    logits = logits.double()
    right = _nll(logits, tokens).mean().item()
    log_probs = logits.log_softmax(-1)
    return _first_match(
        value,
        [
            (-right, "It has the wrong sign: the loss is the *negative* mean log-probability of the correct tokens."),
            (
                F.cross_entropy(logits.reshape(-1, d_vocab), tokens.reshape(-1)).item(),
                (
                    "It scores each position's logits against the token at the same position, which the model has "
                    "already seen. The logits at position i predict token i+1: pair logits[:, :-1] with tokens[:, 1:]."
                ),
            ),
            (
                F.cross_entropy(logits[:, 1:].reshape(-1, d_vocab), tokens[:, :-1].reshape(-1)).item(),
                (
                    "It is shifted the wrong way: pair logits[:, :-1] with tokens[:, 1:], not logits[:, 1:] with "
                    "tokens[:, :-1]."
                ),
            ),
            (right * batch * (pos - 1), "It is the sum over all predictions: take the mean instead."),
            (right * (pos - 1), "It sums over positions: take the mean over every (sequence, position) pair."),
            (right * batch, "It sums over the batch: take the mean over every (sequence, position) pair."),
            (
                -logits.softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None]).mean().item(),
                "It averages probabilities (softmax), not log-probabilities: use log_softmax.",
            ),
            (
                -logits[:, :-1].gather(-1, tokens[:, 1:, None]).mean().item(),
                "It uses the raw logits as log-probabilities: apply log_softmax over the vocabulary first.",
            ),
            (
                -log_probs[:, :-1].mean().item(),
                "It averages over the whole vocabulary: gather only the correct token's log-probability.",
            ),
            (right / math.log(2), "It is in bits (log2): use the natural logarithm, as log_softmax does."),
            (
                F.cross_entropy(logits.reshape(-1, d_vocab), tokens.roll(-1, dims=1).reshape(-1)).item(),
                (
                    "It pairs the last position with the first token (torch.roll wraps around): the last position "
                    "has no next token; pair logits[:, :-1] with tokens[:, 1:]."
                ),
            ),
            (
                -logits[:, :-1].log_softmax(1).gather(-1, tokens[:, 1:, None]).mean().item(),
                "Its log_softmax runs over the positions (dim=1): normalise over the vocabulary, dim=-1.",
            ),
            (
                -logits.log_softmax(1)[:, :-1].gather(-1, tokens[:, 1:, None]).mean().item(),
                "Its log_softmax runs over the positions (dim=1): normalise over the vocabulary, dim=-1.",
            ),
            (
                _nll(logits, tokens)[tokens[:, 1:] != 0].mean().item(),
                "It leaves out the targets whose id is 0 (an ignore_index=0?): every token id is a real target.",
            ),
            (
                _nll(logits, tokens)[tokens[:, 1:] != 50256].mean().item(),
                "It leaves out the <|endoftext|> targets (id 50256): predicting the end of a text is part of the loss.",
            ),
        ],
    )


def lm_loss_test(lm_cross_entropy) -> None:
    """Checks `lm_cross_entropy(logits, tokens) -> scalar`: the mean next-token cross-entropy of a batch."""
    with torch.enable_grad():  # notebooks often turn gradients off globally; the check backpropagates
        _lm_loss_test(lm_cross_entropy)


def _full_vocabulary_targets() -> tuple[Tensor, Tensor]:
    """GPT-2's whole vocabulary, with targets that include id 0 and <|endoftext|> (50256): neither may be skipped."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 6, 50257, generator=gen)
    tokens = torch.randint(0, 50257, (2, 6), generator=gen)
    tokens[0, 2], tokens[1, 1], tokens[1, 4] = 0, 50256, 0
    tokens[0, 5] = 50256
    return logits, tokens


def _lm_loss_test(lm_cross_entropy) -> None:
    name = getattr(lm_cross_entropy, "__name__", "lm_cross_entropy")
    if not callable(lm_cross_entropy):
        fail(f"Expected the loss function itself, got {type(lm_cross_entropy).__name__}.")
    cases = (
        ("random logits", _loss_inputs(seed=0)),
        ("a batch of one sequence", _loss_inputs(seed=1, batch=1, pos=5, d_vocab=9)),
        ("logits of large magnitude (about 100)", _large_logits()),
        ("GPT-2's full vocabulary, with targets 0 and <|endoftext|>", _full_vocabulary_targets()),
    )
    for what, (logits, tokens) in cases:
        batch, pos, d_vocab = logits.shape
        leaf = logits.clone().requires_grad_(True)
        tokens_in = tokens.clone()
        out = _scalar_loss(call(lm_cross_entropy, leaf, tokens_in, what=f"{name}(logits, tokens)"), name)
        assert_unchanged(logits, leaf.detach(), name)
        assert_unchanged(tokens, tokens_in, name)
        expected = _nll(logits, tokens).mean().item()
        value = out.item()
        if not math.isfinite(value):
            fail(
                f"On {what}, {name} returned {value} (expected {expected:.4f}). softmax underflows to 0 for large "
                "logits, so log(softmax(x)) gives -inf: use log_softmax (or F.cross_entropy), which subtracts the "
                "largest logit first (the log-sum-exp trick)."
            )
        if not _close(value, expected):
            hint = _lm_loss_diagnosis(value, logits, tokens)
            if not hint and what.startswith("logits of large"):
                hint = (
                    " It is right on small logits but not on large ones: log(softmax(x) + eps) or clamping hides the "
                    "underflow without fixing it; use log_softmax."
                )
            fail(
                f"On {what} (batch {batch}, {pos} positions, {d_vocab} tokens), {name} returned {value:.6f}, expected "
                f"{expected:.6f}: the mean of -log p(tokens[:, i+1] | logits[:, i]) over the {batch * (pos - 1)} "
                f"predictions.{hint}"
            )
        out.backward()
        if leaf.grad is None or not torch.isfinite(leaf.grad).all():
            fail(f"Backpropagating through {name} on {what} gave no or non-finite gradients: use log_softmax.")
        if leaf.grad[:, -1].abs().max() > 0:
            fail(f"{name} depends on the logits at the last position, which have no next token to predict: drop them.")
    print(f"{name} passed: matches F.cross_entropy on next-token targets (shifted by one), also for large logits.")


# --------------------------------------------------------------------------------------------------------------------
# train_test
# --------------------------------------------------------------------------------------------------------------------

# a vocabulary and window length of the toy data, both unlike any real setting; an odd length, so that code that
# cuts a batch to an even length shows (agreement sweep 19)
_V, _SEQ = 13, 11


def _chain_windows(n: int, seed: int, noise: float = 0.15) -> Tensor:
    """Windows following next = (3 * prev + 5) mod 13, with a share of tokens replaced at random (all rows differ)."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.empty(n, _SEQ, dtype=torch.long)
    rows[:, 0] = torch.randint(0, _V, (n,), generator=gen)
    for i in range(1, _SEQ):
        rows[:, i] = (3 * rows[:, i - 1] + 5) % _V
        noisy = torch.rand(n, generator=gen) < noise
        rows[noisy, i] = torch.randint(0, _V, (int(noisy.sum()),), generator=gen)
    return rows


class _ProbeModel(nn.Module):
    """A bigram language model that remembers the batch of its last forward pass with gradients."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.cfg = types.SimpleNamespace(d_vocab=_V, n_ctx=_SEQ, d_model=8)
        self.embed = nn.Embedding(_V, 8)
        self.unembed = nn.Linear(8, _V)
        self.since_step: list[Tensor] = []  # the batches of the forwards with gradients since the last step
        self.eval_since_step = 0  # forwards with gradients but in eval mode since then (a loop left in model.eval())
        self.recording = True

    @property
    def last_batch(self) -> Tensor | None:
        """This step's batch: every forward's since the last step where they make one batch between them (gradients
        accumulated over parts of it), else the last forward's (one run twice, once for the log)."""
        parts = self.since_step
        if not parts:
            return None
        rows = getattr(self, "batch_size", None)
        alike = all(p.dim() == 2 and p.shape[1:] == parts[0].shape[1:] for p in parts)
        if len(parts) > 1 and alike and sum(len(p) for p in parts) == rows:
            return torch.cat(parts)
        return parts[-1]

    def forward(self, tokens: Tensor) -> Tensor:
        if self.recording and self.training and torch.is_grad_enabled():
            self.since_step.append(tokens.detach().clone())
        elif self.recording and torch.is_grad_enabled():
            self.eval_since_step += 1
        return self.unembed(self.embed(tokens))


def _expected_lr(step: int, args) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr (written independently of the notebook's lr_at)."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _flat(tensors) -> Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def _rel(a: Tensor, b: Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def _clip(g: Tensor, max_norm: float) -> Tensor:
    return g * min(1.0, max_norm / (g.norm().item() + 1e-6))


class _StepWatcher:
    """Called just before each `optimizer.step()` on the probe model: checks the gradients and the learning rate."""

    def __init__(self, model: _ProbeModel, args, train_rows: set, val_rows: set):
        self.model, self.args = model, args
        model.batch_size = args.batch_size  # what parts of one batch, accumulated, add up to
        self.params = list(model.parameters())
        self.train_rows, self.val_rows = train_rows, val_rows
        self.steps = 0
        self.losses: list[float] = []
        self.batches: list[tuple] = []
        self.previous_grad: Tensor | None = None
        self.lrs: list[list[float]] = []
        self.unclipped = args.grad_clip >= NEVER_CLIPS  # a run whose clip no gradient reaches: the loss's scale shows
        self.first_lr_unset = False
        self.optimizers: list = []  # every distinct optimizer that stepped the model (kept alive: ids stay unique)
        self.pending: list[Tensor] | None = None  # the weights a step given a closure started from

    def watch(self):
        """Hook every optimizer's steps; returns what removes the hooks."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        handles = (register_optimizer_step_pre_hook(self), register_optimizer_step_post_hook(self.after_step))
        return types.SimpleNamespace(remove=lambda: [handle.remove() for handle in handles])

    def _ours(self, optimizer) -> bool:
        return any(p is q for group in optimizer.param_groups for p in group["params"] for q in self.params[:1])

    def __call__(self, optimizer, args=(), kwargs=None):
        """Before a step: its starting weights are kept, and the step is checked once it has run, at those weights
        (`after_step`). The gradients it used are there then, whatever ran between: a step given a closure
        (`optimizer.step(closure)`, as LBFGS needs it) runs the forward and the backward inside itself, and a clip
        in a pre-hook of the optimizer's own runs after every global pre-hook (red-team round 42: refused)."""
        if self._ours(optimizer):
            self.pending = [p.detach().clone() for p in self.params]

    def after_step(self, optimizer, args=(), kwargs=None):
        if not self._ours(optimizer):
            return
        try:
            self._after_closure(optimizer)
        finally:
            self.model.since_step, self.model.eval_since_step = [], 0  # the next step's batch starts here

    def _after_closure(self, optimizer):
        if self.pending is None:
            return
        started, self.pending = self.pending, None
        ended = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, weights in zip(self.params, started, strict=True):
                p.copy_(weights)
        try:
            self._check_step(optimizer)
        finally:
            with torch.no_grad():
                for p, weights in zip(self.params, ended, strict=True):
                    p.copy_(weights)

    def _check_step(self, optimizer) -> None:
        if not any(optimizer is seen for seen in self.optimizers):
            self.optimizers.append(optimizer)
        step, model = self.steps, self.model
        self.steps += 1
        where = f"At optimizer.step() number {step + 1}"
        batch = model.last_batch
        if batch is None and model.eval_since_step:
            fail(
                f"{where}, the model had run on a batch with gradients but in eval mode: call model.train() before "
                "the training forwards (an evaluation that calls model.eval() must put it back; dropout and the like "
                "act only in training mode)."
            )
        if batch is None:
            fail(f"{where}, the model had not been run with gradients on a batch: compute the loss of model(batch).")
        self._check_batch(batch, where)
        if all(p.grad is None for p in self.params):
            fail(
                f"{where}, no parameter had a gradient: call loss.backward() before optimizer.step(), and zero the "
                "gradients before loss.backward(), not between backward and step."
            )
        grad = _flat(torch.zeros_like(p) if p.grad is None else p.grad for p in self.params)
        if grad.norm() == 0:
            fail(
                f"{where}, every gradient was zero: the gradients were cleared between loss.backward() and "
                "optimizer.step(). Call optimizer.zero_grad() before loss.backward() (or after optimizer.step())."
            )
        model.recording = False
        with torch.enable_grad():
            loss = self._loss(model(batch), batch)
            fresh = _flat(torch.autograd.grad(loss, self.params))
        model.recording = True
        self.losses.append(loss.item())
        self._check_grad(grad, fresh, where)
        self.previous_grad = grad
        self._check_lr(optimizer, step, where)

    loss_words = "loss = lm_cross_entropy(model(batch), batch)"

    def _loss(self, logits: Tensor, batch: Tensor) -> Tensor:
        return _nll(logits, batch).mean()

    def _check_lr(self, optimizer, step: int, where: str) -> None:
        args = self.args
        lrs = [float(group["lr"]) for group in optimizer.param_groups]
        self.lrs.append(lrs)
        expected = _expected_lr(step, args)
        wrong = [lr for lr in lrs if not _close(lr, expected, 1e-6)]
        late = " It is the rate of the previous step: set the learning rate before optimizer.step(), not after."
        if step == 0 and wrong and all(_close(lr, args.lr, 1e-9) for lr in wrong):
            self.first_lr_unset = True  # the next step tells a missing schedule from one applied too late
            return
        if step == 1 and self.first_lr_unset:
            if not wrong or all(_close(lr, _expected_lr(0, args), 1e-9) for lr in wrong):
                fail(
                    f"{where}, the learning rate was {wrong[0] if wrong else lrs[0]:.6g}, expected lr_at(1, args) = {expected:.6g}.{late}"
                )
            fail(
                f"At optimizer.step() number 1, the learning rate was args.lr = {args.lr:g}, expected lr_at(0, args) = "
                f"{_expected_lr(0, args):.6g}: the schedule was not applied. Set group['lr'] = lr_at(step, args) for "
                "every group in optimizer.param_groups, each step, before optimizer.step()."
            )
        if wrong:
            lr = wrong[0]
            hint = " Set group['lr'] = lr_at(step, args) for every group in optimizer.param_groups, each step."
            if step == 1 and _close(lr, _expected_lr(0, args), 1e-9):
                hint = (
                    " It is still lr_at(0, args), step 0's rate: set group['lr'] = lr_at(step, args) at every step, "
                    "before optimizer.step()."
                )
            elif step > 0 and _close(lr, _expected_lr(step - 1, args), 1e-9):
                # what was observed, and what gives it: the schedule may also have stopped (agreement sweep 19)
                hint = (
                    f" It is the rate of the previous step, lr_at({step - 1}, args): either the rate is set after "
                    "optimizer.step() rather than before, or the schedule stopped moving."
                )
            elif _close(lr, _expected_lr(step + 1, args), 1e-9):
                hint = (
                    f" It is the rate of the next step, lr_at({step + 1}, args): either the loop passes lr_at a step "
                    "index one ahead (steps count from 0), or a step of the loop did not call optimizer.step() (every "
                    "step calls it once)."
                )
            elif _close(lr, args.lr, 1e-9):
                hint = " It stayed at args.lr: the schedule was not applied." + hint
            fail(f"{where}, the learning rate was {lr:.6g}, expected lr_at({step}, args) = {expected:.6g}.{hint}")

    def _check_batch(self, batch: Tensor, where: str) -> None:
        args = self.args
        if batch.ndim != 2 or batch.shape[0] != args.batch_size:
            fail(
                f"{where}, the model was run on a batch of shape {list(batch.shape)}, expected [args.batch_size={args.batch_size}, seq_len]."
            )
        if batch.shape[1] != _SEQ:
            fail(
                f"{where}, the model was run on a batch of shape {list(batch.shape)}, where train_windows' rows are "
                f"{_SEQ} tokens long: the model takes whole windows (lm_cross_entropy shifts the targets itself)."
            )
        rows = [tuple(row.tolist()) for row in batch]
        if any(row in self.val_rows for row in rows):
            fail(f"{where}, the batch held validation windows: draw training batches from train_windows only.")
        if not all(row in self.train_rows for row in rows):
            fail(
                f"{where}, the batch held rows that are not windows of train_windows: index train_windows with random row indices."
            )
        self.batches.append(tuple(rows))

    def _check_grad(self, grad: Tensor, fresh: Tensor, where: str) -> None:
        clip = self.args.grad_clip
        expected = _clip(fresh, clip)
        if _rel(grad, expected) < 1e-3:
            return
        said = f"{where}, the gradients were not those of this step's loss, clipped to norm {clip}"
        prev = self.previous_grad
        if prev is not None and min(_rel(grad, _clip(prev + fresh, clip)), _rel(grad, prev + fresh)) < 1e-3:
            fail(
                f"{said}: they also hold the previous step's gradients. loss.backward() adds to .grad, so call "
                "optimizer.zero_grad() every step, before loss.backward()."
            )
        if _rel(grad, fresh) < 1e-3:
            fail(
                f"{said}: they are not clipped (their norm is {grad.norm().item():.3g} > args.grad_clip = {clip}). Call "
                "torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip) after loss.backward() and before "
                "optimizer.step()."
            )
        if self.unclipped and torch.nn.functional.cosine_similarity(grad, fresh, dim=0).item() > 0.9999:
            fail(
                f"{where}, with a clip no gradient reaches (args.grad_clip = {clip:g}), the gradients point the right "
                f"way but are {grad.norm().item() / fresh.norm().item():.4g} times those of the mean loss of this "
                "step's batch: the loss has another scale (summed over rows or positions, multiplied, or parts of a "
                "batch accumulated without dividing each by their number). AdamW hides a loss's scale; the clip does "
                "not."
            )
        if torch.nn.functional.cosine_similarity(grad, fresh, dim=0).item() > 0.9999:
            fail(
                f"{said}: they point the right way but their norm is {grad.norm().item():.4g}, expected "
                f"{expected.norm().item():.4g}. Clip the total norm to args.grad_clip with clip_grad_norm_."
            )
        if _rel(grad, fresh.clamp(-clip, clip)) < 1e-3:
            fail(
                f"{said}: each gradient entry was clamped to ±{clip} (clip_grad_value_). Clip the total norm with "
                "clip_grad_norm_, which scales all gradients together and keeps their direction."
            )
        fail(
            f"{said} (relative difference {_rel(grad, expected):.3g}). Each step: {self.loss_words}, "
            "optimizer.zero_grad(), loss.backward(), clip_grad_norm_, optimizer.step()."
        )


NEVER_CLIPS = 1e6  # a gradient clip no gradient of the probe model reaches


def _quiet_tqdm(iterable=None, *args, **kwargs):
    from tqdm.std import tqdm

    kwargs["disable"] = True
    return tqdm(iterable, *args, **kwargs)


@contextlib.contextmanager
def _quiet(fn):
    """No progress bar, no warnings on stderr while the learner's `fn` runs (stderr fails a graded cell)."""
    namespace = getattr(fn, "__globals__", {})
    saved = namespace.get("tqdm", None)
    if saved is not None:
        namespace["tqdm"] = _quiet_tqdm
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if saved is not None:
            namespace["tqdm"] = saved


def train_test(train: Callable, TrainingArgs) -> None:
    """Checks the loop of `train(model, train_windows, val_windows, args, log)` by training a toy model with it.

    At every optimizer step the gradients are compared with this step's loss gradient recomputed independently
    (which catches a missing zero_grad, backward or clipping), and the learning rate with the warm-up + cosine
    schedule; afterwards the loss must have gone down.
    """
    name = getattr(train, "__name__", "train")
    if not callable(train):
        fail(f"Expected the training function itself, got {type(train).__name__}.")
    fields = {
        "batch_size": 8,
        "max_steps": 30,
        "lr": 0.05,
        "warmup_steps": 5,
        "min_lr_ratio": 0.1,
        "weight_decay": 0.0,
        "grad_clip": 0.1,
    }
    fields |= {"eval_every": 10, "eval_batches": 2, "seed": 0}
    try:
        args = TrainingArgs(**fields)
    except TypeError as err:
        fail(
            f"TrainingArgs({', '.join(fields)}) failed ({err}): keep the TrainingArgs dataclass as the notebook gives it."
        )
    train_windows, val_windows = _chain_windows(48, seed=1), _chain_windows(24, seed=2)
    train_rows = {tuple(row) for row in train_windows.tolist()}
    val_windows = val_windows[[tuple(row) not in train_rows for row in val_windows.tolist()]]  # no row in both
    model = _ProbeModel()
    before = [p.detach().clone() for p in model.parameters()]
    watcher = _StepWatcher(model, args, train_rows, {tuple(row) for row in val_windows.tolist()})
    logged: list[str] = []
    handle = watcher.watch()
    try:
        with _quiet(train):
            history = call(train, model, train_windows, val_windows, args, logged.append, what=f"{name}(...)")
    except AssertionError as err:
        if isinstance(err.__cause__, NameError) and "loss" in str(err.__cause__):
            raise AssertionError(
                f"{err}. The code after your part records `loss`: name this step's loss `loss`."
            ) from err
        raise
    finally:
        handle.remove()

    if watcher.steps == 0:
        fail(f"{name} never called optimizer.step(): without it the parameters never change.")
    if len(watcher.optimizers) > 1:
        fail(
            f"{name} stepped the model with {len(watcher.optimizers)} different optimizers in {watcher.steps} steps: "
            "create the optimizer once, before the loop. A new AdamW each step forgets its running averages of the "
            "gradients (and their squares), so every step behaves like the first."
        )
    if watcher.steps != args.max_steps:
        fail(f"{name} called optimizer.step() {watcher.steps} times in {args.max_steps} steps: call it once per step.")
    n_batches = len(set(watcher.batches))
    if n_batches < args.max_steps // 2:
        fail(
            f"{name} used {n_batches} distinct batch{'es' if n_batches > 1 else ''} in {args.max_steps} steps: draw a "
            "new random batch every step."
        )
    at: dict[tuple, set[int]] = {}  # a window's places in train_windows (a few windows of the toy text repeat)
    for i, row in enumerate(train_windows.tolist()):
        at.setdefault(tuple(row), set()).add(i)
    pairs = [(a, b) for batch in watcher.batches for a, b in itertools.pairwise(batch)]
    following = sum(any(i + 1 in at[b] for i in at[a]) for a, b in pairs)  # row b is the window after row a
    if pairs and following >= 0.9 * len(pairs):
        fail(
            f"{name} trained on runs of consecutive windows ({following} of {len(pairs)} rows follow the row before "
            "them in train_windows): draw each row's window at random, so that a batch mixes windows from all over "
            "the training text (torch.randint over len(train_windows), one index per row)."
        )
    if not isinstance(history, dict) or len(history.get("train_loss", [])) != args.max_steps:
        fail(f"{name} should return the history dict with one train_loss per step (keep the code after your part).")
    for i, (got, want) in enumerate(zip(history["train_loss"], watcher.losses)):
        if not _close(float(got), want, 1e-3):
            fail(
                f"At step {i}, the recorded loss was {float(got):.5f} but the loss of that step's batch is {want:.5f}: "
                "`loss` must be lm_cross_entropy(model(batch), batch) for this step's batch."
            )
    if all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())):
        fail(f"{name} left the model's parameters unchanged.")
    start, end = sum(watcher.losses[:5]) / 5, sum(watcher.losses[-5:]) / 5
    if not end < start - 0.3:
        fail(
            f"The toy model's loss went from {start:.3f} (first 5 steps) to {end:.3f} (last 5): it should fall by far more."
        )
    # Again for a few steps with a clip no gradient reaches: the clip above binds at every step, and a loss of another
    # scale (summed, multiplied, parts not divided) then gives the same clipped gradients (agreement sweep 17)
    unclipped = TrainingArgs(**(fields | {"grad_clip": NEVER_CLIPS, "max_steps": 6, "warmup_steps": 2}))
    other = _ProbeModel(seed=1)
    second = _StepWatcher(other, unclipped, train_rows, {tuple(row) for row in val_windows.tolist()})
    handle = second.watch()
    try:
        with _quiet(train):
            call(train, other, train_windows, val_windows, unclipped, lambda *_: None, what=f"{name}(...)")
    finally:
        handle.remove()
    print(
        f"{name} passed: {args.max_steps} steps with fresh, clipped gradients and the scheduled learning rate; "
        f"the toy model's loss fell from {start:.2f} to {end:.2f}."
    )


# --------------------------------------------------------------------------------------------------------------------
# reversal_floor_test
# --------------------------------------------------------------------------------------------------------------------


def _floor(seq_len: int, d_vocab: int) -> float:
    return (seq_len // 2 - 1) / (seq_len - 1) * math.log(d_vocab)


def _floor_diagnosis(value: float, seq_len: int, d_vocab: int) -> str:
    half, ln = seq_len // 2, math.log(d_vocab)
    return _first_match(
        value,
        [
            (
                half / (seq_len - 1) * ln,
                (
                    "It counts the first token as unpredictable, but no loss is taken on it: "
                    "the first prediction is of token 1."
                ),
            ),
            ((half - 1) / seq_len * ln, "It averages over seq_len positions, but there are seq_len - 1 predictions."),
            (
                half / seq_len * ln,
                (
                    "Half the tokens are random, but the first one is never predicted, and there are "
                    "seq_len - 1 predictions."
                ),
            ),
            ((half - 1) / (seq_len - 1) * math.log2(d_vocab), "It is in bits: the loss uses the natural log."),
            ((half - 1) / (seq_len - 1) * math.log10(d_vocab), "It uses log10: the loss uses the natural log."),
            (ln, f"ln({d_vocab}) is the loss of one random token; average it with the determined ones (loss 0)."),
            ((half - 1) * ln, "It is the total over the sequence: take the mean over the predictions."),
            (1 / d_vocab, "That is a probability: the loss is -ln of the probability."),
        ],
    )


def reversal_floor_test(floor) -> None:
    """Checks the lowest mean loss reachable on the reversal task (16 tokens of 100 values, second half mirrored).

    `floor` is a number, or a function `floor(seq_len, d_vocab)` (then also tried on other lengths and vocabularies).
    """
    cases = [(16, 100)]
    if callable(floor):
        cases += [(8, 10), (32, 50), (6, 7)]
        defaults_as_given(
            floor, "06_training", "reversal_loss_floor", getattr(floor, "__name__", "reversal_loss_floor")
        )
    for seq_len, d_vocab in cases:
        value = call(floor, seq_len, d_vocab, what=f"floor({seq_len}, {d_vocab})") if callable(floor) else floor
        if isinstance(value, Tensor):
            if value.numel() != 1:
                fail(f"The loss floor should be one number, got a tensor of shape {list(value.shape)}.")
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int | float):
            fail(f"The loss floor should be a number (a float), got {type(value).__name__}.")
        value = float(value)
        expected = _floor(seq_len, d_vocab)
        if not _close(value, expected, 1e-3):
            about = f"for seq_len={seq_len}, d_vocab={d_vocab}" if callable(floor) else "for 16 tokens of 100 values"
            fail(
                f"Loss floor {about}: got {value:.4f}, which is not it.{_floor_diagnosis(value, seq_len, d_vocab)} "
                "Count the predictions, and how many of them no model can do better on than a uniform guess."
            )
    print(f"reversal_floor_test passed: the floor for 16 tokens of 100 values is {_floor(16, 100):.4f} nats per token.")


# --------------------------------------------------------------------------------------------------------------------
# masked_loss_test
# --------------------------------------------------------------------------------------------------------------------


def _masked_inputs(seed: int) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    batch, pos, d_vocab = 4, 9, 11
    logits = 2.0 * torch.randn(batch, pos, d_vocab, generator=gen)
    tokens = torch.randint(0, d_vocab, (batch, pos), generator=gen)
    mask = torch.zeros(batch, pos, dtype=torch.bool)
    for b, start in enumerate((5, 3, 7, 4)):  # a different number of answer tokens in each row
        mask[b, start:] = True
    mask[1, 8] = False  # and not always a suffix
    return logits, tokens, mask


def _masked(nll: Tensor, weights: Tensor) -> float:
    return ((nll * weights).sum() / weights.sum()).item()


def _masked_evidence(loss_fn, logits, tokens, mask, value: float, expected: float) -> str:
    from harness._evidence import rows_and_positions, scale_note, sensitivity

    batch, pos, d_vocab = logits.shape

    def learner(x):
        with torch.no_grad():
            return float(loss_fn(x.clone(), tokens.clone(), mask.clone()))

    def reference(x):
        return _masked(_nll(x, tokens), mask[:, 1:].double())

    try:
        notes = sensitivity(learner, reference, logits, rows_and_positions(batch, pos))
    except Exception:  # noqa: BLE001 - the learner's function failing on other inputs: no further evidence
        notes = ""
    n_masked = int(mask[:, 1:].sum())
    scale = scale_note(value, expected, {"d_vocab": d_vocab, "batch": batch, "masked predictions": n_masked})
    found = "; ".join(n for n in (notes, scale) if n)
    return f" Changing the inputs shows: {found}." if found else ""


def masked_loss_test(masked_lm_loss) -> None:
    """Checks `masked_lm_loss(logits, tokens, loss_mask) -> scalar`: the next-token loss over masked tokens only."""
    with torch.enable_grad():  # notebooks often turn gradients off globally; the check backpropagates
        _masked_loss_test(masked_lm_loss)


def _masked_loss_test(masked_lm_loss) -> None:
    name = getattr(masked_lm_loss, "__name__", "masked_lm_loss")
    if not callable(masked_lm_loss):
        fail(f"Expected the loss function itself, got {type(masked_lm_loss).__name__}.")
    for seed in (0, 1, 2, 3):
        logits, tokens, mask = _masked_inputs(seed)
        if seed == 2:  # the first position set: it is never a target, so a wrong shift or denominator shows
            mask[:, 0] = True
        if seed == 3:  # every position: the masked loss is then the plain next-token loss
            mask[:] = True
        leaf = logits.clone().requires_grad_(True)
        tokens_in, mask_in = tokens.clone(), mask.clone()
        out = _scalar_loss(
            call(masked_lm_loss, leaf, tokens_in, mask_in, what=f"{name}(logits, tokens, loss_mask)"), name
        )
        assert_unchanged(logits, leaf.detach(), name)
        assert_unchanged(tokens, tokens_in, name)
        assert_unchanged(mask, mask_in, name)
        nll = _nll(logits, tokens)
        target = mask[:, 1:].double()
        expected = _masked(nll, target)
        value = out.item()
        if not _close(value, expected):
            per_row = ((nll * target).sum(1) / target.sum(1)).mean().item()
            hint = _first_match(
                value,
                [
                    (
                        _masked(nll, mask[:, :-1].double()),
                        (
                            "The mask is not shifted with the targets: the logits at "
                            "position i predict token i+1, so weight them by loss_mask[:, 1:]."
                        ),
                    ),
                    (
                        (nll * target).sum().item() / nll.numel(),
                        (
                            "It divides by every prediction: divide by the number "
                            "of masked ones (loss_mask[:, 1:].sum())."
                        ),
                    ),
                    (
                        per_row,
                        (
                            "It averages each sequence first: average over all masked predictions of the batch at "
                            "once, so that every answer token weighs the same."
                        ),
                    ),
                    (_masked(nll, 1 - target), "The mask is inverted: True marks the tokens to predict."),
                    (
                        (nll * target).sum().item() / mask.sum().item(),
                        (
                            "It divides by loss_mask.sum(), which counts position 0 (never a target): divide by "
                            "loss_mask[:, 1:].sum()."
                        ),
                    ),
                    (nll.mean().item(), "It ignores the mask: that is the plain next-token loss."),
                    ((nll * target).sum().item(), "It is a sum: take the mean over the masked predictions."),
                    (-expected, "It has the wrong sign."),
                ],
            )
            definition = (
                "the mean of -log p(tokens[:, i+1] | logits[:, i]) over the predictions whose target is masked, i.e. "
                "loss_mask[:, i+1] is True"
            )
            if hint:  # the likely cause first, then the evidence
                fail(f"{name}:{hint} (It returned {value:.6f}, expected {expected:.6f}: {definition}.)")
            observed = _masked_evidence(masked_lm_loss, logits, tokens, mask, value, expected)
            fail(f"{name} returned {value:.6f}, expected {expected:.6f}.{observed} The expected value is {definition}.")
        out.backward()
        unmasked = torch.cat(
            [~mask[:, 1:], torch.ones_like(mask[:, :1])], dim=1
        )  # the logits predicting no answer token
        if leaf.grad is None or leaf.grad[unmasked].abs().max() > 0:
            fail(f"{name}'s gradient reaches logits whose next token is not masked: they must not affect the loss.")
    # 40 rows, past a cap a learner may write in (the first 16 rows alone passed four rows: red-team round 51)
    gen = torch.Generator().manual_seed(4)
    logits, tokens = 2.0 * torch.randn(40, 9, 11, generator=gen), torch.randint(0, 11, (40, 9), generator=gen)
    mask = torch.arange(9)[None, :] >= torch.randint(1, 9, (40, 1), generator=gen)
    leaf = logits.clone().requires_grad_(True)
    value = _scalar_loss(call(masked_lm_loss, leaf, tokens.clone(), mask.clone(), what=name), name).item()
    expected = _masked(_nll(logits, tokens), mask[:, 1:].double())
    if not _close(value, expected):
        fail(
            f"{name} on a batch of 40 rows, where batches of 4 were right, returned {value:.6f}, expected "
            f"{expected:.6f}: every row of the batch counts."
        )
    print(
        f"{name} passed: the mean next-token loss over the masked tokens only, with rows of different answer lengths."
    )


def _lr_variants(step: int, args) -> dict[str, float]:
    """The usual wrong schedules at one step, each named."""
    warm = step < args.warmup_steps
    span = max(1, args.max_steps - args.warmup_steps)
    progress = min(1.0, (step - args.warmup_steps) / span)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    floor = args.min_lr_ratio
    return {
        "warms up from 0: at step 0 the rate is 0, so the first update is wasted; use (step + 1) / warmup_steps": (
            args.lr * step / args.warmup_steps if warm else _expected_lr(step, args)
        ),
        "decays to 0 instead of min_lr_ratio * lr: the cosine runs between the peak and the floor": (
            _expected_lr(step, args) if warm else args.lr * cosine
        ),
        "does not stop decaying at max_steps: clamp the progress at 1 (min(1, ...))": (
            _expected_lr(step, args)
            if warm
            else args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (step - args.warmup_steps) / span)))
        ),
        "measures the cosine's progress from step 0, not from the end of the warm-up": (
            _expected_lr(step, args)
            if warm
            else args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / args.max_steps))))
        ),
        "has no warm-up: the rate starts at its peak": (
            args.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / args.max_steps))))
        ),
        "decays linearly, not along a cosine": (
            _expected_lr(step, args) if warm else args.lr * (floor + (1 - floor) * (1 - progress))
        ),
    }


def lr_schedule_test(lr_at: Callable, TrainingArgs) -> None:
    """Checks `lr_at(step, args) -> float`: a linear warm-up to args.lr over warmup_steps, then a cosine decay to
    min_lr_ratio * lr at max_steps, and flat after it."""
    name = getattr(lr_at, "__name__", "lr_at")
    if not callable(lr_at):
        fail(f"Expected the function itself, got {type(lr_at).__name__}.")
    try:
        args = TrainingArgs(max_steps=200, lr=3e-3, warmup_steps=20, min_lr_ratio=0.1)
    except TypeError as err:
        raise AssertionError(
            f"TrainingArgs(max_steps=..., lr=..., warmup_steps=..., min_lr_ratio=...) failed: {err}"
        ) from err
    steps = [0, 1, 10, 19, 20, 21, 60, 110, 150, 199, 200, 260]
    got = {}
    for step in steps:
        value = call(lr_at, step, args, what=f"{name}({step}, args)")
        if isinstance(value, Tensor):
            value = value.item()
        if not isinstance(value, (int, float)):
            fail(f"{name}({step}, args) returned {type(value).__name__}; return a float (the learning rate).")
        got[step] = float(value)
    wrong = [s for s in steps if not math.isclose(got[s], _expected_lr(s, args), rel_tol=1e-6, abs_tol=1e-12)]
    if not wrong:
        _lr_edges(lr_at, TrainingArgs, name)
        print(
            f"{name} passed: warm-up to {args.lr:g} over {args.warmup_steps} steps, cosine to "
            f"{args.min_lr_ratio * args.lr:g} at step {args.max_steps}, flat after."
        )
        return
    for label in _lr_variants(0, args):
        if all(math.isclose(got[s], _lr_variants(s, args)[label], rel_tol=1e-6, abs_tol=1e-12) for s in steps):
            fail(f"{name} {label}.")
    step = wrong[0]
    phases = {
        "the warm-up": [s for s in steps if s < args.warmup_steps],
        "the decay": [s for s in steps if args.warmup_steps <= s < args.max_steps],
        "the steps after max_steps": [s for s in steps if s >= args.max_steps],
    }
    right = [p for p, ss in phases.items() if ss and not set(ss) & set(wrong)]
    bad = [p for p, ss in phases.items() if set(ss) & set(wrong)]
    where = f"{name} is right in {' and '.join(right)}, wrong in {' and '.join(bad)}: " if right else ""
    end = args.max_steps + 60
    if end in wrong:
        where += f"after max_steps it gives {got[end]:.6g} where min_lr_ratio * lr = {_expected_lr(end, args):.6g}; "
    fail(
        f"{where}{name}({step}, args) = {got[step]:.6g}, expected {_expected_lr(step, args):.6g} (warm-up "
        f"{args.warmup_steps} steps to lr={args.lr:g}, cosine to {args.min_lr_ratio * args.lr:g} at "
        f"max_steps={args.max_steps}); {len(wrong)} of the {len(steps)} steps tried differ."
    )


def _lr_edges(lr_at: Callable, TrainingArgs, name: str) -> None:
    """Schedules at their edges: no decay phase (max_steps == warmup_steps), a one-step decay, other rates."""
    for fields in (
        {"max_steps": 5, "lr": 1e-3, "warmup_steps": 5, "min_lr_ratio": 0.2},
        {"max_steps": 6, "lr": 1e-3, "warmup_steps": 5, "min_lr_ratio": 0.2},
        {"max_steps": 50, "lr": 6e-4, "warmup_steps": 1, "min_lr_ratio": 0.0},
        # no warm-up at all (agreement sweep 17: a special case for it returning lr at every step passed)
        {"max_steps": 8, "lr": 1e-3, "warmup_steps": 0, "min_lr_ratio": 0.3},
    ):
        args = TrainingArgs(**fields)
        shown = ", ".join(f"{k}={v:g}" for k, v in fields.items())
        for step in range(fields["max_steps"] + 3):
            value = call(lr_at, step, args, what=f"{name}({step}, args with {shown})")
            value = value.item() if isinstance(value, Tensor) else value
            expected = _expected_lr(step, args)
            if not math.isclose(float(value), expected, rel_tol=1e-6, abs_tol=1e-12):
                fail(
                    f"{name}({step}, args with {shown}) = {float(value):.6g}, expected {expected:.6g}; the schedule "
                    f"with warmup_steps=20, max_steps=200 was right. At step warmup_steps the rate is lr, the "
                    "cosine's start; it reaches min_lr_ratio * lr at max_steps and stays there after. Where "
                    "max_steps == warmup_steps there is no decay: lr at that step, min_lr_ratio * lr after it; where "
                    "warmup_steps == 0 there is no warm-up: the cosine starts at step 0."
                )


# --------------------------------------------------------------------------------------------------------------------
# weight_decay_groups_test
# --------------------------------------------------------------------------------------------------------------------

_ADAMW_DEFAULT_DECAY = 0.01  # what AdamW applies to a group that names no weight_decay of its own


def _decay_probe_model() -> nn.Module:
    from harness.config import Config
    from harness.course import components

    # GPT-2's 12 layers, at a tiny width: a rule that stops at some block shows (blocks from the fourth on left out of
    # decay passed two layers: red-team round 51)
    cfg = Config(d_model=16, n_layers=12, n_heads=2, d_head=8, d_mlp=32, n_ctx=8, d_vocab=50)
    torch.manual_seed(0)
    return components("05_full_gpt2").DemoTransformer(cfg)


def _kind(name: str, param: Tensor) -> str:
    """What a parameter of the course's GPT-2 is, in the words the messages use."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("W_E", "W_pos"):
        return "embedding"
    if ".ln" in f".{name}" and leaf in ("w", "b"):
        return "LayerNorm gain" if leaf == "w" else "LayerNorm bias"
    if leaf in ("b_Q", "b_K", "b_V"):  # [n_heads, d_head]: a bias by name, a matrix by its dimensions
        return "attention bias"
    if param.ndim < 2:
        return "bias"
    return "matrix"


def weight_decay_groups_test(weight_decay_groups: Callable) -> None:
    """Checks `weight_decay_groups(model, weight_decay) -> list of AdamW parameter groups`: every matrix of the
    attention, MLP and unembedding decayed by `weight_decay`; embeddings, LayerNorm gains and biases, and all other
    biases in a group with weight_decay 0; every trainable parameter in exactly one group, a frozen one in at most one."""
    name = getattr(weight_decay_groups, "__name__", "weight_decay_groups")
    if not callable(weight_decay_groups):
        fail(f"Expected the function itself, got {type(weight_decay_groups).__name__}.")
    model = _decay_probe_model()
    names = {id(p): n for n, p in model.named_parameters()}
    with torch.no_grad():
        before = {n: p.clone() for n, p in model.named_parameters()}
    groups = call(weight_decay_groups, model, 0.05, what=f"{name}(model, 0.05)")
    for n, p in model.named_parameters():
        if not torch.equal(p, before[n]):
            fail(f"{name} changed the model's parameter {n}: it should only sort the parameters into groups.")
    if isinstance(groups, dict) or not isinstance(groups, list | tuple):
        fail(
            f"{name} returned {type(groups).__name__}; return a list of parameter groups, each a dict with "
            "'params' (a list of tensors) and 'weight_decay', as torch.optim.AdamW accepts."
        )
    decay_of: dict[str, list[float]] = {}
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or "params" not in group:
            fail(
                f"Group {i} is {type(group).__name__}; each group is a dict with a 'params' list and a 'weight_decay'."
            )
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        if "weight_decay" not in group:
            fail(
                f"Group {i} has no 'weight_decay' entry: AdamW would apply its default, {_ADAMW_DEFAULT_DECAY}, to "
                "it. Give every group its own value (0.0 for the group that must not decay)."
            )
        for p in params:
            if id(p) not in names:
                fail(
                    f"Group {i} holds a tensor that is not one of the model's parameters (shape {list(p.shape)}): put "
                    "the parameters themselves in the groups (from model.named_parameters()), not copies."
                )
            decay_of.setdefault(names[id(p)], []).append(float(group["weight_decay"]))
    twice = [n for n, values in decay_of.items() if len(values) > 1]
    if twice:
        fail(
            f"{len(twice)} parameters are in more than one group (e.g. {twice[0]}): AdamW refuses that. Put each "
            "parameter in exactly one group."
        )
    # a frozen parameter (the unembedding's bias is) is never stepped: it may sit in either group or in none, as
    # nanoGPT's configure_optimizers leaves out every parameter without requires_grad
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay_of = {n: v for n, v in decay_of.items() if n in params}
    missing = [n for n in params if n not in decay_of]
    if missing:
        fail(
            f"{len(missing)} trainable parameters are in no group (e.g. {', '.join(missing[:3])}): the optimizer "
            "would never update them. Every parameter with requires_grad goes in exactly one group."
        )
    wrong_value = sorted({v[0] for v in decay_of.values() if v[0] not in (0.0, 0.05)})
    if wrong_value:
        fail(
            f"A group has weight_decay {wrong_value[0]:g}; called with weight_decay=0.05, the decayed group should use "
            "0.05 and the other 0.0."
        )
    decayed = {n for n, v in decay_of.items() if v[0] > 0}
    if not decayed:
        fail(f"{name} decays nothing: the matrices of attention, the MLP and the unembedding should decay by 0.05.")
    wrong: dict[str, list[str]] = {}
    for n, p in params.items():
        kind = _kind(n, p)
        if kind == "attention bias":  # either group: the notebook accepts a rule by name or by dimensions
            continue
        if (kind == "matrix") != (n in decayed):
            wrong.setdefault(kind, []).append(n)
    matrices = {n for n, p in params.items() if _kind(n, p) == "matrix"}
    either = {n for n, p in params.items() if _kind(n, p) == "attention bias"}
    if decayed and decayed - either == set(params) - matrices - either:
        fail(
            f"{name} decays exactly the parameters that must not decay, and not the matrices: the two groups' "
            "weight_decay values are swapped (the matrices' group takes weight_decay, the other 0.0)."
        )
    if not wrong:
        other = call(weight_decay_groups, model, 0.3, what=f"{name}(model, weight_decay=0.3)")
        values = sorted({float(g.get("weight_decay", _ADAMW_DEFAULT_DECAY)) for g in other if isinstance(g, dict)})
        if values != [0.0, 0.3]:
            fail(
                f"{name}(model, weight_decay=0.3) gave groups with weight_decay {values}, expected [0.0, 0.3] (with "
                "0.05 it was right): the decayed group's value must follow the weight_decay argument."
            )
        print(
            f"{name} passed: {len(decayed)} matrices decay, {len(params) - len(decayed)} embeddings, gains and "
            "biases do not, and every parameter is in exactly one group."
        )
        return
    why = {
        "embedding": (
            "Embeddings are decayed ({names}): decay shrinks every row at every step, but a row learns only when its "
            "token (or position) is in the batch, so rare tokens' embeddings would be pulled toward zero between "
            "appearances"
        ),
        "LayerNorm gain": (
            "LayerNorm gains are decayed ({names}): decay pulls a value toward 0, but a gain's neutral value is 1, "
            "so decay would shrink every normalised vector"
        ),
        "LayerNorm bias": "LayerNorm biases are decayed ({names}): biases, LayerNorm's included, stay out of decay",
        "bias": (
            "Biases are decayed ({names}): a bias only shifts an output, it cannot make the model more complex, so "
            "decaying it only fights the fit"
        ),
        "matrix": (
            "Matrices are not decayed ({names}): W_Q, W_K, W_V, W_O, W_in, W_out and W_U (p.ndim >= 2, not an "
            "embedding) are the weights weight decay is for"
        ),
    }
    kind, which = next(iter(wrong.items()))
    names = ", ".join(which[:3]) + (f" and {len(which) - 3} more" if len(which) > 3 else "")
    others = [k for k in wrong if k != kind]
    also = f" Also wrong: {', '.join(others)}." if others else ""
    fail(why[kind].format(names=names) + "." + also)


# --------------------------------------------------------------------------------------------------------------------
# train_addition_test
# --------------------------------------------------------------------------------------------------------------------

_PLUS, _EQUALS = 10, 11  # the addition task's token ids after the ten digits


def _addition_problem(row: list[int], n_digits: int) -> bool:
    """Is `row` "a+b=" followed by the digits of a + b, last digit first, as addition_data writes them?"""
    n = n_digits
    if len(row) != 3 * n + 3 or row[n] != _PLUS or row[2 * n + 1] != _EQUALS:
        return False
    digits = row[:n] + row[n + 1 : 2 * n + 1] + row[2 * n + 2 :]
    if any(not 0 <= d <= 9 for d in digits):
        return False
    a = int("".join(map(str, row[:n])))
    b = int("".join(map(str, row[n + 1 : 2 * n + 1])))
    return row[2 * n + 2 :] == [(a + b) // 10**i % 10 for i in range(n + 1)]


class _AdditionWatcher(_StepWatcher):
    """The training-loop watcher for the addition task: fresh problems each step, the loss on the answer only."""

    loss_words = "loss = masked_lm_loss(model(tokens), tokens, loss_mask)"

    def __init__(self, model: _ProbeModel, args, n_digits: int):
        super().__init__(model, args, set(), set())
        self.n_digits = n_digits

    def _loss(self, logits: Tensor, batch: Tensor) -> Tensor:
        return _nll(logits, batch)[:, -(self.n_digits + 1) :].mean()  # the targets of the answer's digits

    def _check_batch(self, batch: Tensor, where: str) -> None:
        args, n = self.args, self.n_digits
        if batch.ndim != 2 or batch.shape[0] != args.batch_size:
            fail(
                f"{where}, the model was run on a batch of shape {list(batch.shape)}, expected "
                f"[args.batch_size={args.batch_size}, {3 * n + 3}]: addition_data(args.batch_size, n_digits, seed=...)."
            )
        rows = [row.tolist() for row in batch]
        if not all(_addition_problem(row, n) for row in rows):
            fail(
                f"{where}, the model was run on rows that are not addition problems of {n} digits: train on the tokens "
                "that addition_data(args.batch_size, n_digits, seed=...) returns."
            )
        self.batches.append(tuple(tuple(row) for row in rows))


def train_addition_test(train_addition: Callable, TrainingArgs) -> None:
    """Checks `train_addition(model, args, n_digits) -> list[float]` by training a toy model with it: one optimizer,
    the scheduled learning rate, fresh addition problems every step, the loss on the answer digits only (compared with
    the gradient of that loss recomputed at every optimizer step), one recorded loss per step."""
    name = getattr(train_addition, "__name__", "train_addition")
    if not callable(train_addition):
        fail(f"Expected the training function itself, got {type(train_addition).__name__}.")
    fields = {"batch_size": 8, "max_steps": 20, "lr": 0.05, "warmup_steps": 4, "min_lr_ratio": 0.1}
    fields |= {"weight_decay": 0.0, "grad_clip": 0.1, "eval_every": 10, "eval_batches": 2, "seed": 3}
    try:
        args = TrainingArgs(**fields)
    except TypeError as err:
        fail(
            f"TrainingArgs({', '.join(fields)}) failed ({err}): keep the TrainingArgs dataclass as the notebook gives it."
        )
    n_digits = 2
    model = _ProbeModel()
    before = [p.detach().clone() for p in model.parameters()]
    watcher = _AdditionWatcher(model, args, n_digits)
    handle = watcher.watch()
    try:
        with _quiet(train_addition):
            losses = call(train_addition, model, args, n_digits, what=f"{name}(model, args, {n_digits})")
    except AssertionError as err:
        if isinstance(err.__cause__, NameError) and "loss" in str(err.__cause__):
            raise AssertionError(
                f"{err}. The code after your part records `loss`: name this step's loss `loss`."
            ) from err
        raise
    finally:
        handle.remove()

    if watcher.steps == 0:
        fail(f"{name} never called optimizer.step(): without it the parameters never change.")
    if len(watcher.optimizers) > 1:
        fail(
            f"{name} stepped the model with {len(watcher.optimizers)} different optimizers in {watcher.steps} steps: "
            "use the one optimizer the given code creates before the loop."
        )
    if watcher.steps != args.max_steps:
        fail(f"{name} called optimizer.step() {watcher.steps} times in {args.max_steps} steps: call it once per step.")
    n_batches = len(set(watcher.batches))
    if n_batches == 1:
        fail(
            f"{name} trained on the same {args.batch_size} problems at every step: addition_data with the same seed "
            "gives the same problems. Give it a different seed at every step, derived from args.seed and step."
        )
    if n_batches < args.max_steps:
        fail(
            f"{name} used {n_batches} distinct batches in {args.max_steps} steps: give addition_data a different seed "
            "at every step (derived from args.seed and step), so that every step sees new problems."
        )
    if not isinstance(losses, list | tuple) or len(losses) != args.max_steps:
        fail(f"{name} should return the list of one loss per step (keep the code after your part).")
    if not all(isinstance(v, float) for v in losses):
        kinds = ", ".join(sorted({type(v).__name__ for v in losses}))
        fail(
            f"{name} returned a list of {kinds}, not of floats: record loss.item() (a tensor that needs grad keeps "
            "its whole graph alive, and the notebook's plot of the losses cannot take it)."
        )
    for i, (got, want) in enumerate(zip(losses, watcher.losses)):
        if not _close(float(got), want, 1e-3):
            fail(
                f"At step {i}, the recorded loss was {float(got):.5f} but the loss on the answer digits of that step's "
                f"problems is {want:.5f}: `loss` must be masked_lm_loss(model(tokens), tokens, loss_mask)."
            )
    if all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())):
        fail(f"{name} left the model's parameters unchanged.")
    # Two short runs more: the problems must follow the n_digits argument and args.seed.
    for n_digits_2, seed_2 in ((3, fields["seed"]), (n_digits, fields["seed"] + 8)):
        args_2 = TrainingArgs(**{**fields, "max_steps": 2, "warmup_steps": 1, "seed": seed_2})
        watcher_2 = _AdditionWatcher(_ProbeModel(), args_2, n_digits_2)
        handle = watcher_2.watch()
        what = f"{name}(model, args with seed={seed_2}, {n_digits_2})"
        try:
            with _quiet(train_addition):
                call(train_addition, watcher_2.model, args_2, n_digits_2, what=what)
        except AssertionError as err:
            if n_digits_2 != n_digits:
                raise AssertionError(
                    f"With n_digits={n_digits_2} (right with {n_digits}): {str(err).splitlines()[0]} The problems "
                    "must follow the n_digits argument."
                ) from err
            raise
        finally:
            handle.remove()
        if n_digits_2 == n_digits and watcher_2.batches[:1] == watcher.batches[:1]:
            fail(
                f"{what} trained on the same first problems as with seed={fields['seed']}: derive addition_data's seed "
                "from args.seed (and the step), so that another seed gives other problems."
            )
    print(
        f"{name} passed: {args.max_steps} steps on fresh problems, with fresh, clipped gradients of the loss on the "
        "answer digits and the scheduled learning rate; the problems follow n_digits and args.seed."
    )
