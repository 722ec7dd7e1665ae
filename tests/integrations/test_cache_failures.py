"""KvpoolsCache when something goes wrong: a forward that raises part-way, a request past the plan's context
length, a double free, pools without storage.  Each ends in a kvpools error or in the tokens a clean run gives,
with every slot and request-table row given back (issue 29)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from transformers import DynamicCache

import kvpools_core
from kvpools_core.errors import AllocatorError, ConfigError, UnsupportedCombinationError
from kvpools_core.integrations.transformers import KvpoolsCache, PoolFullError, cache_kwargs, plan_for_config
from kvpools_core.values import Serving

from .tiny import greedy, left_padded, llama, qwen3_next


def _pools(model: Any, page_size: int, checked: bool = True, **serving: Any) -> Any:
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=page_size, **serving), memory="8MiB")
    return kvpools_core.build(plan, "cpu", checked=checked)


@contextmanager
def _raising_once(module: torch.nn.Module) -> Iterator[None]:
    """``module``'s next forward raises (an OOM, an interrupt, a bug in a hook), then it works again."""
    original = module.forward

    def fail(*args: Any, **kwargs: Any) -> Any:
        module.forward = original  # type: ignore[method-assign]
        raise RuntimeError("injected failure")

    module.forward = fail  # type: ignore[method-assign]
    try:
        yield
    finally:
        module.forward = original  # type: ignore[method-assign]


def _decode(model: Any, cache: Any, ids: torch.Tensor, mask: torch.Tensor, steps: int, fail: Any = None) -> Any:
    """Greedy tokens of a prompt forward and ``steps - 1`` decode steps; with ``fail`` (a module inside the model),
    the prompt forward and one decode step first raise there, part-way through the model, and are retried."""
    tokens = []
    step_ids, step_mask = ids, mask
    for step in range(steps):
        if fail is not None and step in (0, steps // 2):
            with _raising_once(fail), pytest.raises(RuntimeError, match="injected failure"):
                model(input_ids=step_ids, attention_mask=step_mask, **cache_kwargs(model, cache))
        logits = model(input_ids=step_ids, attention_mask=step_mask, **cache_kwargs(model, cache)).logits[:, -1]
        step_ids = logits.argmax(-1, keepdim=True)
        step_mask = torch.cat([step_mask, torch.ones_like(step_mask[:, :1])], 1)
        tokens.append(step_ids)
    return torch.cat(tokens, 1)


@pytest.mark.parametrize("page_size", [16, 1])
def test_a_forward_that_raises_part_way_and_is_retried_changes_nothing(page_size: int) -> None:
    """Defect: the first layer's step stayed in the cache when a later layer raised, so the retry stored the
    step's tokens twice (a phantom token per request) and silently generated other tokens.  Now a forward's
    tokens become the cache's at its last layer; a retry rolls the unfinished one back, freeing its pages."""
    model = llama()
    ids, mask = left_padded((5, 9, 13, 3), model.config.vocab_size)
    reference = _decode(model, DynamicCache(config=model.config), ids, mask, steps=12)
    pools = _pools(model, page_size)
    free_before = pools.allocator.available_size()
    cache = KvpoolsCache(pools, attention_mask=mask)

    out = _decode(model, cache, ids, mask, steps=12, fail=model.model.layers[0].mlp)

    assert torch.equal(out, reference)
    assert [cache.length(row) for row in cache.requests] == [n + 11 for n in (5, 9, 13, 3)]
    cache.release()
    assert pools.allocator.available_size() == free_before


def test_a_recurrent_forward_that_raises_part_way_and_is_retried_changes_nothing() -> None:
    """The same for a hybrid: the recurrent layer before the failure must not have stored its new state."""
    model = qwen3_next()
    ids, mask = left_padded((5, 9), model.config.vocab_size)
    reference = _decode(model, DynamicCache(config=model.config), ids, mask, steps=6)
    pools = _pools(model, 16)
    free_before = pools.allocator.available_size()
    cache = KvpoolsCache(pools, attention_mask=mask)

    out = _decode(model, cache, ids, mask, steps=6, fail=model.model.layers[2].mlp)

    assert torch.equal(out, reference)
    cache.release()
    assert pools.allocator.available_size() == free_before


def test_an_abandoned_forward_gives_its_pages_back_on_release() -> None:
    model = llama()
    ids, mask = left_padded((5, 9), model.config.vocab_size)
    pools = _pools(model, 16)
    free_before = pools.allocator.available_size()
    cache = KvpoolsCache(pools, attention_mask=mask)
    with _raising_once(model.model.layers[0].mlp), pytest.raises(RuntimeError, match="injected failure"):
        model(input_ids=ids, attention_mask=mask, **cache_kwargs(model, cache))
    assert pools.allocator.available_size() < free_before  # the unfinished step holds its pages
    cache.release()
    assert pools.allocator.available_size() == free_before


@pytest.mark.parametrize("page_size", [16, 1])
def test_generating_past_the_context_length_is_a_clear_error_and_leaks_nothing(page_size: int) -> None:
    """Defect: the request table's row ran out and ``req_to_token`` raised a raw ``IndexError`` after the step's
    slots were allocated, leaking them (8 at page size 1, 32 at 16).  Now the step is refused before it
    allocates anything, naming the context length."""
    model = llama()
    ids, mask = left_padded((5, 9, 13, 3, 2, 7, 11, 6), model.config.vocab_size)
    pools = _pools(model, page_size, context_length=24)
    row_len = pools.req_to_token_pool.max_context_len
    free_before = pools.allocator.available_size()
    cache = KvpoolsCache(pools, attention_mask=mask)
    with pytest.raises(PoolFullError, match=f"context length: its request-table row holds {row_len} slots"):
        greedy(model, ids, mask, **cache_kwargs(model, cache))
    assert max(cache.length(row) for row in cache.requests) == row_len  # every token that fitted was stored
    cache.release()
    assert pools.allocator.available_size() == free_before
    assert pools.req_to_token_pool.available_size() == pools.plan.max_running_requests


@pytest.mark.parametrize("page_size", [16, 1])
def test_a_double_free_is_named_at_release_and_everything_else_is_released(page_size: int) -> None:
    """Defect: slots freed behind the cache's back made ``release()`` fail at the first request with the
    allocator's bare message, leaving the other requests and their pages held.  Now the refused request is
    named and every other request, and every request-table row, is released."""
    model = llama()
    ids, mask = left_padded((5, 9, 13), model.config.vocab_size)
    pools = _pools(model, page_size)
    free_before = pools.allocator.available_size()
    cache = KvpoolsCache(pools, attention_mask=mask)
    model(input_ids=ids, attention_mask=mask, **cache_kwargs(model, cache))
    first = next(iter(cache.requests))
    pools.allocator.free(pools.req_to_token_pool.req_to_token[first, : cache.length(first)].long())
    with pytest.raises(AllocatorError, match=rf"release: .*request row\(s\) \[{first}\].*double free"):
        cache.release()
    assert not cache.requests
    assert pools.allocator.available_size() == free_before
    assert pools.req_to_token_pool.available_size() == pools.plan.max_running_requests


def test_releasing_a_request_twice_in_one_call_is_refused_before_anything_is_freed() -> None:
    model = llama()
    pools = _pools(model, 16)
    cache = KvpoolsCache(pools)
    row = cache.add_request()
    assert row is not None
    with pytest.raises(ConfigError, match=rf"rows \[{row}\] are given more than once"):
        cache.release([row, row])
    cache.release([row])
    assert pools.req_to_token_pool.available_size() == pools.plan.max_running_requests


def test_pools_built_on_the_meta_device_are_refused() -> None:
    """Defect: meta pools (shapes only) were accepted and the first forward raised a raw ``RuntimeError``."""
    model = llama()
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=16), memory="8MiB")
    with pytest.raises(UnsupportedCombinationError, match="meta device"):
        KvpoolsCache(kvpools_core.build(plan, "meta"))
