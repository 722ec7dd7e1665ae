"""Decode steps of ``KvpoolsCache`` and ``DynamicCache`` timed in turn, one step each: paired at the step (issue 37).

    python -m benchmarks.transformers_cache_steps                      # 2- and 8-layer Llama, batch 1 and 8
    python -m benchmarks.transformers_cache_steps --baseline old.py    # and an older transformers.py beside it

``benchmarks/transformers_cache.py`` times whole ``model.generate`` calls, so one busy moment of a shared host
moves a round by 2x.  Here each cache runs its own greedy decode loop (the model's ``forward`` with the cache,
the attention mask growing by one column, ``argmax``) and the loops advance **one step each in turn**, the order
rotating, so every cache's step *i* runs within a few milliseconds of the others': the host's load hits them
alike.  Timed: the thread's CPU time of each decode step (the prompt's forward is not counted).  Reported per
model and batch, over ``--rounds`` rounds of ``--new-tokens`` steps: DynamicCache's step time over each cache's
(a tokens/s ratio), median and 10th-90th percentile of the per-step ratios, and the ratio of the sums of each
step's minimum over the rounds (what is left when every step's noise is filtered).  Every loop's tokens are
checked against DynamicCache's.  ``--baseline`` loads another version of
``kvpools_core/integrations/transformers.py`` (e.g. ``git show REV:kvpools_core/integrations/transformers.py >
old.py``) beside this one, as the "before" column of a change.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

from benchmarks.transformers_cache import llama, prompts
from kvpools_core import build
from kvpools_core.integrations.transformers import KvpoolsCache, plan_for_config
from kvpools_core.values import Serving


def decode(
    model: Any, cache: Any, ids: torch.Tensor, mask: torch.Tensor, new: int, out: list[torch.Tensor]
) -> Iterator[None]:
    """Greedy decoding, one forward per ``next()``: the prompt first, then ``new - 1`` decode steps."""
    batch = ids.shape[0]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache).logits
    token = logits[:, -1].argmax(-1, keepdim=True)
    out.append(token)
    yield
    positions = positions[:, -1:]
    for _ in range(new - 1):
        mask = torch.cat([mask, mask.new_ones(batch, 1)], 1)
        positions = positions + 1
        logits = model(input_ids=token, attention_mask=mask, position_ids=positions, past_key_values=cache).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
        out.append(token)
        yield


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("kvpools_baseline_transformers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.KvpoolsCache


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    tenth = len(ordered) // 10
    return f"{statistics.median(ordered):.3f} [{ordered[tenth]:.3f}, {ordered[-tenth - 1]:.3f}]"


def main() -> None:
    from transformers import DynamicCache

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[2, 8])
    parser.add_argument("--batch", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--baseline", help="another transformers.py to time beside this one (the 'before')")
    args = parser.parse_args()
    torch.set_num_threads(1)
    caches: dict[str, Any] = {"kvpools": KvpoolsCache}
    if args.baseline:
        caches = {"before": _load(args.baseline), **caches}
    names = [*caches, "dynamic"]
    for layers in args.layers:
        model = llama(layers)
        plan = plan_for_config(model.config, Serving(platform="cpu", kv_cache_dtype="bfloat16"), memory="256MiB")
        for batch in args.batch:
            ids, mask = prompts(batch, model.config.vocab_size)
            ratios: dict[str, list[float]] = {name: [] for name in caches}
            steps: dict[str, list[list[int]]] = {name: [] for name in names}
            for round_ in range(args.rounds):
                tokens: dict[str, list[torch.Tensor]] = {name: [] for name in names}
                loops = {
                    name: decode(
                        model,
                        DynamicCache(config=model.config)
                        if name == "dynamic"
                        else caches[name](build(plan, "cpu"), attention_mask=mask),
                        ids,
                        mask,
                        args.new_tokens,
                        tokens[name],
                    )
                    for name in names
                }
                times: dict[str, list[int]] = {name: [] for name in names}
                order = names[round_ % len(names) :] + names[: round_ % len(names)]
                for _ in range(args.new_tokens):
                    for name in order:
                        start = time.thread_time_ns()
                        with torch.inference_mode():
                            next(loops[name])
                        times[name].append(time.thread_time_ns() - start)
                    order = order[1:] + order[:1]
                for name in caches:
                    if not all(torch.equal(a, b) for a, b in zip(tokens[name], tokens["dynamic"], strict=True)):
                        raise SystemExit(
                            f"{layers}-layer batch {batch}: {name} generated other tokens than DynamicCache"
                        )
                    ratios[name] += [d / k for k, d in zip(times[name][1:], times["dynamic"][1:], strict=True)]
                for name in names:
                    steps[name].append(times[name][1:])  # decode steps only
            floor = {name: sum(min(step) for step in zip(*steps[name], strict=True)) for name in names}
            dynamic_us = statistics.median(t for r in steps["dynamic"] for t in r) / 1e3
            print(f"llama-{layers}L batch {batch} (DynamicCache step {dynamic_us:,.0f} us, median):", flush=True)
            for name in caches:
                print(
                    f"    {name:<8} per-step ratio {_spread(ratios[name])}, "
                    f"sum of per-step minima {floor['dynamic'] / floor[name]:.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
