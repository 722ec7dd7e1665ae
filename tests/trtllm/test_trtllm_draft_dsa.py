"""``--accounting trtllm``: DeepSeek sparse attention (``DSACacheManager``) and the one-model MTP draft KV cache
(issue 35), hand-computed from TensorRT-LLM's sources read through the code index:

- ``tensorrt_llm/_torch/attention_backend/sparse/dsa/cache_manager.py`` @ 0bbb76d22e61bde633cc5f7733f5194881853501:
  ``_get_indexer_k_cache_bytes_per_token`` (``index_head_dim`` fp8 bytes + ``index_head_dim // 128 * 4`` scale
  bytes), ``DSACacheManager.get_cache_size_per_token`` (latent ``(kv_lora_rank + qk_rope_head_dim) x {2|1}`` per
  layer + the raw uint8 indexer bytes per indexer layer) and ``get_cache_bytes_per_token`` (the same per layer);
- ``tensorrt_llm/_torch/pyexecutor/_util.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412: ``KvCacheCreator.
  _get_kv_size_per_token`` (target + the one-model draft's ``get_cache_size_per_token(num_layers=N)``),
  ``configure_kv_cache_capacity`` (``max_tokens = tokens_for_budget(budget)`` over that sum),
  ``_should_create_separate_draft_kv_cache`` (no separate draft manager with attention DP),
  ``_get_effective_draft_config`` (MTP layers take the target's config);
- ``tensorrt_llm/_torch/pyexecutor/resource_manager.py`` @ 51768596745 (stored copy): ``get_pp_layers`` appends
  ``get_num_spec_layers`` layers on the last PP rank when no ``layer_mask`` is given;
- ``tensorrt_llm/_torch/speculative/utils.py``: ``get_num_spec_layers`` = ``num_nextn_predict_layers`` for
  one-model MTP, ``get_num_extra_kv_tokens`` = ``max_draft_len - 1`` for a one-engine drafter;
  ``llmapi/llm_args.py``: ``_allow_separate_draft_kv_cache = PrivateAttr(True)``.
"""

from __future__ import annotations

import attrs
import pytest

from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.models import load_model
from kvpools_core.parts.indexer import SKIPS_TOPK
from kvpools_core.parts.trtllm import indexer_k_bytes
from kvpools_core.registry import get_registry
from kvpools_core.values import Serving

GIB = 1 << 30


def test_indexer_k_bytes() -> None:
    """``_get_indexer_k_cache_bytes_per_token(128, 128, use_fp4=False)``: 128 + 128 // 128 x 4 = 132."""
    assert indexer_k_bytes(128) == 132
    assert indexer_k_bytes(256) == 256 + 8


@pytest.mark.parametrize(
    ("dtype", "per_token", "tokens", "blocks", "requests"),
    [
        # 61 MLA layers x 576 x 2 B = 70,272 + 61 indexer layers x 132 B = 8,052 -> 78,324 B;
        # 40 GiB x 0.9 = 38,654,705,664 // 78,324 = 493,523 tokens // 32 = 15,422 blocks; 8k holds 256 blocks: 60
        ("auto", 78_324, 493_523, 15_422, 60),
        # fp8: 61 x 576 x 1 = 35,136 + 8,052 (the indexer is raw uint8, not scaled by the KV dtype) = 43,188 B;
        # 38,654,705,664 // 43,188 = 895,033 // 32 = 27,969 blocks; // 256 = 109
        ("fp8_e4m3", 43_188, 895_033, 27_969, 109),
    ],
)
def test_deepseek_v32_dsa_cache_manager(dtype: str, per_token: int, tokens: int, blocks: int, requests: int) -> None:
    result = plan_trtllm("deepseek-v3.2", Serving(kv_cache_dtype=dtype), memory="40GiB")
    rank = result.ranks[0]
    assert rank.available_kv_memory == int(40 * GIB * 0.9) == 38_654_705_664
    assert rank.estimated_size_per_token == rank.cache_bytes_per_token == per_token
    assert rank.max_tokens == tokens == 38_654_705_664 // per_token
    assert [pool.primary_blocks for pool in result.pools] == [blocks] == [tokens // 32]
    assert result.concurrency_at(8192) == requests == blocks // 256
    assert result.kv_cache_capacity() == {"maxNumBlocks": blocks, "tokensPerBlock": 32, "maxNumTokens": blocks * 32}


def test_dsa_indexer_is_not_sharded_by_tp() -> None:
    """MLA's latent row and the indexer K cache are one head each, not divided by TP: the same 78,324 B per token
    on every rank of TP 8."""
    result = plan_trtllm("deepseek-v3.2", Serving(tp_size=8), memory="40GiB")
    assert result.ranks[0].cache_bytes_per_token == 78_324


def test_dsa_refusals() -> None:
    """What kvpools does not model for DSACacheManager is refused by name, never planned as plain MLA."""
    with pytest.raises(UnsupportedCombinationError, match="nvfp4 KV cache"):
        plan_trtllm("deepseek-v3.2", Serving(kv_cache_dtype="fp4_e2m1"), memory="40GiB")
    with pytest.raises(UnsupportedCombinationError, match="indexer K cache with attention windows"):
        plan_trtllm("deepseek-v3.2", memory="40GiB", max_attention_window="128,4096")
    spec, _ = load_model("deepseek-v3.2", get_registry())
    shared = attrs.evolve(
        spec,
        layers=[
            attrs.evolve(layer, params={**layer.params, SKIPS_TOPK: True}) if layer.index % 2 else layer
            for layer in spec.layers
        ],
    )
    with pytest.raises(UnsupportedCombinationError, match="shared-indexer layers"):
        plan_trtllm(shared, memory="40GiB")


def test_mtp_separate_draft_manager_deepseek_v3() -> None:
    """DeepSeek-V3, 60 GiB free after warm-up, ``num_nextn_predict_layers`` 1 (one-model MTP, TensorRT-LLM's
    default separate draft KV cache).

    Budget 60 GiB x 0.9 = 57,982,058,496 B.  ``_get_kv_size_per_token`` = target 61 x 576 x 2 = 70,272 + draft
    1 x 576 x 2 = 1,152 -> 71,424 B; ``max_tokens`` = 57,982,058,496 // 71,424 = 811,800.  Target manager:
    min(811,800, 0.9 x free / 70,272 = 825,108) = 811,800 -> 25,368 blocks.  The draft manager, built after it:
    min(811,800, 0.9 x (free - 25,368 x 32 x 70,272) / 1,152) = 811,800 -> 25,368 blocks.  Without MTP the
    target alone gets 57,982,058,496 // 70,272 = 825,108 tokens -> 25,784 blocks: the draft costs 416 blocks,
    it does not claim a budget of its own.  (NVIDIA/TensorRT-LLM PR #12188, https://github.com/NVIDIA/TensorRT-LLM/
    pull/12188: "both managers independently claim the full max_gpu_total_bytes budget" under KVCacheManagerV2,
    and PR #12855, "kv cache allocation is double the budget for vswa + eagle": both fixed by splitting
    max_gpu_total_bytes (``_split_kv_cache_budget_for_draft``).  The V1 single-window path modelled here sizes both
    managers from one ``max_tokens`` and was not affected; kvpools refuses MTP with windows.)
    """
    result = plan_trtllm("deepseek-v3", memory="60GiB", num_nextn_predict_layers=1)
    rank = result.ranks[0]
    assert rank.available_kv_memory == 57_982_058_496
    assert rank.max_tokens == 57_982_058_496 // (70_272 + 1_152) == 811_800
    target, draft = result.pools
    assert (target.draft, target.bytes_per_token, target.primary_blocks) == (False, 70_272, 25_368)
    assert (draft.draft, draft.bytes_per_token, draft.primary_blocks, draft.layers) == (True, 1_152, 25_368, (61,))
    assert result.draft_kv_cache == "separate"
    assert result.kv_cache_capacity() == {"maxNumBlocks": 25_368, "tokensPerBlock": 32, "maxNumTokens": 811_776}
    # a drafting request holds (max_draft_len - 1) + max_draft_len = 1 extra token: ceil(8,193 / 32) = 257 blocks
    assert result.extra_tokens_per_request == 1
    assert result.concurrency_at(8192) == 25_368 // 257 == 98
    plain = plan_trtllm("deepseek-v3", memory="60GiB")
    assert plain.pools[0].primary_blocks == 57_982_058_496 // 70_272 // 32 == 25_784
    options = result.extra_llm_api_options()
    assert options["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 1}
    assert "speculative_config:\n  decoding_type: MTP\n  num_nextn_predict_layers: 1\n" in result.extra_options_yaml()


def test_mtp_three_layers() -> None:
    """``num_nextn_predict_layers`` 3: 70,272 + 3 x 1,152 = 73,728 B; 57,982,058,496 // 73,728 = 786,432 ->
    24,576 blocks in both managers; a request carries (3 - 1) + 3 = 5 extra tokens: ceil(8,197 / 32) = 257."""
    result = plan_trtllm("deepseek-v3", memory="60GiB", num_nextn_predict_layers=3)
    assert result.ranks[0].max_tokens == 786_432
    assert [(pool.bytes_per_token, pool.primary_blocks) for pool in result.pools] == [(70_272, 24_576), (3_456, 24_576)]
    assert result.extra_tokens_per_request == 5
    assert result.concurrency_at(8192) == 24_576 // 257 == 95


def test_mtp_with_attention_dp_appends_to_the_target_manager() -> None:
    """Attention DP: no separate draft manager (``_should_create_separate_draft_kv_cache``); ``get_pp_layers``
    appends the MTP layer to the target's manager, whose bytes grow to 62 x 576 x 2 = 71,424 B, while the static
    estimate still counts 61 layers (70,272 B): ``max_tokens`` = 57,982,058,496 // 70,272 = 825,108, and the
    manager's min(825,108, 0.9 x free / 71,424 = 811,800) = 811,800 -> 25,368 blocks, one pool."""
    result = plan_trtllm(
        "deepseek-v3", Serving(tp_size=8), memory="60GiB", num_nextn_predict_layers=1, enable_attention_dp=True
    )
    rank = result.ranks[0]
    assert (rank.estimated_size_per_token, rank.cache_bytes_per_token) == (70_272, 71_424)
    (pool,) = result.pools
    assert (pool.primary_blocks, len(pool.layers), pool.draft) == (25_368, 62, False)
    assert result.draft_kv_cache == "target"


def test_mtp_on_dsa_carries_the_indexer() -> None:
    """DeepSeek-V3.2 with MTP 1: the draft layer is a DSA layer too (``DSACacheManager`` for the draft, one indexer
    layer): 1,152 + 132 = 1,284 B; 38,654,705,664 // (78,324 + 1,284) = 485,563 -> 15,173 blocks each; 8k + 1
    extra token = 257 blocks: 59 requests."""
    result = plan_trtllm("deepseek-v3.2", memory="40GiB", num_nextn_predict_layers=1)
    assert result.ranks[0].max_tokens == 38_654_705_664 // 79_608 == 485_563
    assert [(pool.bytes_per_token, pool.primary_blocks) for pool in result.pools] == [(78_324, 15_173), (1_284, 15_173)]
    assert result.concurrency_at(8192) == 59


def test_mtp_refusals() -> None:
    with pytest.raises(UnsupportedCombinationError, match="over pipeline stages"):
        plan_trtllm("deepseek-v3", Serving(pp_size=2), memory="60GiB", num_nextn_predict_layers=1)
    with pytest.raises(UnsupportedCombinationError, match="beside attention windows"):
        plan_trtllm("deepseek-v3", memory="60GiB", num_nextn_predict_layers=1, max_attention_window="4096,163840")
    with pytest.raises(UnsupportedCombinationError, match="splits host_cache_size"):
        plan_trtllm("deepseek-v3", memory="60GiB", num_nextn_predict_layers=1, host_cache_size="10GiB")
    with pytest.raises(UnsupportedCombinationError, match="has none"):
        plan_trtllm("gpt-oss-120b", memory="40GiB", num_nextn_predict_layers=1)


def test_mtp_cli_and_capacity_record() -> None:
    """``--num_nextn_predict_layers`` on ``kvpools plan``: the draft pool in the report and the YAML; refused
    without ``--accounting trtllm`` and on a checkpoint without MTP layers; the capacity record has a draft group."""
    from click.testing import CliRunner

    from kvpools_core.cli import main

    runner = CliRunner()
    args = ["plan", "deepseek-v3", "--memory", "60GiB", "--accounting", "trtllm", "--num_nextn_predict_layers", "1"]
    shown = runner.invoke(main, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    data = __import__("json").loads(shown.stdout)
    assert data["draft_kv_cache"] == "separate"
    assert [pool["primary_blocks"] for pool in data["pools"]] == [25_368, 25_368]
    assert data["ranks"][0]["draft_estimated_size_per_token"] == 1_152
    table = runner.invoke(main, args)
    assert table.exit_code == 0 and "163840 (draft)" in table.stdout and "decoding_type: MTP" in table.stdout
    capacity = runner.invoke(main, ["capacity", *args[1:-1], "3", "--context", "8k"], terminal_width=200)
    assert capacity.exit_code == 0, capacity.output
    assert "ceil((min(L, window) + 5) / tokens)" in capacity.stdout  # (3 - 1) + 3 extra tokens
    record = runner.invoke(main, [*args, "--format", "capacity-json", "--context", "8k"])
    assert record.exit_code == 0, record.output  # the draft pool is a group of its own (issue 35)
    groups = __import__("json").loads(record.stdout)["records"][0]["groups"]
    assert [(group["name"], group["total_blocks"]) for group in groups] == [("full", 25_368), ("draft", 25_368)]
    no_mtp = runner.invoke(main, ["plan", "llama-3.1-8b", "--memory", "20GiB", "--accounting", "trtllm",
                                  "--num_nextn_predict_layers", "1"])  # fmt: skip
    assert no_mtp.exit_code == 1 and "has none" in no_mtp.stderr and "Traceback" not in no_mtp.output
    sglang = runner.invoke(main, ["plan", "deepseek-v3", "--memory", "60GiB", "--num_nextn_predict_layers", "1"])
    assert sglang.exit_code == 1 and "only with --accounting trtllm" in sglang.stderr


@pytest.mark.parametrize(
    ("model", "names"),
    [
        # config_utils.py is_hybrid_linear: Nemotron-H and Qwen3-Next / Qwen3.5 only (tests/trtllm/test_trtllm_hybrid.py
        # plans those); extract_mamba_kv_cache_params raises for the other hybrid families.
        ("falcon-h1-0.5b", ("kvpools does not model the falcon_h1 hybrid family", "is_hybrid_linear")),
        # DeepSeek-V4 (DeepseekV4CacheManager, a KVCacheManagerV2) is planned since issue 35: test_trtllm_v2.py.
    ],
)
def test_managers_kvpools_does_not_model_are_refused_by_name(model: str, names: tuple[str, ...]) -> None:
    with pytest.raises(UnsupportedCombinationError) as refused:
        plan_trtllm(model, memory="40GiB")
    for name in names:
        assert name in str(refused.value)
