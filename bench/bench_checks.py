"""Time to load the reference, and the median time of each check with the course's implementations.

    HF_HUB_OFFLINE=1 python bench/bench_checks.py [--repeat 5] [--source offline|gpt2-small|auto] [--later]

--source picks the reference the load_gpt2_test checks compare with (default: the offline model); bench/bench_fullsize.py
passes gpt2-small on the stand-in hub, to time them at GPT-2 small's size.

Prints one line per measurement: each check's median time, the median time of the learner's constructor it calls
(`cls(cfg)`, the part of the check's time that is the learner's own code), and the rest's ratio to the 0.5 s goal,
all measured in this run.
"""

import argparse
import contextlib
import io
import statistics
import subprocess
import sys
import time

GOAL_S = 0.5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--source", default="offline", choices=("offline", "gpt2-small", "auto"))
    parser.add_argument("--later", action="store_true", help="also time every later check (notebooks 00 and 05-09)")
    args = parser.parse_args()

    # Cold load in a fresh interpreter (imports included), then the in-process load the checks use.
    code = f"import time; t = time.time(); from harness import load_reference_gpt2; load_reference_gpt2({args.source!r}); print(time.time() - t)"
    cold = float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1]
    )
    print(f"load reference (fresh process, imports included): {cold:.2f} s")

    from harness import Config, components, load_gpt2_test, load_reference_gpt2, rand_float_test, rand_int_test

    start = time.perf_counter()
    reference = load_reference_gpt2(args.source)
    print(f"reference: {reference.cfg.model_name}, {sum(p.numel() for p in reference.parameters()):,} parameters")
    print(f"load reference (in process): {time.perf_counter() - start:.2f} s")
    course = components("05_full_gpt2")
    tokens = reference.to_tokens("It is a truth universally acknowledged, that a single man in possession")
    _, cache = reference.run_with_cache(tokens)
    last = reference.cfg.n_layers - 1
    cases = {
        "load_gpt2_test(LayerNorm)": lambda: load_gpt2_test(
            course.LayerNorm, reference.ln_final, cache["resid_post", last]
        ),
        "load_gpt2_test(Embed)": lambda: load_gpt2_test(course.Embed, reference.embed, tokens),
        "load_gpt2_test(PosEmbed)": lambda: load_gpt2_test(course.PosEmbed, reference.pos_embed, tokens),
        "load_gpt2_test(Attention)": lambda: load_gpt2_test(
            course.Attention, reference.blocks[0].attn, reference.blocks[0].ln1(cache["resid_pre", 0])
        ),
        "load_gpt2_test(MLP)": lambda: load_gpt2_test(
            course.MLP, reference.blocks[0].mlp, reference.blocks[0].ln2(cache["resid_mid", 0])
        ),
        "load_gpt2_test(TransformerBlock)": lambda: load_gpt2_test(
            course.TransformerBlock, reference.blocks[0], cache["resid_pre", 0]
        ),
        "load_gpt2_test(Unembed)": lambda: load_gpt2_test(
            course.Unembed, reference.unembed, reference.ln_final(cache["resid_post", last])
        ),
        "load_gpt2_test(DemoTransformer)": lambda: load_gpt2_test(course.DemoTransformer, reference, tokens),
        "rand_float_test(LayerNorm, [2, 4, 768])": lambda: rand_float_test(course.LayerNorm, [2, 4, 768]),
        "rand_int_test(Embed, [2, 4])": lambda: rand_int_test(course.Embed, [2, 4]),
        "rand_int_test(PosEmbed, [2, 4])": lambda: rand_int_test(course.PosEmbed, [2, 4]),
        "rand_float_test(Attention, [2, 4, 768])": lambda: rand_float_test(course.Attention, [2, 4, 768]),
        "rand_float_test(MLP, [2, 4, 768])": lambda: rand_float_test(course.MLP, [2, 4, 768]),
        "rand_float_test(TransformerBlock, [2, 4, 768])": lambda: rand_float_test(course.TransformerBlock, [2, 4, 768]),
        "rand_float_test(Unembed, [2, 4, 768])": lambda: rand_float_test(course.Unembed, [2, 4, 768]),
        "rand_int_test(DemoTransformer, [2, 4]) (GPT-2 small size)": lambda: rand_int_test(
            course.DemoTransformer, [2, 4]
        ),
    }
    with contextlib.redirect_stdout(io.StringIO()):
        cases["rand_float_test(LayerNorm, [2, 4, 768])"]()  # warm-up: first-call imports
    reference_cfg, gpt2_small = Config.from_reference(reference), Config()

    def median_time(run) -> float:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                run()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    for name, run in cases.items():
        cls = getattr(course, name.split("(")[1].split(",")[0].rstrip(")"))
        cfg = reference_cfg if name.startswith("load_gpt2_test") else gpt2_small
        check = median_time(run)
        ctor = median_time(lambda cls=cls, cfg=cfg: cls(cfg))
        rest = max(0.0, check - ctor)
        print(
            f"{name}: median {check:.3f} s over {args.repeat} runs, of which the constructor {ctor:.3f} s; "
            f"the rest {rest:.3f} s = {rest / GOAL_S:.2f}x the {GOAL_S} s goal"
        )
    if args.later:
        later_checks(args.repeat)


def later_checks(repeat: int) -> None:
    """Every other check, once per correct entry of the catalogue (tests/wrong_versions.py): the course's own answer
    through the check the learner calls. Their inputs are built by the checks, so the time is all the check's
    (the learner's functions run inside it, as they would)."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from wrong_versions import CASES

    seen = set()
    for case in CASES:
        if not case.correct or case.check in seen or case.check.startswith(("rand_", "load_gpt2")):
            continue
        seen.add(case.check)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                case.run()
            times.append(time.perf_counter() - start)
        check = statistics.median(times)
        print(f"{case.check}: median {check:.3f} s over {repeat} runs = {check / GOAL_S:.2f}x the {GOAL_S} s goal")


if __name__ == "__main__":
    main()
