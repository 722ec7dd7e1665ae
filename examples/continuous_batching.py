"""Continuous batching on kvpools pools with a real transformers model (CPU, random weights, nothing downloaded).

A scheduler in the small: requests wait in a queue; one is admitted while the request table has a free row and the
allocator has room for its whole life (prompt plus every token it may generate, in whole pages: a conservative
reservation, where SGLang admits optimistically and retracts); an admitted request's prompt is prefilled alone,
then every running request decodes one token per step in one batch, through the same pools; a finished request's
slots and row are freed at once, which admits the next.  The outputs are compared with one-at-a-time
``model.generate`` on transformers' own cache, token for token.

Run: ``python examples/continuous_batching.py`` (needs ``pip install 'kvpools[hf]'``).  It prints what the plan
says fits, how many requests it held at once, and whether every output matched.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import kvpools_core
from kvpools_core.integrations.transformers import KvpoolsCache, cache_kwargs, plan_for_config
from kvpools_core.values import Serving


@dataclass
class Request:
    """A prompt, how many tokens to generate, and what was generated."""

    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    row: int | None = None

    def done(self, eos_token_id: int | None) -> bool:
        """Finished: ``max_new_tokens`` generated, or the end-of-sequence token (as ``generate`` stops)."""
        return len(self.output) == self.max_new_tokens or (bool(self.output) and self.output[-1] == eos_token_id)


@dataclass
class Run:
    """What a run did: the requests (outputs filled), its peak concurrency, forward steps and seconds."""

    requests: list[Request]
    peak_running: int
    steps: int
    seconds: float


def footprint(request: Request, page_size: int) -> int:
    """Slots a request holds at its end, in whole pages: the prompt and every generated token but the last."""
    tokens = len(request.prompt) + request.max_new_tokens - 1
    return -(-tokens // page_size) * page_size


def serve(model: Any, cache: KvpoolsCache, requests: Sequence[Request]) -> Run:
    """Run every request to completion, admitting while the pools have room; greedy decoding."""
    page_size, capacity = cache.page_size, cache.pools.plan.max_total_num_tokens
    eos = model.generation_config.eos_token_id
    waiting = collections.deque(requests)
    running: dict[int, Request] = {}
    reserved, peak, steps, start = 0, 0, 0, time.perf_counter()
    with torch.no_grad():
        while waiting or running:
            while waiting and reserved + footprint(waiting[0], page_size) <= capacity:
                row = cache.add_request()
                if row is None:
                    break  # every request-table row is taken: the plan's max_running_requests
                request = waiting.popleft()
                request.row = row
                reserved += footprint(request, page_size)
                running[row] = request
                cache.select([row])
                prompt = torch.tensor([request.prompt])
                logits = model(
                    input_ids=prompt,
                    attention_mask=cache.attention_mask(prompt.shape[1]),
                    position_ids=torch.arange(prompt.shape[1])[None],
                    **cache_kwargs(model, cache),
                ).logits
                steps += 1
                request.output.append(int(logits[0, -1].argmax()))
            if not running:
                raise RuntimeError(
                    f"A request needs {footprint(waiting[0], page_size)} slots but the plan has {capacity}: "
                    "plan with more memory or shorten the request."
                )
            peak = max(peak, len(running))
            finished = [row for row, r in running.items() if r.done(eos)]
            for row in finished:
                reserved -= footprint(running.pop(row), page_size)
            if finished:
                cache.release(finished)
            if not running:
                continue
            rows = list(running)
            cache.select(rows)
            last = torch.tensor([[running[row].output[-1]] for row in rows])
            positions = torch.tensor([[cache.length(row)] for row in rows])
            logits = model(
                input_ids=last,
                attention_mask=cache.attention_mask(1),
                position_ids=positions,
                **cache_kwargs(model, cache),
            ).logits
            steps += 1
            for row, token in zip(rows, logits[:, -1].argmax(-1).tolist(), strict=True):
                running[row].output.append(int(token))
    return Run(list(requests), peak, steps, time.perf_counter() - start)


def one_at_a_time(model: Any, request: Request) -> list[int]:
    """The reference: transformers' own generate and cache, one request alone (greedy, stops at EOS)."""
    prompt = torch.tensor([request.prompt])
    out = model.generate(
        input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=request.max_new_tokens, do_sample=False
    )
    return [int(t) for t in out[0, prompt.shape[1] :]]


def tiny_llama(seed: int = 0) -> Any:
    """A 2-layer GQA Llama, hidden 64, float32 (so batched and single-request matmuls agree to the bit)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        dtype="float32",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def mixed_requests(count: int, seed: int = 1) -> list[Request]:
    """``count`` requests: prompts of 2..40 tokens, 4..48 new tokens, drawn from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    requests = []
    for _ in range(count):
        prompt_len = int(torch.randint(2, 41, (1,), generator=generator))
        new_tokens = int(torch.randint(4, 49, (1,), generator=generator))
        prompt = torch.randint(3, 256, (prompt_len,), generator=generator).tolist()
        requests.append(Request(prompt, new_tokens))
    return requests


def build_pools(model: Any, *, page_size: int, max_running_requests: int, memory: str) -> kvpools_core.building.Pools:
    """Plan the model's config through kvpools (float32 KV: the model's dtype) and build it on the CPU."""
    serving = Serving(
        platform="cpu", page_size=page_size, kv_cache_dtype="fp32", max_running_requests=max_running_requests
    )
    return kvpools_core.build(plan_for_config(model.config, serving, memory=memory), "cpu")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-running-requests", type=int, default=12)
    parser.add_argument("--memory", default="1MiB", help="the KV budget the plan divides (default 1MiB)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: threads only contend
    model = tiny_llama()
    pools = build_pools(
        model, page_size=args.page_size, max_running_requests=args.max_running_requests, memory=args.memory
    )
    plan = pools.plan
    requests = mixed_requests(args.requests)
    run = serve(model, KvpoolsCache(pools), requests)
    mismatched = [i for i, r in enumerate(run.requests) if r.output != one_at_a_time(model, r)]
    print(
        f"plan: {plan.max_total_num_tokens} KV slots (page size {args.page_size}), "
        f"{plan.max_running_requests} request rows\n"
        f"served {len(requests)} requests in {run.steps} forward steps ({run.seconds:.1f} s), "
        f"at most {run.peak_running} at once\n"
        f"outputs identical to one-at-a-time generation: {len(requests) - len(mismatched)}/{len(requests)}"
    )
    return 1 if mismatched else 0


if __name__ == "__main__":
    raise SystemExit(main())
