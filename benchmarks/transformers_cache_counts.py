"""Work per decode step of ``KvpoolsCache`` against transformers' ``DynamicCache``: counted, not timed (issue 37).

    python -m benchmarks.transformers_cache_counts            # 2- and 8-layer Llama, batch 1 and 8

For each cache, ``model.generate`` runs the same left-padded prompts for ``N`` and ``N + K`` new tokens; the
difference divided by ``K`` is what one decode step costs: aten operations dispatched (a ``TorchDispatchMode``
over the whole ``generate``, so the model's own operations, the masks and the cache are all in it), Python
function calls (``cProfile``'s count) and tensors created (operations that return a new tensor, not a view or an
in-place write).  These numbers do not depend on the machine or its load: the model's work is the same for both
caches, so the difference between the two columns is the cache's own per-step work.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.transformers_cache import llama, prompts
from kvpools_core import build
from kvpools_core.integrations.transformers import KvpoolsCache, plan_for_config
from kvpools_core.values import Serving


class _Count(TorchDispatchMode):
    """Every aten operation dispatched while active, and those that made a new tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.allocations = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        schema = func._schema
        out = func(*args, **(kwargs or {}))
        fresh = not schema.is_mutable and not any(r.alias_info is not None for r in schema.returns)
        tensors = isinstance(out, torch.Tensor) or (
            isinstance(out, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in out)
        )
        if fresh and tensors:
            self.allocations += 1
        return out


def _generate(model: Any, ids: torch.Tensor, mask: torch.Tensor, new: int, cache: Any) -> None:
    with torch.inference_mode():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            past_key_values=cache,
        )


def _run(model: Any, ids: torch.Tensor, mask: torch.Tensor, new: int, make: Any) -> tuple[Counter[str], int, int]:
    """Operations and tensors made (one run under the dispatch mode), Python calls (another, under cProfile
    alone: the mode's own Python calls would count otherwise)."""
    with _Count() as count:
        _generate(model, ids, mask, new, make())
    profile = cProfile.Profile()
    cache = make()
    profile.enable()
    _generate(model, ids, mask, new, cache)
    profile.disable()
    calls = sum(row[1] for row in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined]
    return count.ops, count.allocations, calls


def per_step(
    model: Any, plan: Any, batch: int, cache_kind: str, base: int, extra: int
) -> tuple[float, float, float, Counter[str]]:
    ids, mask = prompts(batch, model.config.vocab_size)
    if cache_kind == "kvpools":

        def make() -> Any:
            return KvpoolsCache(build(plan, "cpu"), attention_mask=mask)
    else:
        from transformers import DynamicCache

        def make() -> Any:
            return DynamicCache(config=model.config)

    results = [_run(model, ids, mask, new, make) for new in (base, base + extra)]
    (ops0, alloc0, calls0), (ops1, alloc1, calls1) = results
    diff = Counter({k: (ops1[k] - ops0[k]) / extra for k in ops1 | ops0 if ops1[k] != ops0[k]})
    return (
        (sum(ops1.values()) - sum(ops0.values())) / extra,
        (alloc1 - alloc0) / extra,
        (calls1 - calls0) / extra,
        diff,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[2, 8])
    parser.add_argument("--batch", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--verbose", action="store_true", help="print the per-operation counts that differ")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':<10} {'batch':>5} {'cache':<8} {'aten ops':>9} {'new tensors':>12} {'py calls':>9}")
    for layers in args.layers:
        model = llama(layers)
        plan = plan_for_config(model.config, Serving(platform="cpu", kv_cache_dtype="bfloat16"), memory="256MiB")
        for batch in args.batch:
            rows = {}
            for kind in ("kvpools", "dynamic"):
                ops, allocs, calls, diff = per_step(model, plan, batch, kind, 8, 8)
                rows[kind] = diff
                print(f"{f'llama-{layers}L':<10} {batch:>5} {kind:<8} {ops:>9.1f} {allocs:>12.1f} {calls:>9.1f}")
            if args.verbose:
                ours, theirs = rows["kvpools"], rows["dynamic"]
                for op in sorted(ours.keys() | theirs.keys()):
                    if ours.get(op, 0) != theirs.get(op, 0):
                        print(f"    {op:<40} kvpools {ours.get(op, 0):>6.2f}  dynamic {theirs.get(op, 0):>6.2f}")


if __name__ == "__main__":
    main()
