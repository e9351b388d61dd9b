"""Train the course's offline reference GPT-2 with the code of notebook 06, and save it in Hugging Face format.

    python -m harness.train_reference            # the shipped model (about an hour on a 2-core CPU)
    python -m harness.train_reference --fast     # a few steps of a tiny model, to check the pipeline

Writes `config.json` and `model.safetensors` (float16, GPT-2's tied embeddings), plus `training_log.txt`,
`metrics.json` (validation loss beside unigram and bigram baselines on the same split) and `samples.txt`.
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
    history = course.train(model, train_windows, val_windows, targs, log=log)
    minutes = (time.time() - start) / 60
    val_loss = course.evaluate(model, val_windows, targs.batch_size, None if not args.fast else 2)
    baselines = course.ngram_baselines(train_tokens, val_tokens, cfg.d_vocab)
    log(f"done in {minutes:.1f} min; full validation loss {val_loss:.4f}; baselines {baselines}")

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
        "history": history,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    log(f"saved to {args.out}")


if __name__ == "__main__":
    main()
