"""Hand-computed sizes: the arithmetic is written in each test, so a formula change shows up here.

Llama-3.1-8B: 32 layers, 8 KV heads, head_dim 128, context 131072.
Llama-3.1-70B: 80 layers, 8 KV heads, head_dim 128, context 131072.
Qwen3-8B: 36 layers, 8 KV heads, head_dim 128, context 40960.
"""

from __future__ import annotations

import pytest

from kvpools_core import InsufficientMemoryError, Registry, Serving, plan

GiB = 1 << 30
BUDGET = 60 * GiB  # 64,424,509,440 B

MODELS = {"llama-3.1-8b": (32, 131072), "llama-3.1-70b": (80, 131072), "qwen3-8b": (36, 40960)}


def sglang_cell(layers: int, tp: int, kv: str) -> int:
    heads = max(1, 8 // tp)  # 8 KV heads; replicated once TP exceeds them
    if kv == "bf16":
        return heads * (128 + 128) * layers * 2
    if kv == "fp8_e4m3":
        return heads * (128 + 128) * layers * 1
    # fp4: packed data halves, plus one uint8 scale per 16 K and 16 V values
    return heads * (128 + 128) * layers * 1 // 2 + heads * 128 * layers * 2 * 1 // 16


def sglang_requests(tokens: int, context: int) -> int:
    return min(max(min(int(tokens / context * 512), 4096), 2048), tokens // 2)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3", "fp4_e2m1"])
def test_sglang_accounting_matches_the_seed_formula(
    registry: Registry, model: str, tp: int, page: int, kv: str
) -> None:
    layers, context = MODELS[model]
    result = plan(
        model,
        Serving(tp_size=tp, page_size=page, kv_cache_dtype=kv, accounting="sglang"),
        memory=BUDGET,
        registry=registry,
    )
    cell = sglang_cell(layers, tp, kv)
    tokens = BUDGET // cell // page * page
    assert result.cell.sglang_bytes_per_token == cell
    assert result.max_total_num_tokens == tokens
    assert result.max_running_requests == sglang_requests(tokens, context)


def test_llama_8b_bf16_tp1_spelled_out(registry: Registry) -> None:
    result = plan("llama-3.1-8b", Serving(accounting="sglang"), memory=BUDGET, registry=registry)
    # 8 heads x (128 + 128) x 32 layers x 2 bytes = 131,072 B/token; 60 GiB / 128 KiB = 491,520 tokens
    assert result.cell.sglang_bytes_per_token == 131072
    assert result.max_total_num_tokens == 491520
    # int(491520 / 131072 * 512) = 1920, clamped up to 2048
    assert result.max_running_requests == 2048


def test_fp4_llama_8b_tokens_spelled_out(registry: Registry) -> None:
    result = plan(
        "llama-3.1-8b",
        Serving(kv_cache_dtype="fp4_e2m1", page_size=64, accounting="sglang"),
        memory=BUDGET,
        registry=registry,
    )
    # 8*256*32/2 + 8*128*32*2/16 = 32768 + 4096 = 36864 B; 64424509440 // 36864 = 1747626 -> page 64: 1747584
    assert result.cell.sglang_bytes_per_token == 36864
    assert result.max_total_num_tokens == 1747584


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3", "fp4_e2m1"])
def test_exact_accounting_charges_padding_table_and_allocator(
    registry: Registry, model: str, tp: int, page: int, kv: str
) -> None:
    layers, context = MODELS[model]
    result = plan(model, Serving(tp_size=tp, page_size=page, kv_cache_dtype=kv), memory=BUDGET, registry=registry)
    tokens, reqs = result.max_total_num_tokens, result.max_running_requests
    heads = max(1, 8 // tp)
    if kv == "fp4_e2m1":
        per_token = layers * heads * (128 // 2 + 128 // 2 + 128 // 16 + 128 // 16)
    else:
        per_token = layers * heads * 256 * (2 if kv == "bf16" else 1)
    row = (context + 4) * 4  # int32 request-table row: context + 4 columns of headroom
    allocator = 8 * (tokens // page) + (0 if page == 1 else 8 * page)

    def whole_plan(t: int) -> int:
        r = sglang_requests(t, context)
        alloc_bytes = 8 * (t // page) + (0 if page == 1 else 8 * page)
        return (t + page) * per_token + (r + 1) * row + alloc_bytes

    assert result.cell.bytes_per_token == per_token
    assert reqs == sglang_requests(tokens, context)
    assert result.planned_bytes == (tokens + page) * per_token + (reqs + 1) * row + allocator
    assert result.planned_bytes <= BUDGET
    assert tokens % page == 0
    assert whole_plan(tokens + page) > BUDGET  # one more page would not fit


def test_exact_llama_8b_spelled_out(registry: Registry) -> None:
    result = plan("llama-3.1-8b", Serving(), memory=BUDGET, registry=registry)
    # (T + 1) * 131072 KV + 2049 rows * 131076 * 4 B + 8 B per slot of free list <= budget
    # T <= (64424509440 - 131072 - 2049 * 524304) / (131072 + 8) = 483293.3
    assert result.max_total_num_tokens == 483293
    assert result.pool("req_to_token").bytes == 2049 * 524304
    assert result.pool("kv").bytes == 483294 * 131072


def test_user_token_cap_and_its_warning(registry: Registry) -> None:
    capped = plan(
        "qwen3-8b",
        Serving(max_total_tokens=100_003, page_size=16, accounting="sglang"),
        memory=BUDGET,
        registry=registry,
    )
    assert capped.max_total_num_tokens == 100_000  # the cap, page aligned
    assert capped.sizing.notes == ()
    above = plan("qwen3-8b", Serving(max_total_tokens=10**9, accounting="sglang"), memory=BUDGET, registry=registry)
    assert above.max_total_num_tokens == BUDGET // 147456
    assert any("is larger than the profiled value" in n for n in above.sizing.notes)


def test_requests_per_dp_worker_and_reduction_warning(registry: Registry) -> None:
    serving = Serving(tp_size=8, dp_size=8, enable_dp_attention=True, max_running_requests=1024, accounting="sglang")
    result = plan("llama-3.1-8b", serving, memory=BUDGET, registry=registry)
    # DP attention: attention TP = 8 / 8 = 1 -> 8 heads per rank; requests split over 8 workers
    assert result.cell.sglang_bytes_per_token == 131072
    assert result.max_running_requests == 1024 // 8
    tiny = plan(
        "llama-3.1-8b", Serving(max_running_requests=4096, accounting="sglang"), memory=131072 * 1000, registry=registry
    )
    assert tiny.max_running_requests == 500  # tokens // 2
    assert any("reduced from the requested 4096 to 500" in n for n in tiny.sizing.notes)


def test_pipeline_stages_split_layers_and_sync_to_the_smallest(registry: Registry) -> None:
    # 80 layers over 3 stages: 26, 27, 27 (the last stages take the remainder)
    stage0 = plan("llama-3.1-70b", Serving(pp_size=3, pp_rank=0, accounting="sglang"), memory=BUDGET, registry=registry)
    assert stage0.cell.num_layers == 26
    # every stage keeps the smallest stage's tokens: 27 layers x 8 x 256 x 2 = 110592 B/token
    assert stage0.max_total_num_tokens == BUDGET // 110592
    stage2 = plan("llama-3.1-70b", Serving(pp_size=3, pp_rank=2, accounting="sglang"), memory=BUDGET, registry=registry)
    assert stage2.cell.num_layers == 27
    assert stage2.max_total_num_tokens == BUDGET // 110592


def test_not_enough_memory(registry: Registry) -> None:
    with pytest.raises(InsufficientMemoryError, match="Not enough memory for the KV cache") as info:
        plan("llama-3.1-70b", Serving(page_size=64), memory="1MiB", registry=registry)
    assert "page_size" in str(info.value) and "memory" in str(info.value) and "--" not in str(info.value)


def test_profiled_budget_follows_sglang_arithmetic(registry: Registry) -> None:
    # 80 GiB free, 16 GiB weights, mem_fraction_static 0.85: slack = 80 x 0.15 = 12 GiB -> 52 GiB
    result = plan(
        "llama-3.1-8b",
        Serving(mem_fraction_static=0.85, accounting="sglang"),
        free_memory="80GiB",
        weights_memory="16GiB",
        registry=registry,
    )
    assert result.budget.budget_bytes == int((80 - 16 - 80 * (1 - 0.85)) * GiB)
    with pytest.raises(InsufficientMemoryError, match=r"above 0\.813") as info:
        # 80 GiB free, 65 GiB weights: available 15 GiB; minimum fraction = 1 - 15/80 = 0.8125
        plan(
            "llama-3.1-8b",
            Serving(mem_fraction_static=0.8),
            free_memory="80GiB",
            weights_memory="65GiB",
            registry=registry,
        )
    assert "mem_fraction_static" in str(info.value)


def test_eagle_and_dflash_scale_the_cell(registry: Registry) -> None:
    eagle = plan(
        "llama-3.1-8b",
        Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=1, accounting="sglang"),
        memory=BUDGET,
        registry=registry,
    )
    assert eagle.cell.sglang_bytes_per_token == int(131072 * (1 + 1 / 32))  # 135168
    dflash = plan(
        "llama-3.1-8b",
        Serving(
            speculative_algorithm="DFLASH",
            speculative_draft_num_layers=5,
            speculative_num_draft_tokens=16,
            accounting="sglang",
        ),
        memory=BUDGET,
        registry=registry,
    )
    assert dflash.cell.sglang_bytes_per_token == -(-131072 * 37 // 32)  # ceil(131072 * (32 + 5) / 32)
    assert eagle.pool("draft_kv").bytes_per_slot == 131072 // 32


def test_nextn_uses_the_models_own_mtp_layers(registry: Registry) -> None:
    result = plan(
        "mimo-7b-base", Serving(speculative_algorithm="NEXTN", accounting="sglang"), memory=BUDGET, registry=registry
    )
    assert result.serving.speculative_draft_num_layers == 1  # num_nextn_predict_layers
    assert result.cell.sglang_bytes_per_token == int(8 * 256 * 36 * 2 * (1 + 1 / 36))
