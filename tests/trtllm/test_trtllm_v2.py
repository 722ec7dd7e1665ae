"""DeepSeek-V4 under ``--accounting trtllm``: TensorRT-LLM's ``DeepseekV4CacheManager`` (a ``KVCacheManagerV2``) and
the V2 runtime's pool-ratio solve, against hand-computed numbers with the source lines cited (issue 35).

Sources (``NVIDIA/TensorRT-LLM``; the code index's stored copies, commits where it names one):

- ``_torch/attention_backend/sparse/deepseek_v4/cache_manager.py``@``10ce7685``: ``_build_cache_config`` (per layer:
  SWA window 128; compressed layers COMPRESS + COMPRESSOR_STATE/SCORE windowed ``(2 if ratio 4 else 1) x ratio``;
  ratio-4 layers INDEXER_COMPRESS + INDEXER_COMPRESSOR_STATE/SCORE), ``_get_attn_bytes_per_block``,
  ``get_cache_bytes_per_token`` / ``_estimate_bytes_per_token``, ``_get_cache_quota`` (+ 7 x 2 MiB), the typical step
  (1 context + ``max_batch_size - 1`` generation requests of ``max_seq_len``) and the constraint (one context request
  of ``max_seq_len``);
- ``.../deepseek_v4/deepseek_v4.py``@``58597602``: ``get_attn_dim`` / ``get_token_bytes`` (bf16 2 B, fp8 1 B,
  states fp32 4 B, indexer ``128 + 128 // 128 x 4 = 132`` B);
- ``runtime/kv_cache_manager_v2/_life_cycle_registry.py``@``1548780d`` (stale range ``(history + 1 - window) //
  tpb``), ``_storage/_config.py``@``1148a82f`` (``create_storage_config``), ``_storage_manager.py``@``00f6bd61``
  (``ratio_from_batch``, ``_compute_min_slots_from_constraints``, ``_slots_to_bytes``, ``cache_tier_granularity``,
  ``_compute_slot_count_for_level``), ``_storage/_core.py`` (``ratio_to_slot_count_list``, ``_grains_to_slots``);
- ``_torch/pyexecutor/_util.py`` ``configure_kv_cache_capacity`` (V2: ``max_gpu_total_bytes`` only, the user's
  ``max_tokens`` restored), ``kv_cache_manager_v2.py`` ``KVCacheManagerV2.__init__`` (quota, ``max_util_for_resume``
  0.95, ``blocks_in_primary_pool``), ``py_executor.py`` ``get_kv_cache_capacity``.

DeepSeek-V4-Flash: 43 layers, ``compress_ratios`` 0, 0, then 4 / 128 alternating (21 of ratio 4, 20 of 128),
``head_dim`` 448 + 64 = 512, ``index_head_dim`` 128, window 128.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpools_core.cli import main
from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.engines.trtllm.deployment_v2 import TrtllmV2PlanResult
from kvpools_core.engines.trtllm.manager_v2 import (
    gpu_granularity,
    grains_for_slots,
    grains_to_slots,
    pool_groups,
    ratio_to_slot_counts,
    stale_blocks,
)
from kvpools_core.errors import KvpoolsError, UnsupportedCombinationError
from kvpools_core.hookspecs import hookimpl
from kvpools_core.models import load_model
from kvpools_core.parts.trtllm import TrtllmLayer
from kvpools_core.parts.trtllm_v2 import TrtllmBuffer, TrtllmV2Layer
from kvpools_core.registry import Registry, get_registry
from kvpools_core.values import Serving

GiB = 1 << 30
MiB = 1 << 20
FLASH = "deepseek-v4-flash"


def flash(**kwargs: object) -> TrtllmV2PlanResult:
    options: dict[str, object] = {"memory": "60GiB", "tokens_per_block": 128, "max_seq_len": 65536, **kwargs}
    serving = options.pop("serving", Serving())
    result = plan_trtllm(FLASH, serving, **options)  # type: ignore[arg-type]
    assert isinstance(result, TrtllmV2PlanResult)
    return result


def test_flash_buffers_per_block_and_estimate_by_hand() -> None:
    """``_get_attn_bytes_per_block`` with 128-token blocks, bf16: SWA 512 x 2 x 128 = 131,072 B; COMPRESS of a ratio-4
    layer 1,024 x 32 = 32,768 B, of a ratio-128 layer 1,024 x 1; the overlapping (ratio 4) compressor's state and
    score 2 x 512 x 4 x 128 = 524,288 B each, the ratio-128 one's 512 x 4 x 128 = 262,144 B; INDEXER_COMPRESS 132 x 32
    = 4,224 B; the indexer compressor's state and score 2 x 128 x 4 x 128 = 131,072 B.

    ``get_cache_bytes_per_token`` (``_estimate_bytes_per_token``; COMPRESS and INDEXER_COMPRESS divided by the ratio,
    the windowed kinds counted in full): ratio-1 layers 1,024; ratio-4 layers 1,024 + 256 + 2 x 4,096 + 33 + 2 x 1,024
    = 11,553; ratio-128 layers 1,024 + 8 + 2 x 2,048 = 5,128; 2 x 1,024 + 21 x 11,553 + 20 x 5,128 = 347,221 B.  With
    an fp8 cache: 2 x 512 + 21 x (512 + 128 + 8,192 + 33 + 2,048) + 20 x (512 + 4 + 4,096) = 322,437 B."""
    result = flash()
    sizes = {
        (layer, kind): size
        for group in result.v2.groups
        for pools in group.pools
        for pool in pools
        for layer, kind in pool.buffers
        for size in [pool.block_bytes]
    }
    assert sizes[(0, "SWA")] == 131_072 and (0, "COMPRESS") not in sizes
    assert sizes[(2, "COMPRESS")] == 32_768 and sizes[(3, "COMPRESS")] == 1_024
    assert sizes[(2, "COMPRESSOR_STATE")] == sizes[(2, "COMPRESSOR_SCORE")] == 524_288
    assert sizes[(3, "COMPRESSOR_STATE")] == 262_144 and (3, "INDEXER_COMPRESS") not in sizes
    assert sizes[(2, "INDEXER_COMPRESS")] == 4_224
    assert sizes[(2, "INDEXER_COMPRESSOR_STATE")] == sizes[(2, "INDEXER_COMPRESSOR_SCORE")] == 131_072
    assert result.estimated_bytes_per_token == 347_221
    assert flash(serving=Serving(kv_cache_dtype="fp8_e4m3")).estimated_bytes_per_token == 322_437


def test_flash_pool_groups_by_hand() -> None:
    """``create_storage_config``: three life cycles (window 128: every SWA buffer and the ratio-128 compressor's
    state/score; no window: the compressed and indexer caches; window 8: the ratio-4 compressors'), each one's buffers
    coalesced by size and sorted largest first -- window 128: 20 x 2 x 262,144 = 10,485,760 and 43 x 131,072 =
    5,636,096; none: 21 x 32,768 = 688,128, 21 x 4,224 = 88,704, 20 x 1,024 = 20,480; window 8: 42 x 524,288 =
    22,020,096 and 42 x 131,072 = 5,505,024 -- three different size lists, so three pool groups."""
    groups = flash().v2.groups
    assert [group.windows for group in groups] == [(128,), (None,), (8,)]
    assert [group.slot_sizes for group in groups] == [
        (10_485_760, 5_636_096),
        (688_128, 88_704, 20_480),
        (22_020_096, 5_505_024),
    ]
    assert [len(group.layers) for group in groups] == [43, 41, 21]


def test_flash_ratio_solve_on_60_gib_by_hand() -> None:
    """60 GiB free after warm-up, fraction 0.9: ``max_gpu_total_bytes`` = 57,982,058,496 B (54 GiB) is the quota;
    granularity ``2 MiB << min(4, int(log2(54)))`` = 32 MiB, 1,728 grains.

    Typical step, ``max_seq_len`` 65,536 (512 blocks): the context request holds all 512 blocks of every group (history
    0, nothing stale); each of the 2,047 generation requests (history 65,535) holds 512 - (65,536 - 128) // 128 = 1
    block of the window-128 group, 512 - (65,536 - 8) // 128 = 1 of the window-8 group and all 512 of the window-less
    one: 2,559, 1,048,576 and 2,559 slots.  Bytes, each pool rounded up to 32 MiB: 800 + 430 grains = 41,271,951,360;
    21,504 + 2,772 + 640 grains = 836,042,227,712; 1,680 + 420 grains = 70,464,307,200; ratio 41,271,951,360 /
    947,778,486,272 = 0.0435...

    ``min_slots`` (the one-context-request constraint): 512 each, i.e. 160 + 86 = 246 grains, 336 + 84 = 420 grains.
    The ratio gives the window-128 group round(1,728 x 0.0435) = 75 grains (fewer than 512 slots) and the window-8
    group too few as well, so both are pinned to 512 slots and the window-less group takes the other 1,728 - 246 - 420
    = 1,062 grains: 44,636 slots (916 + 118 + 28 = 1,062 grains; 44,637 would need 1,063).  All 57,982,058,496 B used.
    """
    result = flash()
    solve = result.v2
    assert result.ranks[0].max_gpu_total_bytes == solve.quota == 57_982_058_496
    assert solve.granularity == 32 * MiB == gpu_granularity(57_982_058_496)
    assert solve.min_slots == (512, 512, 512)
    assert solve.ratios[0] == pytest.approx(41_271_951_360 / 947_778_486_272, rel=1e-12)
    assert solve.ratios[1] == pytest.approx(836_042_227_712 / 947_778_486_272, rel=1e-12)
    assert solve.slots == (512, 44_636, 512)
    assert grains_for_slots(44_636, (688_128, 88_704, 20_480), 32 * MiB) == 916 + 118 + 28 == 1_062
    assert grains_for_slots(44_637, (688_128, 88_704, 20_480), 32 * MiB) == 1_063
    assert solve.total_bytes == 57_982_058_496
    assert result.max_seq_len == 65_536 and not result.warnings


def test_flash_get_kv_cache_capacity_and_requests_by_hand() -> None:
    """``get_kv_cache_capacity()``: ``KVCacheManagerV2.get_kv_cache_stats`` sets ``allocated_bytes`` only, so
    PyExecutor reads ``blocks_in_primary_pool`` = ``get_page_index_upper_bound(0, KEY)``: layer 0's SWA buffer sits in
    the 43-buffer SWA pool of the window-128 group, 43 x 512 = 22,016 pages; ``tokensPerBlock`` 128; ``maxNumTokens``
    2,818,048.  The window-less group holds 44,636 x 128 = 5,713,408 tokens.

    Requests of L tokens: ceil(L / 128) blocks of the window-less group, one block of each windowed group (the SWA KV
    and compressor states are a fixed cost per request): 8k -> min(512, 44,636 // 64 = 697) = 512 (the SWA group
    binds); 32k -> 44,636 // 256 = 174; 64k -> 44,636 // 512 = 87."""
    result = flash()
    assert result.kv_cache_capacity() == {"maxNumBlocks": 22_016, "tokensPerBlock": 128, "maxNumTokens": 2_818_048}
    assert result.max_kv_tokens == 5_713_408
    assert [result.concurrency_at(length) for length in (8192, 32768, 65536)] == [512, 174, 87]
    assert result.concurrency_at(65537) is None


def test_max_gpu_total_bytes_caps_the_quota() -> None:
    """``--max_gpu_total_bytes 20GiB`` below the fraction's 54 GiB: ``KvCacheCreator`` writes min(54 GiB, 20 GiB) back
    and the manager takes it as its quota (21,474,836,480 B, 640 grains of 32 MiB).  With ``max_seq_len`` 32,768 (256
    blocks) the constraint pins 256 slots of each windowed group (80 + 43 and 168 + 42 grains) and the window-less
    group gets 640 - 123 - 210 = 307 grains: 12,873 slots; ``maxNumBlocks`` 43 x 256 = 11,008.  The YAML carries
    ``max_gpu_total_bytes`` (``trtllm-serve`` has no flag of that name: ``--extra_llm_api_options``)."""
    result = flash(max_seq_len=32768, max_gpu_total_bytes="20GiB")
    assert result.v2.quota == result.ranks[0].max_gpu_total_bytes == 20 * GiB
    assert result.v2.slots == (256, 12_873, 256)
    assert result.v2.total_bytes == 20 * GiB
    assert result.kv_cache_capacity() == {"maxNumBlocks": 11_008, "tokensPerBlock": 128, "maxNumTokens": 1_409_024}
    assert "  max_gpu_total_bytes: 21474836480" in result.extra_options_yaml()
    assert "--extra_llm_api_options kvpools-trtllm.yaml" in result.serve_command()
    assert result.concurrency_at(8192) == 12_873 // 64 == 201


def test_a_quota_below_the_constraint_is_raised_to_it_with_a_warning() -> None:
    """20 GiB with ``max_seq_len`` 65,536: the constraint pins 512 slots of every group, 246 + 14 + 420 = 680 grains =
    22,817,013,760 B, more than the 20 GiB quota; ``_compute_slot_count_for_level`` takes ``max(min
    quota, quota)``, so TensorRT-LLM's pools exceed max_gpu_total_bytes -- a warning, the pools as the runtime sizes
    them."""
    result = flash(max_gpu_total_bytes="20GiB")
    assert result.v2.level_quota == result.v2.min_quota == 22_817_013_760
    assert result.v2.slots[0] == result.v2.slots[2] == 512
    assert any("raises the quota of 21,474,836,480 B" in warning for warning in result.warnings)


def test_rounding_the_quota_up_to_a_grain_is_no_warning() -> None:
    """H200, TP 4: 140.40 GiB - kvpools' weights estimate, x 0.9 = 99,694,975,539 B; the level rounds it up to
    2,972 grains of 32 MiB = 99,723,771,904 B (``_compute_slot_count_for_level``: ``round_up(quota, granularity)``),
    which is TensorRT-LLM's own rounding, not the constraint raising the quota: no warning.  The constraint (one
    131,072-token context request, 1,024 blocks) pins 1,024 slots of each windowed group."""
    result = flash(memory=None, gpu="h200", serving=Serving(tp_size=4), max_seq_len=131072)
    assert result.v2.quota == result.ranks[0].available_kv_memory
    assert result.v2.level_quota == -(-result.v2.quota // (32 * MiB)) * 32 * MiB
    assert result.v2.level_quota > result.v2.quota and not result.warnings
    assert result.v2.slots[0] == result.v2.slots[2] == 1024


def test_the_default_max_seq_len_pins_more_than_the_gpu() -> None:
    """``max_seq_len`` 1,048,576 (the model's, 8,192 blocks): the one-context-request constraint pins 8,192 slots of
    every group -- 2,560 + 1,376 + 168 + 22 + 5 + 5,376 + 1,344 = 10,851 grains of 32 MiB = 364,099,141,632 B, more
    than 60 GiB: refused, naming --max_seq_len."""
    with pytest.raises(UnsupportedCombinationError, match=r"364,099,141,632 B.*Lower --max_seq_len"):
        plan_trtllm(FLASH, memory="60GiB", tokens_per_block=128)


def test_max_tokens_quota_is_get_cache_quota_over_max_util_for_resume() -> None:
    """``max_tokens`` 100,000: ``ceil((100,000 x 347,221 + 7 x 2 MiB) / 0.95)`` = ceil(34,736,780,064 / 0.95) =
    36,565,031,647 B, below the 54 GiB budget, so it is the quota."""
    result = flash(max_tokens=100_000)
    assert result.quota_from_max_tokens == result.v2.quota == 36_565_031_647
    assert result.max_seq_len == 65_536


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        # cache_manager.py@10ce7685: assert tokens_per_block in [128, 256].
        ({"tokens_per_block": None}, "TensorRT-LLM refuses --tokens_per_block 32.*128 or 256"),
        ({"tokens_per_block": 64}, "TensorRT-LLM refuses --tokens_per_block 64"),
        # cache_manager.py@10ce7685: assert dtype in [DataType.BF16, DataType.FP8].
        ({"serving": Serving(kv_cache_dtype="fp4_e2m1")}, "only support BF16 and FP8"),
        (
            {"num_nextn_predict_layers": 1},
            r"kvpools does not model MTP drafting beside .* a second DeepseekV4CacheManager .*"
            r"\(_split_kv_cache_budget_for_draft\)",
        ),
        ({"serving": Serving(pp_size=2)}, "kvpools does not model pipeline stages of"),
        ({"host_cache_size": "10GiB"}, "kvpools does not model the host tier of"),
        ({"max_attention_window": "128,65536"}, "kvpools does not model --max_attention_window"),
    ],
)
def test_refusals(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(KvpoolsError, match=match):
        flash(**kwargs)


def test_stale_range() -> None:
    """``AttnLifeCycle.get_stale_range``: ``max(0, (history + 1 - window) // tpb)`` blocks; none without a window."""
    assert stale_blocks(128, 65_535, 128) == 511
    assert stale_blocks(8, 65_535, 128) == 511
    assert stale_blocks(128, 0, 128) == 0
    assert stale_blocks(None, 65_535, 128) == 0


def _kv_layer(index: int, size: int, window: int | None, extra: int | None = None) -> TrtllmLayer:
    """A layer as ``test_storage_manager._make_config`` builds it: K and V buffers of ``size`` bytes per 32-token block
    (and block-quant K/V of ``extra`` bytes)."""
    buffers = [TrtllmBuffer(kind=role, entry_bytes=size // 32, window=window) for role in ("key", "value")]
    if extra is not None:
        buffers += [TrtllmBuffer(kind=role, entry_bytes=extra // 32, window=window) for role in ("kq", "vq")]
    return TrtllmLayer(
        index=index,
        num_kv_heads=1,
        head_dim=1,
        kv_factor=2,
        v2=TrtllmV2Layer(manager="KVCacheManagerV2", buffers=tuple(buffers)),
    )


def test_storage_config_matches_trtllms_storage_manager_tests() -> None:
    """TensorRT-LLM's ``tests/unittest/kv_cache_manager_v2_tests/test_storage_manager.py``@``00e84edd``
    (``TestStorageManagerInit``): 4 uniform layers -> 1 pool group, slot 4 x 2 x 8 KiB = 64 KiB; SWA on even layers ->
    2 life cycles merged into 1 group, slot 2 x 2 x 8 KiB; different sizes per life cycle -> 2 groups of 16 KiB and
    32 KiB; block quant 512 B -> 1 group, pools 32 KiB and 2,048 B, largest first."""
    uniform = pool_groups([_kv_layer(i, 8192, None) for i in range(4)], 32)
    assert len(uniform) == 1 and uniform[0].slot_sizes == (4 * 2 * 8192,)
    swa = pool_groups([_kv_layer(i, 8192, 100 if i % 2 == 0 else None) for i in range(4)], 32)
    assert len(swa) == 1 and swa[0].windows == (100, None) and swa[0].slot_sizes == (2 * 2 * 8192,)
    mixed = pool_groups([_kv_layer(0, 8192, None), _kv_layer(1, 16384, 100)], 32)
    assert sorted(group.slot_sizes for group in mixed) == [(16384,), (32768,)]
    quant = pool_groups([_kv_layer(i, 8192, None, extra=512) for i in range(2)], 32)
    assert len(quant) == 1 and quant[0].slot_sizes == (2 * 2 * 8192, 2 * 2 * 512)


def test_ratio_to_slot_count_list_preserves_min_slots() -> None:
    """TensorRT-LLM's ``test_ratio_to_slot_count_list_preserves_min_slots``
    (``tests/unittest/kv_cache_manager_v2_tests/test_kv_cache_manager_v2.py``, stored copy): 16 MiB grains, the quota
    exactly the min slots' grains, ratios 0.2 / 0.5 / 0.3 -> every group keeps at least its min slots."""
    granularity = 16 << 20
    sizes = [[16_252_928, 4_063_232], [491_520, 126_720, 15_872], [31_457_280, 7_864_320]]
    least = [157, 3907, 157]
    grains = sum(grains_for_slots(count, size, granularity) for count, size in zip(least, sizes, strict=True))
    counts = ratio_to_slot_counts(grains * granularity, sizes, [0.2, 0.5, 0.3], granularity, least)
    assert all(count >= floor for count, floor in zip(counts, least, strict=True))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(1, 64 * MiB), min_size=1, max_size=3),
            st.floats(0.01, 1.0),
            st.integers(1, 400),
        ),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 4000),
)
def test_slot_counts_fit_the_quota_and_keep_min_slots(groups: list[tuple[list[int], float, int]], extra: int) -> None:
    """Invariant of ``ratio_to_slot_count_list``: with a quota of at least the min slots' grains, every group keeps
    its min slots and the groups' grains never exceed the quota."""
    granularity = 2 * MiB
    sizes = [size for size, _, _ in groups]
    ratios = [ratio for _, ratio, _ in groups]
    least = [count for _, _, count in groups]
    floor = sum(grains_for_slots(count, size, granularity) for count, size in zip(least, sizes, strict=True))
    total = floor + extra
    counts = ratio_to_slot_counts(total * granularity, sizes, ratios, granularity, least)
    assert all(count >= minimum for count, minimum in zip(counts, least, strict=True))
    assert sum(grains_for_slots(count, size, granularity) for count, size in zip(counts, sizes, strict=True)) <= total
    for count, size in zip(counts, sizes, strict=True):
        grains = grains_for_slots(count, size, granularity)
        assert grains_to_slots(grains, size, granularity)[0] == count


def test_cli_plan_and_capacity() -> None:
    runner = CliRunner()
    args = ["--accounting", "trtllm", "--memory", "60GiB", "--tokens_per_block", "128", "--max_seq_len", "65536"]
    plan = runner.invoke(main, ["plan", FLASH, *args, "--json"])
    assert plan.exit_code == 0, plan.output
    data = json.loads(plan.stdout)
    assert data["kv_cache_capacity"] == {"maxNumBlocks": 22016, "tokensPerBlock": 128, "maxNumTokens": 2818048}
    assert [group["slots"] for group in data["kv_cache_manager_v2"]["pool_groups"]] == [512, 44636, 512]
    table = runner.invoke(main, ["plan", FLASH, *args])
    assert table.exit_code == 0, table.output
    assert "DeepseekV4CacheManager" in table.stdout and "trtllm-serve deepseek-ai/DeepSeek-V4-Flash" in table.stdout
    capacity = runner.invoke(main, ["capacity", FLASH, *args, "--context", "8k,32k", "--json"])
    assert capacity.exit_code == 0, capacity.output
    assert [row["max_requests"] for row in json.loads(capacity.stdout)["capacity"]] == [512, 174]
    record = runner.invoke(main, ["plan", FLASH, *args, "--format", "capacity-json", "--context", "8k"])
    assert record.exit_code == 0, record.output  # one group per pool group (issue 35)
    assert [group["total_blocks"] for group in json.loads(record.stdout)["records"][0]["groups"]] == [512, 44636, 512]


def test_dsv41_low_ratio_layers_are_refused_not_planned_as_swa() -> None:
    """``DeepSeekV4SparseAttentionConfig.normalize_compress_ratios`` turns a checkpoint's 0 (SWA only) into 1, so a
    DeepSeek-V4.1 compressed ratio-1 layer would read as SWA only: refused by name instead."""
    spec, _ = load_model(FLASH, get_registry())
    layers = list(spec.layers)
    layers[2] = attrs.evolve(layers[2], params={**layers[2].params, "compress_ratio": 1})
    with pytest.raises(UnsupportedCombinationError, match="ratio-1 compressed layers"):
        plan_trtllm(attrs.evolve(spec, layers=layers), memory="60GiB", tokens_per_block=128, max_seq_len=65536)


def test_pro_plans_with_the_same_contract() -> None:
    """DeepSeek-V4-Pro answers the same hook.  Its layer 0 is a ratio-128 layer, so the window-128 group's largest pool
    is the 62 compressor state/score buffers; ``blocks_in_primary_pool`` still reads manager layer 0, layer 0's SWA
    buffer, in the 61-buffer SWA pool: ``maxNumBlocks`` = 61 x that group's slots."""
    result = plan_trtllm("deepseek-v4-pro", memory="120GiB", tokens_per_block=128, max_seq_len=32768)
    assert isinstance(result, TrtllmV2PlanResult)
    capacity = result.kv_cache_capacity()
    assert capacity is not None
    assert capacity["maxNumBlocks"] == result.model.num_layers * result.v2.slots[0]


class _LlamaInV2:
    """A third-party architecture plugin answering the trtllm hook with ``TrtllmLayer.v2`` values: Llama-3.1-8B's K
    and V (8 heads x 128 x 2 B = 2,048 B a token each, no window) in a ``KVCacheManagerV2``."""

    @hookimpl
    def engine_layer_specs(self, engine: str, model: Any) -> tuple[TrtllmLayer, ...] | None:
        if engine != "trtllm" or model.name != "llama-3.1-8b":
            return None
        buffers = (TrtllmBuffer(kind="KEY", entry_bytes=2048), TrtllmBuffer(kind="VALUE", entry_bytes=2048))
        return tuple(
            TrtllmLayer(
                index=layer.index,
                num_kv_heads=8,
                head_dim=128,
                kv_factor=2,
                v2=TrtllmV2Layer(manager="KVCacheManagerV2", buffers=buffers),
            )
            for layer in model.layers
        )


def test_the_v2_contract_serves_a_third_party_plugin() -> None:
    """The hook's ``v2`` answer is planned for any architecture.  Llama-3.1-8B, 20 GiB: quota int(20 GiB x 0.9) =
    19,327,352,832 B, grains of 32 MiB (log2(18) -> 4): 576.  One life cycle, one pool of 64 buffers of 32 x 2,048 =
    65,536 B: slots of 4,194,304 B, 8 a grain, 4,608 slots (the constraint's 131,072 / 32 = 4,096 fit) = 147,456
    tokens -- what the V1 manager's 19,327,352,832 // 131,072 gives.  ``maxNumBlocks`` is the K buffer's page bound,
    64 x 4,608 = 294,912."""
    result = plan_trtllm(
        "llama-3.1-8b", memory="20GiB", max_seq_len=131072, registry=Registry(extra_plugins={"v2": _LlamaInV2()})
    )
    assert isinstance(result, TrtllmV2PlanResult) and result.v2_manager == "KVCacheManagerV2"
    assert result.v2.quota == 19_327_352_832 and result.v2.granularity == 32 * MiB
    assert [group.slot_sizes for group in result.v2.groups] == [(4_194_304,)]
    assert result.v2.min_slots == (4096,) and result.v2.slots == (4608,)
    assert result.max_kv_tokens == 147_456 == plan_trtllm("llama-3.1-8b", memory="20GiB").max_kv_tokens
    assert result.max_num_blocks == 294_912
