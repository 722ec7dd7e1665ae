"""How long one exact ``plan()`` takes per preset, against llama-3.1-8b measured in the same rounds.

    python -m benchmarks.plan_speed                    # DeepSeek-V4 and a preset of each family, 15 rounds
    python -m benchmarks.plan_speed --rounds 5 deepseek-v4-flash

Each round plans every model ``--repeat`` times back to back (CPU time of this process, so other processes'
turns on a shared machine do not count); the report is each model's median per plan, its spread (min-max over
rounds) and its ratio to llama-3.1-8b's median, the reference a plan of one token space costs. DeepSeek-V4's
exact plan solves the largest fitting token count from its pool set's bytes summed from the stage and lays the
pools out once, for the answer (it searched, laying the pools out at each of about 8 probes, before issue 37's
fifth pass, and laid them out three times until its sixth): this is where that shows.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvpools_core import Serving, plan
from kvpools_core.registry import get_registry

REFERENCE = "llama-3.1-8b"
DEFAULT_MODELS = (
    "deepseek-v4-flash",
    "deepseek-v4-pro",
    "deepseek-v3",
    "gemma-3-12b-it",
    "qwen3-next-80b-a3b-thinking",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--memory", default="40GiB")
    args = parser.parse_args()
    registry = get_registry()
    models = [REFERENCE, *[m for m in args.models if m != REFERENCE]]
    for model in models:  # warm: presets read, plugins imported
        plan(model, Serving(), memory=args.memory, registry=registry)
    times: dict[str, list[float]] = {model: [] for model in models}
    for _ in range(args.rounds):
        for model in models:
            start = time.process_time()
            for _ in range(args.repeat):
                plan(model, Serving(), memory=args.memory, registry=registry)
            times[model].append((time.process_time() - start) / args.repeat * 1e3)
    reference = statistics.median(times[REFERENCE])
    print(f"{'model':<30} {'median ms':>10} {'spread ms':>14} {'x ' + REFERENCE:>18}")
    for model in models:
        median = statistics.median(times[model])
        spread = f"{min(times[model]):.2f}-{max(times[model]):.2f}"
        print(f"{model:<30} {median:>10.2f} {spread:>14} {median / reference:>18.2f}")


if __name__ == "__main__":
    main()
