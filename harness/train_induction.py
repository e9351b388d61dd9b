"""Train the 2-layer attention-only model of notebook 08, in which an induction head forms, with the notebook's code.

    python -m harness.train_induction           # the shipped model (under a minute on a 2-core CPU)
    python -m harness.train_induction --fast    # a few steps, to check the pipeline

Writes `model.safetensors` (float32, about 150 KB) and `metrics.json` (the config, the training arguments, the
probe's history: loss on the repeated part and on the first copy, best induction and previous-token scores).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from harness.course import components
from harness.interp import INDUCTION_MODEL_DIR


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=INDUCTION_MODEL_DIR)
    parser.add_argument("--fast", action="store_true", help="40 steps (for tests)")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from safetensors.torch import save_file

    course = components("08_interpretability")
    targs = course.InductionArgs(steps=40, eval_every=10) if args.fast else course.InductionArgs()
    torch.manual_seed(targs.seed)  # the notebook's seed, so that its full mode trains this very model
    model = course.AttnOnlyTransformer(course.INDUCTION_CONFIG)
    start = time.time()
    history = course.train_induction(model, targs)
    minutes = (time.time() - start) / 60
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in model.state_dict().items()}, args.out / "model.safetensors")
    metrics = {
        "config": asdict(course.INDUCTION_CONFIG),
        "training": asdict(targs),
        "minutes": round(minutes, 2),
        "final": {name: values[-1] for name, values in history.items()},
        "history": history,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    print(f"saved to {args.out} after {minutes:.1f} min: {metrics['final']}")


if __name__ == "__main__":
    main()
