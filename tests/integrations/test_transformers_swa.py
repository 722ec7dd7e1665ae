"""A sliding-window model (Gemma-3 style: sliding and full layers) through the ``swa`` plugin's two pools, the
full→SWA mapping and the dual allocator, with the SWA slots of tokens beyond the window evicted as they slide out."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch
from transformers import DynamicCache

import kvpools_core
from kvpools_core.integrations.transformers import KvpoolsCache, cache_kwargs, plan_for_config
from kvpools_core.values import Serving

from .tiny import NEW_TOKENS, PROMPT_LENGTHS, SLIDING_WINDOW, gemma3, greedy, left_padded, mistral


@pytest.mark.parametrize("page_size", [16, 1])
def test_sliding_window_generation_is_token_identical_with_eviction(page_size: int) -> None:
    model = gemma3()
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    reference_cache = DynamicCache(config=model.config)
    reference = greedy(model, ids, mask, **cache_kwargs(model, reference_cache))
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=page_size), memory="4MiB")
    assert plan.model.architecture == "swa"
    assert {pool.name for pool in plan.pools} >= {"kv_full", "kv_swa", "full_to_swa", "swa_allocator"}
    pools = kvpools_core.build(plan, "cpu", checked=True)
    allocator = pools.allocator
    full_free, swa_free = allocator.full_available_size(), allocator.swa_available_size()
    cache = KvpoolsCache(pools, attention_mask=mask)

    out = greedy(model, ids, mask, **cache_kwargs(model, cache))

    assert torch.equal(out, reference)
    # the full pool keeps every token; the SWA pool only the pages the window still reaches: before the last step
    # a request held n - 1 tokens, so positions below (n - 1) - window + 1, in whole pages, were evicted
    stored = [n + NEW_TOKENS - 1 for n in PROMPT_LENGTHS]
    held = [-(-n // page_size) * page_size for n in stored]
    evicted = [max(0, n - SLIDING_WINDOW) // page_size * page_size for n in stored]
    assert full_free - allocator.full_available_size() == sum(held)
    assert swa_free - allocator.swa_available_size() == sum(h - e for h, e in zip(held, evicted, strict=True))
    assert sum(evicted) > sum(held) // 2  # the window is far shorter than the sequences: most SWA slots went back
    mapping = pools.kv_pool.full_to_swa_index_mapping
    width = reference_cache.get_seq_length()
    for i, row in enumerate(cache.requests):
        slots = pools.req_to_token_pool.req_to_token[row, : stored[i]].long()
        assert bool((mapping[slots[: evicted[i]]] == 0).all()) and bool((mapping[slots[evicted[i] :]] > 0).all())
        for layer in (1, 3):  # full layers: every real position, exactly transformers' K / V
            k, v = pools.kv_pool.get_kv(layer, slots)
            assert torch.equal(k, reference_cache.layers[layer].keys[i, :, width - stored[i] :].transpose(0, 1))
            assert torch.equal(v, reference_cache.layers[layer].values[i, :, width - stored[i] :].transpose(0, 1))
        for layer in (0, 2):  # sliding layers: the window transformers keeps, read from the SWA pool
            kept = SLIDING_WINDOW - 1
            k, v = pools.kv_pool.get_kv(layer, slots[-kept:])
            assert torch.equal(k, reference_cache.layers[layer].keys[i].transpose(0, 1))
            assert torch.equal(v, reference_cache.layers[layer].values[i].transpose(0, 1))
    cache.release()
    assert (allocator.full_available_size(), allocator.swa_available_size()) == (full_free, swa_free)


def test_eager_attention_is_token_identical_too() -> None:
    model = gemma3("eager")
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    reference = greedy(model, ids, mask)
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=16), memory="4MiB")
    cache = KvpoolsCache(kvpools_core.build(plan, "cpu"), attention_mask=mask)
    assert torch.equal(greedy(model, ids, mask, **cache_kwargs(model, cache)), reference)


@pytest.mark.parametrize("page_size", [16, 1])
def test_an_all_sliding_model_evicts_from_its_one_pool_and_frees_each_slot_once(page_size: int) -> None:
    """Mistral-7B-v0.1 style: every layer slides, so the SWA slot ids are the token ids and an evicted slot is
    free already when its request ends (the checked allocator refuses a second free)."""
    model = mistral()
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    reference = greedy(model, ids, mask)
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=page_size), memory="4MiB")
    assert [pool.name for pool in plan.pools if pool.name.startswith("kv")] == ["kv_swa"]
    pools = kvpools_core.build(plan, "cpu", checked=True)
    free = pools.allocator.available_size()
    cache = KvpoolsCache(pools, attention_mask=mask)

    assert torch.equal(greedy(model, ids, mask, **cache_kwargs(model, cache)), reference)

    stored = [n + NEW_TOKENS - 1 for n in PROMPT_LENGTHS]
    held = [-(-n // page_size) * page_size - max(0, n - SLIDING_WINDOW) // page_size * page_size for n in stored]
    assert free - pools.allocator.available_size() == sum(held)
    cache.release()
    assert pools.allocator.available_size() == free
