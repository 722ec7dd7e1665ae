"""fp8 (e4m3) KV through the pool's quantising writes: every stored K/V is exactly the e4m3 rounding of
transformers' bf16 K/V, and the logits' error against the bf16 cache is measured (not token identity)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch
from transformers import DynamicCache

import kvpools_core
from kvpools_core.integrations.transformers import KvpoolsCache, cache_kwargs, plan_for_config
from kvpools_core.pools.quant import fp8_quantize
from kvpools_core.values import Serving

from .tiny import NEW_TOKENS, PROMPT_LENGTHS, greedy, left_padded, llama


@pytest.fixture(autouse=True)
def _serving_cpu_has_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """These pools are planned for the ``cpu`` platform, whose fp8 KV needs Intel AMX on the serving host (torch
    stores e4m3 on any CPU): pin the answer, so the test runs the same on every machine."""
    monkeypatch.setenv("KVPOOLS_CPU_AMX", "1")


def teacher_forced_logits(
    model: object, ids: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor, cache: object
) -> torch.Tensor:
    """Next-token logits ``(steps, batch, vocab)`` for the prompt then each of ``tokens``, fed whatever the cache
    makes of them: both caches see the same inputs, so the difference is the cache's alone."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    given = cache_kwargs(model, cache)
    out = [model(input_ids=ids, attention_mask=mask, position_ids=positions, **given).logits[:, -1]]  # type: ignore[operator]
    for step in range(tokens.shape[1]):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        positions = positions[:, -1:] + 1
        token = tokens[:, step : step + 1]
        out.append(model(input_ids=token, attention_mask=mask, position_ids=positions, **given).logits[:, -1])  # type: ignore[operator]
    return torch.stack(out).float()


def fp8_pools(page_size: int) -> kvpools_core.building.Pools:
    model = llama()
    serving = Serving(platform="cpu", page_size=page_size, kv_cache_dtype="fp8_e4m3")
    return kvpools_core.build(plan_for_config(model.config, serving, memory="4MiB"), "cpu")


@torch.no_grad()
def test_fp8_pool_stores_the_e4m3_rounding_and_the_logit_error_is_measured(
    record_property: pytest.RecordProperty,
) -> None:
    model = llama()
    ids, mask = left_padded(PROMPT_LENGTHS, model.config.vocab_size)
    generated = greedy(model, ids, mask)[:, ids.shape[1] : ids.shape[1] + NEW_TOKENS - 1]
    reference_cache = DynamicCache(config=model.config)
    reference = teacher_forced_logits(model, ids, mask, generated, reference_cache)
    pools = fp8_pools(16)
    assert pools.kv_pool.dtype == torch.float8_e4m3fn and pools.kv_pool.store_dtype == torch.uint8
    cache = KvpoolsCache(pools, attention_mask=mask)
    quantised = teacher_forced_logits(model, ids, mask, generated, cache)
    bf16_pools = kvpools_core.build(plan_for_config(model.config, Serving(platform="cpu", page_size=16), memory="4MiB"))
    exact = teacher_forced_logits(model, ids, mask, generated, KvpoolsCache(bf16_pools, attention_mask=mask))

    # the write path: each stored byte is e4m3's rounding of transformers' bf16 K / V at that position.  Layer 0's
    # K / V depend on the tokens alone (teacher-forced, the same for both caches); later layers' already carry the
    # fp8 attention of the layers below, so only layer 0 can be compared byte for byte
    width = reference_cache.get_seq_length()
    for i, row in enumerate(cache.requests):
        n = cache.length(row)
        slots = pools.req_to_token_pool.req_to_token[row, :n].long()
        keys = reference_cache.layers[0].keys[i, :, width - n :].transpose(0, 1)
        values = reference_cache.layers[0].values[i, :, width - n :].transpose(0, 1)
        assert torch.equal(
            pools.kv_pool.kv.k_buffer[0][slots], fp8_quantize(keys, torch.float8_e4m3fn).view(torch.uint8)
        )
        assert torch.equal(
            pools.kv_pool.kv.v_buffer[0][slots], fp8_quantize(values, torch.float8_e4m3fn).view(torch.uint8)
        )

    assert torch.equal(exact, reference)  # the same pools in bf16: no error at all, so the error below is fp8's
    error = (quantised - reference).abs()
    scale = reference.abs().max()
    record_property("fp8_max_abs_logit_error", float(error.max()))
    record_property("fp8_mean_abs_logit_error", float(error.mean()))
    record_property("bf16_max_abs_logit", float(scale))
    measured = f"max |dlogit| {float(error.max()):.4f}, mean {float(error.mean()):.5f}, max |logit| {float(scale):.3f}"
    print(f"fp8 e4m3 KV vs bf16: {measured}")
    assert float(error.max()) > 0  # the pool really quantised
    # e4m3 keeps 3 mantissa bits (relative rounding <= 2**-4 per element): the logits move by a fraction of
    # their range, never by their whole size
    assert float(error.max()) < float(scale) * 2**-2
