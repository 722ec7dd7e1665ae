"""The transformers identity check on an accelerator, then timings of pool writes / reads and the allocators.

Not run in CI (it needs a CUDA device and ``pip install 'kvpools[hf]'``).  Usage::

    python benchmarks/gpu_check.py                 # cuda, page sizes 16 and 1
    python benchmarks/gpu_check.py --device cpu    # the same on the CPU (a smoke run)

It exits non-zero when generation through a :class:`~kvpools_core.integrations.transformers.KvpoolsCache` built
on the device differs from transformers' own cache by a single token.  The timings are medians of ``--repeats``
runs, synchronised on the device (``torch.cuda.synchronize``) around each.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kvpools_core
from kvpools_core.values import Serving

PROMPT_LENGTHS = (5, 9, 13, 17, 21, 25, 29, 3)
NEW_TOKENS = 64


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_us(fn: Callable[[], Any], device: str, repeats: int) -> float:
    """Median wall time of ``fn`` in microseconds, the device synchronised before and after each run."""
    fn()  # warm-up: kernels compiled / cached
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def tiny_llama(device: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        dtype="bfloat16",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()


def identity(device: str, page_size: int, platform: str) -> bool:
    """Greedy tokens of 8 left-padded prompts x 64 new tokens: KvpoolsCache on ``device`` vs transformers' cache."""
    from kvpools_core.integrations.transformers import KvpoolsCache, cache_kwargs, plan_for_config

    model = tiny_llama(device)
    generator = torch.Generator().manual_seed(1)
    width = max(PROMPT_LENGTHS)
    ids = torch.zeros(len(PROMPT_LENGTHS), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(PROMPT_LENGTHS):
        ids[i, width - n :] = torch.randint(3, 256, (n,), generator=generator)
        mask[i, width - n :] = 1
    ids, mask = ids.to(device), mask.to(device)
    kwargs = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "do_sample": False}
    reference = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    plan = plan_for_config(model.config, Serving(platform=platform, page_size=page_size), memory="4MiB")
    cache = KvpoolsCache(kvpools_core.build(plan, device), attention_mask=mask)
    out = model.generate(input_ids=ids, attention_mask=mask, **cache_kwargs(model, cache), **kwargs)
    same = bool(torch.equal(out, reference))
    differing = int((out != reference).sum())
    print(f"identity  page {page_size:>2}: {'identical' if same else 'DIFFERENT'} ({differing} tokens differ)")
    return same


def pool_and_allocator_timings(device: str, page_size: int, platform: str, repeats: int) -> None:
    """Writes / reads of a Llama-3.1-8B pool's layer, and the allocator's extend / decode / free, on ``device``."""
    plan = kvpools_core.plan("llama-3.1-8b", Serving(platform=platform, page_size=page_size), memory="4GiB")
    pools = kvpools_core.build(plan, device)
    pool, allocator = pools.kv_pool, pools.allocator
    heads, dim = pool.kv.layers[0].heads, pool.kv.layers[0].head_dim
    for tokens in (1, 64, 4096):
        loc = allocator.alloc(-(-tokens // page_size) * page_size)[:tokens]
        k = torch.randn(tokens, heads, dim, dtype=torch.bfloat16, device=device)
        write = median_us(lambda loc=loc, k=k: pool.set_kv_buffer(0, loc, k, k), device, repeats)
        read = median_us(lambda loc=loc: pool.get_kv(0, loc), device, repeats)
        timings = f"set_kv_buffer {write:9.1f} us  get_kv {read:9.1f} us"
        print(f"pool      page {page_size:>2}: {tokens:>5} tokens  {timings}")
        allocator.free(loc)
    batch = 16
    index = torch.int64
    prefix = torch.zeros(batch, dtype=index, device=device)
    seq = torch.full((batch,), 512, dtype=index, device=device)
    last = torch.full((batch,), -1, dtype=index, device=device)

    def extend_and_free() -> None:
        if page_size == 1:
            allocator.free(allocator.alloc(batch * 512))
        else:
            allocator.free(allocator.alloc_extend(prefix, seq, last, batch * 512))

    slots = allocator.alloc(batch * 512) if page_size == 1 else allocator.alloc_extend(prefix, seq, last, batch * 512)
    ends = slots.view(batch, 512)[:, -1].to(index)

    def decode_and_free() -> None:
        if page_size == 1:  # the token allocator (SGLang's) has no decode path: any free slot will do
            allocator.free(allocator.alloc(batch))
        else:
            allocator.free(allocator.alloc_decode(seq + 1, ends))

    extend = median_us(extend_and_free, device, repeats)
    decode = median_us(decode_and_free, device, repeats)
    print(f"allocator page {page_size:>2}: extend 16 x 512 + free {extend:9.1f} us  decode 16 + free {decode:9.1f} us")
    allocator.free(slots)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    platform = "cpu" if torch.device(args.device).type == "cpu" else "cuda"
    print(f"device {args.device} ({torch.cuda.get_device_name(args.device) if platform == 'cuda' else 'host'})")
    identical = all([identity(args.device, page, platform) for page in (16, 1)])
    for page in (16, 1):
        pool_and_allocator_timings(args.device, page, platform, args.repeats)
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
