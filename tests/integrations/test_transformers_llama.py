"""Llama (GQA) through kvpools pools: greedy tokens identical to transformers' own cache, pools really used."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch
from transformers import DynamicCache

import kvpools_core
from kvpools_core.errors import ConfigError, KvpoolsError, UnsupportedCombinationError
from kvpools_core.integrations.transformers import KvpoolsCache, PoolFullError, cache_kwargs, plan_for_config
from kvpools_core.values import Serving

from .tiny import NEW_TOKENS, PROMPT_LENGTHS, greedy, left_padded, llama


def _build(model: object, page_size: int, memory: str = "4MiB", **serving: object) -> kvpools_core.building.Pools:
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=page_size, **serving), memory=memory)  # type: ignore[attr-defined, arg-type]
    return kvpools_core.build(plan, "cpu", checked=True)


@pytest.mark.parametrize("page_size", [16, 1])
def test_generate_is_token_identical_and_the_pool_holds_the_real_tokens(page_size: int) -> None:
    model = llama()
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    reference_cache = DynamicCache(config=model.config)
    reference = greedy(model, ids, mask, **cache_kwargs(model, reference_cache))
    pools = _build(model, page_size)
    free_before = pools.allocator.available_size()
    cache = KvpoolsCache(pools, attention_mask=mask)

    out = greedy(model, ids, mask, **cache_kwargs(model, cache))

    assert out.shape == (len(PROMPT_LENGTHS), max(PROMPT_LENGTHS) + NEW_TOKENS)
    assert torch.equal(out, reference)
    # only real tokens are stored: the prompt, then every generated token but the last (never fed back)
    stored = [n + NEW_TOKENS - 1 for n in PROMPT_LENGTHS]
    assert [cache.length(row) for row in cache.requests] == stored
    pages = sum(-(-n // page_size) for n in stored)
    assert free_before - pools.allocator.available_size() == pages * page_size
    # the pool, read through the request table, holds exactly transformers' K/V of the real positions
    width = reference_cache.get_seq_length()
    for layer in range(model.config.num_hidden_layers):
        keys, values = reference_cache.layers[layer].keys, reference_cache.layers[layer].values
        for i, row in enumerate(cache.requests):
            slots = pools.req_to_token_pool.req_to_token[row, : stored[i]].long()
            # position p sits at page * page_size + p % page_size, each page one run (SGLang's paged layout)
            pages = slots // page_size
            assert torch.equal(slots % page_size, torch.arange(len(slots)) % page_size)
            assert torch.equal(pages, pages[::page_size].repeat_interleave(page_size)[: len(slots)])
            k, v = pools.kv_pool.get_kv(layer, slots)
            assert torch.equal(k, keys[i, :, width - stored[i] :].transpose(0, 1))
            assert torch.equal(v, values[i, :, width - stored[i] :].transpose(0, 1))
    cache.release()
    assert pools.allocator.available_size() == free_before
    assert pools.req_to_token_pool.available_size() == pools.plan.max_running_requests


def test_a_corrupted_pool_changes_the_tokens() -> None:
    """The attention really reads the pool: zeroing a layer's K after the prompt changes what is generated."""
    model = llama()
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    pools = _build(model, 16)
    cache = KvpoolsCache(pools, attention_mask=mask)
    prompt_step = model(input_ids=ids, attention_mask=mask, **cache_kwargs(model, cache))
    clean = prompt_step.logits[:, -1].argmax(-1)
    pools.kv_pool.kv.k_buffer[0].zero_()
    step_mask = torch.cat([mask, torch.ones(len(PROMPT_LENGTHS), 1, dtype=mask.dtype)], 1)
    corrupted = model(input_ids=clean[:, None], attention_mask=step_mask, **cache_kwargs(model, cache)).logits[:, -1]
    fresh_pools = _build(model, 16)
    fresh = KvpoolsCache(fresh_pools, attention_mask=mask)
    model(input_ids=ids, attention_mask=mask, **cache_kwargs(model, fresh))
    intact = model(input_ids=clean[:, None], attention_mask=step_mask, **cache_kwargs(model, fresh)).logits[:, -1]
    assert not torch.equal(corrupted, intact)


def test_right_padding_is_refused_with_the_fix() -> None:
    model = llama()
    _, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    with pytest.raises(ConfigError, match="left-padded attention_mask"):
        KvpoolsCache(_build(model, 16), attention_mask=mask.flip(1))


def test_a_pool_too_small_for_the_batch_is_a_clear_error_not_a_crash() -> None:
    model = llama()
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    pools = _build(model, 16, max_total_tokens=128)
    assert pools.plan.max_total_num_tokens == 128
    with pytest.raises(PoolFullError, match="free slots"):
        greedy(model, ids, mask, **cache_kwargs(model, KvpoolsCache(pools, attention_mask=mask)))


def test_a_pool_of_another_dtype_is_refused_rather_than_rounding() -> None:
    """A float32 config plans float16 KV (SGLang serves float32 checkpoints in float16): say so, don't round."""
    model = llama("float32")
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    cache = KvpoolsCache(_build(model, 16), attention_mask=mask)
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        model(input_ids=ids, attention_mask=mask, **cache_kwargs(model, cache))


def test_float32_with_an_fp32_pool_is_token_identical() -> None:
    model = llama("float32")
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    reference = greedy(model, ids, mask)
    cache = KvpoolsCache(_build(model, 1, kv_cache_dtype="fp32"), attention_mask=mask)
    assert torch.equal(greedy(model, ids, mask, **cache_kwargs(model, cache)), reference)


def test_beam_search_is_refused() -> None:
    model = llama()
    ids, mask = left_padded(PROMPT_LENGTHS[:2], model.config.vocab_size)
    cache = KvpoolsCache(_build(model, 16), attention_mask=mask)
    with pytest.raises(KvpoolsError, match="num_beams=1"):
        model.generate(input_ids=ids, attention_mask=mask, **cache_kwargs(model, cache), num_beams=2, max_new_tokens=4)


def test_plan_for_config_plans_a_transformers_config_like_a_config_file() -> None:
    model = llama()
    plan = plan_for_config(model.config.to_dict(), Serving(platform="cpu", page_size=16), memory="4MiB")
    assert plan.model.architecture == "mha"
    assert [layer.num_kv_heads for layer in plan.model.layers] == [2, 2]
    assert plan.model.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="PretrainedConfig or a dict"):
        plan_for_config(42)


def test_a_plan_of_layers_the_cache_does_not_store_is_refused() -> None:
    """DeepSeek sparse attention adds an indexer key per token that transformers' cache calls never hand over."""
    plan = kvpools_core.plan("deepseek-v3.2", Serving(platform="cpu"), memory="8GiB")
    with pytest.raises(UnsupportedCombinationError, match="does not store alike"):
        KvpoolsCache(kvpools_core.build(plan, "meta"))


def test_the_request_lifecycle_refuses_unknown_rows_and_gives_everything_back() -> None:
    model = llama()
    pools = _build(model, 16)
    cache = KvpoolsCache(pools)
    rows = [cache.add_request() for _ in range(pools.plan.max_running_requests)]
    assert None not in rows and cache.add_request() is None  # every request-table row is taken
    with pytest.raises(ConfigError, match="not live requests"):
        cache.select([10**6])
    first = rows[0]
    assert first is not None
    cache.select([first])
    prompt = torch.arange(3, 10)[None]
    model(input_ids=prompt, attention_mask=cache.attention_mask(7), **cache_kwargs(model, cache))
    assert cache.length(first) == 7 and pools.allocator.available_size() < pools.plan.max_total_num_tokens
    cache.release()
    with pytest.raises(ConfigError, match="not live requests"):
        cache.release([first])
    assert pools.allocator.available_size() == pools.plan.max_total_num_tokens
    assert pools.req_to_token_pool.available_size() == pools.plan.max_running_requests
