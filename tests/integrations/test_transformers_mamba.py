"""A linear-attention hybrid (Qwen3-Next) through the ``mamba`` plugin's pools: the full layers' K/V in the
hybrid KV pool, each request's conv and recurrent state in its slot of the state pool, found through the hybrid
request table (``HybridReqToTokenPool``)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch
from transformers import DynamicCache

import kvpools_core
from kvpools_core.errors import ConfigError
from kvpools_core.integrations.transformers import KvpoolsCache, cache_kwargs, plan_for_config
from kvpools_core.values import Serving

from .tiny import NEW_TOKENS, PROMPT_LENGTHS, greedy, left_padded, qwen3_next


@pytest.mark.parametrize("page_size", [16, 1])
def test_hybrid_generation_is_token_identical_and_the_state_slots_hold_the_state(page_size: int) -> None:
    model = qwen3_next()
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    reference_cache = DynamicCache(config=model.config)
    reference = greedy(model, ids, mask, **cache_kwargs(model, reference_cache))
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=page_size), memory="8MiB")
    assert plan.model.architecture == "mamba"
    pools = kvpools_core.build(plan, "cpu", checked=True)
    state_pool = pools.req_to_token_pool.mamba_pool
    assert state_pool.layer_ids == (0, 2)
    free_states = state_pool.available_size()
    cache = KvpoolsCache(pools, attention_mask=mask)

    out = greedy(model, ids, mask, **cache_kwargs(model, cache))

    assert torch.equal(out, reference)
    rows = list(cache.requests)
    assert free_states - state_pool.available_size() == len(rows)  # one state slot per request
    slots = pools.req_to_token_pool.get_mamba_indices(torch.tensor(rows)).long()
    for layer in (0, 2):
        conv, ssm = state_pool.layer_cache(layer)
        expected = reference_cache.layers[layer]
        # SGLang's pool keeps kernel - 1 conv columns: transformers' last ones (its first is shifted out unread)
        assert torch.equal(conv[0][slots], expected.conv_states[0][..., 1:])
        assert torch.equal(ssm[slots], expected.recurrent_states[0])
    width = reference_cache.get_seq_length()
    for i, row in enumerate(rows):  # the full-attention layers' K/V, as for a dense model
        n = PROMPT_LENGTHS[i] + NEW_TOKENS - 1
        k, v = pools.kv_pool.get_kv(1, pools.req_to_token_pool.req_to_token[row, :n].long())
        assert torch.equal(k, reference_cache.layers[1].keys[i, :, width - n :].transpose(0, 1))
        assert torch.equal(v, reference_cache.layers[1].values[i, :, width - n :].transpose(0, 1))
    cache.release()
    assert state_pool.available_size() == free_states


def test_state_layers_need_to_know_the_requests_and_refuse_mixed_prefill_and_decode() -> None:
    model = qwen3_next()
    ids, mask = left_padded(PROMPT_LENGTHS[:2], model.config.vocab_size)
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=16), memory="8MiB")
    pools = kvpools_core.build(plan, "cpu")
    with pytest.raises(ConfigError, match="attention_mask"):
        model(input_ids=ids, attention_mask=mask, **cache_kwargs(model, KvpoolsCache(pools)))
    cache = KvpoolsCache(pools)
    old, new = cache.add_request(), cache.add_request()
    assert old is not None and new is not None
    cache.select([old])
    model(input_ids=ids[:1, -5:], attention_mask=cache.attention_mask(5), **cache_kwargs(model, cache))
    cache.select([old, new])
    with pytest.raises(ConfigError, match="prefill and decode"):
        model(input_ids=ids[:, -1:], attention_mask=cache.attention_mask(1), **cache_kwargs(model, cache))
