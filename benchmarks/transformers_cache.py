"""Decode tokens/s of ``KvpoolsCache`` against transformers' ``DynamicCache``, same model, same tokens, one run.

    python -m benchmarks.transformers_cache                 # tiny (2-layer) and 8-layer Llama, batch 1 and 8
    python -m benchmarks.transformers_cache --rounds 3      # a quick look

Each round generates ``--new-tokens`` greedy tokens for the same left-padded prompts with each cache in turn
(order alternating between rounds, so neither always runs second), timing ``model.generate`` in CPU seconds of
this process. Reported: tokens/s of each, the ratio kvpools / DynamicCache per round (median and min-max), and a
check that both caches produced the same tokens. Needs the ``kvpools[hf]`` extra; torch on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from kvpools_core import build
from kvpools_core.integrations.transformers import KvpoolsCache, plan_for_config
from kvpools_core.values import Serving


def llama(layers: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64 if layers <= 2 else 256,
        intermediate_size=128 if layers <= 2 else 512,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def prompts(batch: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = [16 + 7 * i for i in range(batch)]
    width = max(lengths)
    generator = torch.Generator().manual_seed(1)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(3, vocab, (n,), generator=generator)
        mask[i, width - n :] = 1
    return ids, mask


def generate(model: Any, ids: torch.Tensor, mask: torch.Tensor, new: int, cache: Any) -> tuple[float, torch.Tensor]:
    start = time.process_time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            past_key_values=cache,
        )
    return time.process_time() - start, out


def main() -> None:
    from transformers import DynamicCache

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'model':<14} {'batch':>5} {'kvpools tok/s':>14} {'Dynamic tok/s':>14} {'ratio':>7} {'spread':>12}")
    for layers in (2, 8):
        model = llama(layers)
        plan = plan_for_config(model.config, Serving(platform="cpu", kv_cache_dtype="bfloat16"), memory="256MiB")
        for batch in (1, 8):
            ids, mask = prompts(batch, model.config.vocab_size)
            ratios, ours_rates, theirs_rates = [], [], []
            for round_ in range(args.rounds):
                runs = {}
                order = ("kvpools", "dynamic") if round_ % 2 == 0 else ("dynamic", "kvpools")
                for which in order:
                    if which == "kvpools":
                        cache: Any = KvpoolsCache(build(plan, "cpu"), attention_mask=mask)
                    else:
                        cache = DynamicCache(config=model.config)
                    runs[which] = generate(model, ids, mask, args.new_tokens, cache)
                if not torch.equal(runs["kvpools"][1], runs["dynamic"][1]):
                    raise SystemExit(f"{layers}-layer batch {batch}: the caches generated different tokens")
                tokens = batch * args.new_tokens
                ours, theirs = tokens / runs["kvpools"][0], tokens / runs["dynamic"][0]
                ours_rates.append(ours)
                theirs_rates.append(theirs)
                ratios.append(ours / theirs)
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
            print(
                f"{f'llama-{layers}L':<14} {batch:>5} {statistics.median(ours_rates):>14,.0f} "
                f"{statistics.median(theirs_rates):>14,.0f} {statistics.median(ratios):>7.2f} {spread:>12}",
                flush=True,
            )


if __name__ == "__main__":
    main()
