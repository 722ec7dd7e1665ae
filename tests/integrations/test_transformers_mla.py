"""An MLA model (DeepSeek-V3 style) through the ``mla`` plugin's pool: transformers 5 caches the compressed
latent and the rope key, which the pool stores as SGLang's one latent row per token per layer."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch
from transformers import DynamicCache

import kvpools_core
from kvpools_core.integrations.transformers import KvpoolsCache, cache_kwargs, plan_for_config
from kvpools_core.values import Serving

from .tiny import NEW_TOKENS, PROMPT_LENGTHS, deepseek_v3, greedy, left_padded


@pytest.mark.parametrize("page_size", [16, 1])
def test_mla_generation_is_token_identical_and_the_pool_holds_the_latent(page_size: int) -> None:
    model = deepseek_v3()
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    reference_cache = DynamicCache(config=model.config)
    reference = greedy(model, ids, mask, **cache_kwargs(model, reference_cache))
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=page_size), memory="4MiB")
    assert plan.model.architecture == "mla"
    # one latent row (kv_lora_rank + qk_rope_head_dim) of bf16 per token per layer: SGLang's MLA cell
    assert plan.pool("kv").bytes_per_slot == 2 * (32 + 16) * 2
    pools = kvpools_core.build(plan, "cpu", checked=True)
    cache = KvpoolsCache(pools, attention_mask=mask)

    out = greedy(model, ids, mask, **cache_kwargs(model, cache))

    assert torch.equal(out, reference)
    width = reference_cache.get_seq_length()
    for i, row in enumerate(cache.requests):
        n = PROMPT_LENGTHS[i] + NEW_TOKENS - 1
        assert cache.length(row) == n
        slots = pools.req_to_token_pool.req_to_token[row, :n].long()
        for layer in range(2):
            latent, rope = pools.kv_pool.get_mla_kv(layer, slots)
            assert torch.equal(latent, reference_cache.layers[layer].keys[i, :, width - n :].transpose(0, 1))
            assert torch.equal(rope, reference_cache.layers[layer].values[i, :, width - n :].transpose(0, 1))
