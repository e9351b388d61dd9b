"""Train the course's offline reference GPT-2 with the code of notebook 06, and save it in Hugging Face format.

    python -m harness.train_reference            # the shipped model (about an hour on a 2-core CPU)
    python -m harness.train_reference --fast     # a few steps of a tiny model, to check the pipeline

Writes `config.json` and `model.safetensors` (float16, GPT-2's tied embeddings), plus `training_log.txt`,
`metrics.json` and `samples.txt`. The metrics put the model's loss beside unigram and bigram baselines built from
the same training text, on the held-out Shakespeare works and on text by another author that no part of training
sees: Milton, in `harness/out_of_domain/` (Paradise Lost books I-II in the 1667 spelling, and L'Allegro, Il
Penseroso, Comus and Lycidas; Project Gutenberg's texts as the `shakespeare` 0.6 source distribution ships them,
verbatim, cut at the end of book II).

The loop is notebook 06's `train`; on the CPU its forward passes run under bfloat16 autocast (`--no-bf16` to turn
it off), which on an idle 2-core machine here takes a step from 2.2 s to 1.8 s (medians of 10); the loss and
the weights stay in float32.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from harness.config import Config
from harness.course import components
from harness.reference import OFFLINE_MODEL_DIR
from harness.tokenizer import gpt2_encoding

OUT_OF_DOMAIN_DIR = Path(__file__).resolve().parent / "out_of_domain"

# d_model 160 keeps the tied 50257 x d_model embedding, stored in float16, under the repository's 20 MB budget.
FULL_CONFIG = Config(d_model=160, n_layers=4, n_heads=5, d_head=32, d_mlp=640, n_ctx=256)
FAST_CONFIG = Config(d_model=32, n_layers=1, n_heads=2, d_head=16, d_mlp=128, n_ctx=64)
SAMPLE_PROMPTS = ("HAMLET.\n", "KING.\nWhat", "O Romeo,")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OFFLINE_MODEL_DIR)
    parser.add_argument("--fast", action="store_true", help="tiny model, few steps (for tests)")
    parser.add_argument("--steps", type=int, help="override the number of training steps")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in float32 throughout")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    course = components("06_training")
    cfg = FAST_CONFIG if args.fast else FULL_CONFIG
    targs = (
        course.TrainingArgs(max_steps=20, warmup_steps=5, eval_every=10, eval_batches=2)
        if args.fast
        else course.TrainingArgs()
    )
    if args.steps is not None:
        targs.max_steps = args.steps

    args.out.mkdir(parents=True, exist_ok=True)
    log_file = (args.out / "training_log.txt").open("w", encoding="utf-8")

    def log(line: str) -> None:
        stamped = f"[{time.strftime('%H:%M:%S')}] {line}"
        print(stamped, flush=True)
        log_file.write(stamped + "\n")
        log_file.flush()

    encoding = gpt2_encoding()
    train_works, val_works = course.split_works(course.load_shakespeare())
    train_tokens = course.tokenize_works(train_works, encoding)
    val_tokens = course.tokenize_works(val_works, encoding)
    train_windows = course.make_windows(train_tokens, cfg.n_ctx)
    val_windows = course.make_windows(val_tokens, cfg.n_ctx)
    log(
        f"train: {len(train_works)} works, {len(train_tokens):,} tokens; validation {sorted(val_works)}: {len(val_tokens):,} tokens"
    )
    log(f"config: {cfg}")
    log(f"training: {targs}")

    torch.manual_seed(targs.seed)
    model = course.TiedGPT2(cfg)
    start = time.time()
    history = course.train(BFloat16Forward(model) if args.bf16 else model, train_windows, val_windows, targs, log=log)
    minutes = (time.time() - start) / 60
    val_loss = course.evaluate(model, val_windows, targs.batch_size, None if not args.fast else 2)
    baselines = course.ngram_baselines(train_tokens, val_tokens, cfg.d_vocab)
    log(f"done in {minutes:.1f} min; full validation loss {val_loss:.4f}; baselines {baselines}")
    out_of_domain = {}
    for name, tokens in out_of_domain_tokens(encoding).items():
        windows = course.make_windows(tokens, cfg.n_ctx)
        loss = course.evaluate(model, windows, targs.batch_size, None if not args.fast else 2)
        ood_baselines = course.ngram_baselines(train_tokens, tokens, cfg.d_vocab)
        out_of_domain[name] = {
            "tokens": len(tokens),
            "loss": round(loss, 4),
            "unigram_loss": round(ood_baselines["unigram"], 4),
            "bigram_loss": round(ood_baselines["bigram"], 4),
        }
        log(f"out of domain, {name}: loss {loss:.4f}, bigram {ood_baselines['bigram']:.4f}")

    hf_model = course.to_hf_gpt2(model).to(torch.float16)
    hf_model.save_pretrained(args.out)
    samples = []
    for i, prompt in enumerate(SAMPLE_PROMPTS):
        out = course.sample(model, torch.tensor(encoding.encode(prompt)), 60, temperature=0.8, seed=i)
        samples.append(encoding.decode(out.tolist()))
    (args.out / "samples.txt").write_text("\n\n----\n\n".join(samples) + "\n", encoding="utf-8")
    metrics = {
        "validation_works": sorted(val_works),
        "train_tokens": len(train_tokens),
        "validation_tokens": len(val_tokens),
        "tokens_seen": targs.max_steps * targs.batch_size * cfg.n_ctx,
        "minutes": round(minutes, 1),
        "validation_loss": round(val_loss, 4),
        "unigram_loss": round(baselines["unigram"], 4),
        "bigram_loss": round(baselines["bigram"], 4),
        "bigram_lambda": baselines["bigram_lambda"],
        "out_of_domain": out_of_domain,
        "bf16_autocast": args.bf16,
        "history": history,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    log(f"saved to {args.out}")


class BFloat16Forward(torch.nn.Module):
    """`model` with its forward pass under bfloat16 autocast and float32 logits (the loss stays in float32)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        device = tokens.device.type
        with torch.autocast(device, dtype=torch.bfloat16):
            return self.model(tokens).float()


def out_of_domain_tokens(encoding) -> dict[str, torch.Tensor]:
    """Each text of `OUT_OF_DOMAIN_DIR` as GPT-2 token ids, by file name."""
    return {
        path.stem: torch.tensor(encoding.encode_ordinary(path.read_text(encoding="utf-8")), dtype=torch.long)
        for path in sorted(OUT_OF_DOMAIN_DIR.glob("*.txt"))
    }


if __name__ == "__main__":
    main()
