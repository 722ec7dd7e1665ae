"""Issue 35, what a capacity planner hits next under ``--accounting trtllm``: the capacity record of a
``KVCacheManagerV2`` plan (DeepSeek-V4) and of a plan with a draft KV cache (one-model MTP, Eagle3), and
``kvpools fit`` / ``sweep`` / ``compare`` with the draft options and ``--tokens_per_block``, against hand-computed
numbers.

Sources (``NVIDIA/TensorRT-LLM``; the code index's stored copies):

- ``_torch/pyexecutor/py_executor.py`` ``PyExecutor.get_kv_cache_capacity``: ``maxNumBlocks`` =
  ``blocks_in_primary_pool`` of the target's manager (``KvCacheCreator`` builds the draft's manager beside it, the
  executor holds the target's as ``kv_cache_manager``);
- ``_torch/pyexecutor/_util.py``@``00043967`` ``KvCacheCreator._get_kv_size_per_token`` (the draft's cost added to the
  target's before the budget is divided) and ``_create_one_model_draft_kv_cache_manager`` (the draft manager sized
  from the same ``kv_cache_config.max_tokens``);
- ``_torch/speculative/utils.py`` ``get_num_extra_kv_tokens`` (``max_draft_len - 1`` for a one-engine drafter) and
  ``KVCacheManager.prepare_resources`` (the ``max_draft_len`` draft tokens of a generation step);
- ``runtime/kv_cache_manager_v2/_storage_manager.py``@``00f6bd61`` (the pool-ratio solve, grains of
  ``2 MiB << min(4, int(log2(quota / 1 GiB)))``) and ``_life_cycle_registry.py``@``1548780d`` (stale blocks
  ``(history + 1 - window) // tokens_per_block``), as ``tests/trtllm/test_trtllm_v2.py`` pins them;
- ``examples/models/core/deepseek_v4/README.md``@``3699edad``: every DeepSeek-V4 example sets
  ``kv_cache_config.tokens_per_block: 128`` ("DeepSeek-V4 requires KV cache block sizes of 128 or 256 tokens ...
  scripts that set their own KV cache config should pass this explicitly").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpools_core.cli import main
from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.planning.capacity_record import trtllm_capacity_document
from kvpools_core.planning.trtllm_fit import fit_trtllm
from kvpools_core.planning.trtllm_sweep import sweep_trtllm
from kvpools_core.values import Serving
from tests.capacity.test_capacity_record import validate

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "capacity-record.schema.json").read_text())
GiB = 1 << 30
MiB = 1 << 20
GRAIN = 32 * MiB
"""The V2 runtime's grain for a quota of 16 GiB or more: 2 MiB << 4."""
BUDGET_20 = 19_327_352_832  # int(20 GiB x 0.9), _cal_max_memory
BUDGET_60 = 57_982_058_496  # int(60 GiB x 0.9)


@pytest.fixture(scope="module")
def eagle3_8b(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The geometry of ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``'s ``config.json``: one layer, 8 KV heads of 128."""
    path = tmp_path_factory.mktemp("eagle3-llama3.1-8b") / "config.json"
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 1,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-05,
        "torch_dtype": "float16",
        "vocab_size": 128256,
        "draft_vocab_size": 32000,
    }
    path.write_text(json.dumps(config))
    return str(path)


def _groups(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {group["name"]: group for group in record["groups"]}


# -- 1. the capacity record of a KVCacheManagerV2 plan -----------------------------------------------------------


def test_deepseek_v4_record_has_one_group_per_pool_group() -> None:
    """DeepSeek-V4-Flash, 60 GiB free after warm-up, ``max_seq_len`` 65536, 128-token blocks (docs/trtllm.md's
    worked example): quota 57,982,058,496 B = 1,728 grains of 32 MiB.  Pool groups (``create_storage_config``):
    window 128 (43 SWA buffers of 131,072 B and 20 ratio-128 compressor state + score of 2 x 262,144... coalesced:
    slot 10,485,760 + 5,636,096 = 16,121,856 B), no window (688,128 + 88,704 + 20,480 = 797,312 B) and window 8
    (22,020,096 + 5,505,024 = 27,525,120 B).  The constraint pins 512 slots of each windowed group (246 and 420
    grains: 512 x 16,121,856 = 246 x 32 MiB, 512 x 27,525,120 = 420 x 32 MiB), the window-less group gets the other
    1,062 grains: 1,062 x 32 MiB // 797,312 = 44,636 slots.

    A request of 8,192 tokens (history 8,191) holds 64 blocks of the window-less group and 64 - (8,192 - 128) // 128
    = 1 of the window-128 group, 64 - (8,192 - 8) // 128 = 1 of the window-8 group: 512 // 1 = 512 requests bind
    (the SWA group first), 44,636 // 64 = 697.  At 32k: 44,636 // 256 = 174, the window-less group binds.
    ``get_kv_cache_capacity()`` publishes ``blocks_in_primary_pool`` = 43 x 512 = 22,016 (the first layer's SWA page
    bound); the record's ``total_kv_blocks`` are the window-less group's 44,636 slots (5,713,408 tokens)."""
    result = plan_trtllm(
        "deepseek-v4-flash", Serving(tp_size=1), memory="60GiB", tokens_per_block=128, max_seq_len=65536
    )
    document = trtllm_capacity_document(result, context_len=8192)
    assert validate(document, SCHEMA) == []
    (record,) = document["records"]
    groups = _groups(record)
    assert list(groups) == ["window_128", "full", "window_8"]
    rows = [
        (g["kind"], g["total_blocks"], g["blocks_per_request"], g["max_requests"], g["window_tokens"])
        for g in groups.values()
    ]
    assert rows == [("window", 512, 1, 512, 128), ("full", 44_636, 64, 697, None), ("window", 512, 1, 512, 8)]
    assert (record["total_kv_blocks"], record["max_total_num_tokens"]) == (44_636, 5_713_408)
    assert 44_636 * 128 == 5_713_408
    assert (record["max_concurrency"], record["binding_group"], record["block_size"]) == (512, "window_128", 128)
    assert record["gpu_kv_bytes"] == (246 + 1_062 + 420) * GRAIN == 1_728 * GRAIN == BUDGET_60
    assert record["budget"]["budget_bytes"] == BUDGET_60
    trt = record["trtllm"]
    assert trt["kv_cache_capacity"] == {"maxNumBlocks": 43 * 512, "tokensPerBlock": 128, "maxNumTokens": 2_818_048}
    assert trt["bytes_per_token"] == 347_221  # get_cache_bytes_per_token, test_trtllm_v2.py
    v2 = trt["kv_cache_manager_v2"]
    assert v2["manager"] == "DeepseekV4CacheManager" and v2["quota"] == BUDGET_60
    assert [(g["slots"], g["slot_bytes"], g["bytes"]) for g in v2["pool_groups"]] == [
        (512, 16_121_856, 246 * GRAIN),
        (44_636, 797_312, 1_062 * GRAIN),
        (512, 27_525_120, 420 * GRAIN),
    ]
    long = trtllm_capacity_document(result, context_len=32768)["records"][0]
    assert (long["max_concurrency"], long["binding_group"]) == (44_636 // 256, "full") == (174, "full")


def test_deepseek_v4_record_over_tp_ranks_and_the_cli() -> None:
    """One record per TP rank (every rank's manager alike); ``kvpools plan --format capacity-json`` prints it."""
    result = plan_trtllm(
        "deepseek-v4-flash", Serving(tp_size=4), memory="60GiB", tokens_per_block=128, max_seq_len=65536
    )
    document = trtllm_capacity_document(result, context_len=8192)
    assert [(r["tp_rank"], r["attn_tp_rank"], r["dp_rank"]) for r in document["records"]] == [
        (t, t, 0) for t in range(4)
    ]
    args = ["plan", "deepseek-v4-flash", "--accounting", "trtllm", "--memory", "60GiB", "--tokens_per_block", "128",
            "--max_seq_len", "65536", "--format", "capacity-json", "--context", "32k"]  # fmt: skip
    shown = CliRunner().invoke(main, args)
    assert shown.exit_code == 0, shown.output
    record = json.loads(shown.stdout)["records"][0]
    assert (record["max_concurrency"], record["binding"]) == (174, "full tokens")


# -- 1. the capacity record of a plan with a draft KV cache ------------------------------------------------------


def test_eagle3_record_has_the_draft_pool_as_a_group(eagle3_8b: str) -> None:
    """Llama-3.1-8B + a one-layer Eagle3 draft, ``max_draft_len`` 3, 20 GiB free after warm-up (docs/trtllm.md):
    target 131,072 B, draft manager 3 x 2 x 8 x 128 x 2 = 12,288 B per token; 19,327,352,832 // 143,360 = 134,816
    tokens -> 4,213 blocks in each manager.  A request of 8,192 tokens holds (3 - 1) + 3 = 5 more: ceil(8,197 / 32)
    = 257 blocks of each pool, 4,213 // 257 = 16.  ``get_kv_cache_capacity()`` is the target's manager's; the GPU
    bytes are both pools': 134,816 x (131,072 + 12,288) = 19,327,221,760 B (within the 19,327,352,832 B budget)."""
    result = plan_trtllm(
        "llama-3.1-8b", memory="20GiB", decoding_type="Eagle3", speculative_model_dir=eagle3_8b, max_draft_len=3
    )
    document = trtllm_capacity_document(result, context_len=8192)
    assert validate(document, SCHEMA) == []
    (record,) = document["records"]
    groups = _groups(record)
    assert list(groups) == ["full", "draft"]
    for group in groups.values():
        assert (group["kind"], group["total_blocks"], group["slots_per_request"]) == ("full", 4_213, 8_197)
        assert (group["blocks_per_request"], group["max_requests"]) == (257, 16)
    assert (record["total_kv_blocks"], record["max_total_num_tokens"], record["max_concurrency"]) == (
        4_213,
        134_816,
        16,
    )
    assert record["gpu_kv_bytes"] == 134_816 * (131_072 + 12_288) == 19_327_221_760 <= BUDGET_20
    trt = record["trtllm"]
    assert trt["kv_cache_capacity"] == {"maxNumBlocks": 4_213, "tokensPerBlock": 32, "maxNumTokens": 134_816}
    assert trt["bytes_per_token"] == 131_072
    assert trt["draft"] == {
        "decoding_type": "Eagle3",
        "kv_cache": "separate",
        "layers": 3,
        "extra_tokens_per_request": 5,
        "estimated_size_per_token": 12_288,
        "bytes_per_token": 12_288,
        "max_num_blocks": 4_213,
        "max_num_tokens": 134_816,
    }


def test_mtp_record_deepseek_v3() -> None:
    """DeepSeek-V3 with one MTP layer, 60 GiB free after warm-up: 57,982,058,496 // (70,272 + 1,152) = 811,800 tokens
    -> 25,368 blocks in the target's manager and in the draft's (``tests/trtllm/test_trtllm_draft_dsa.py``).  A
    request holds (1 - 1) + 1 = 1 more token: ceil(8,193 / 32) = 257 blocks, 25,368 // 257 = 98 requests."""
    result = plan_trtllm("deepseek-v3", memory="60GiB", num_nextn_predict_layers=1)
    document = trtllm_capacity_document(result, context_len=8192)
    assert validate(document, SCHEMA) == []
    record = document["records"][0]
    groups = _groups(record)
    assert [(g["total_blocks"], g["blocks_per_request"], g["max_requests"]) for g in groups.values()] == [
        (25_368, 257, 98),
        (25_368, 257, 98),
    ]
    assert record["max_concurrency"] == 98
    assert record["gpu_kv_bytes"] == 25_368 * 32 * (70_272 + 1_152)
    draft = record["trtllm"]["draft"]
    assert (draft["decoding_type"], draft["kv_cache"], draft["layers"], draft["bytes_per_token"]) == (
        "MTP",
        "separate",
        1,
        1_152,
    )
    assert draft["extra_tokens_per_request"] == 1


def test_mtp_record_with_attention_dp_has_no_draft_pool() -> None:
    """With attention DP the MTP layer joins the target's manager (``get_pp_layers``): one group, the draft object
    says where it lives; one record per attention-DP rank (``dp_rank`` = the rank)."""
    result = plan_trtllm(
        "deepseek-v3", Serving(tp_size=8), memory="60GiB", num_nextn_predict_layers=1, enable_attention_dp=True
    )
    document = trtllm_capacity_document(result, context_len=8192)
    assert validate(document, SCHEMA) == []
    record = document["records"][3]
    assert (record["tp_rank"], record["dp_rank"], record["attn_tp_rank"]) == (3, 3, 0)
    assert [group["name"] for group in record["groups"]] == ["full"]
    draft = record["trtllm"]["draft"]
    assert (draft["kv_cache"], draft["layers"], draft["bytes_per_token"], draft["max_num_blocks"]) == (
        "target",
        1,
        None,
        None,
    )


# -- 2. fit and sweep with the draft options -------------------------------------------------------------------


def test_fit_with_an_eagle3_draft_needs_and_adds_its_weights(eagle3_8b: str) -> None:
    """``kvpools fit`` plans every configuration on a GPU, and kvpools does not estimate a draft's weights: refused
    without ``--draft_weights_memory``.  With 1 GiB the free memory after warm-up is the GPU's total less kvpools'
    estimate of the target's weights less 1 GiB, and the draft's 12,288 B per token are added before the budget is
    divided (``_get_kv_size_per_token``)."""
    kwargs: dict[str, Any] = {"decoding_type": "Eagle3", "speculative_model_dir": eagle3_8b, "max_draft_len": 3}
    with pytest.raises(ConfigError, match="--draft_weights_memory"):
        fit_trtllm("llama-3.1-8b", 16, 8192, gpu="h100", max_gpus=1, kv_cache_dtype="auto", **kwargs)
    found = fit_trtllm(
        "llama-3.1-8b", 16, 8192, gpu="h100", max_gpus=1, kv_cache_dtype="auto", draft_weights_memory="1GiB", **kwargs
    )
    (fit,) = found.fits
    target = plan_trtllm("llama-3.1-8b", gpu="h100", max_seq_len=8192).ranks[0]
    rank = fit.result.ranks[0]
    assert rank.weights_memory == target.weights_memory + GiB  # type: ignore[operator]
    assert rank.free_after_warmup == target.free_after_warmup - GiB
    tokens = int(rank.free_after_warmup * 0.9) // (131_072 + 12_288)
    assert rank.max_tokens == tokens
    assert fit.result.pools[0].primary_blocks == tokens // 32
    assert fit.requests_held == (tokens // 32) // 257  # ceil((8,192 + 5) / 32) = 257 blocks a request
    assert fit.to_dict()["extra_llm_api_options"]["speculative_config"]["max_draft_len"] == 3
    assert fit.describe() == "TP 1 · kv auto · Eagle3 draft (eagle3_one_model, max_draft_len 3)"


def test_draft_weights_memory_refusals(eagle3_8b: str) -> None:
    draft = {"decoding_type": "Eagle3", "speculative_model_dir": eagle3_8b, "max_draft_len": 3}
    with pytest.raises(ConfigError, match="applies with --decoding_type"):
        plan_trtllm("llama-3.1-8b", gpu="h100", draft_weights_memory="1GiB")
    with pytest.raises(ConfigError, match="applies to a --gpu budget only"):
        plan_trtllm("llama-3.1-8b", memory="20GiB", draft_weights_memory="1GiB", **draft)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Give one of them"):
        plan_trtllm(
            "llama-3.1-8b",
            gpu="h100",
            weights_memory="20GiB",
            draft_weights_memory="1GiB",
            **draft,  # type: ignore[arg-type]
        )
    with pytest.raises(UnsupportedCombinationError, match="--draft_weights_memory"):
        plan_trtllm("llama-3.1-8b", gpu="h100", **draft)  # type: ignore[arg-type]


def test_sweep_max_draft_len_is_an_axis(eagle3_8b: str) -> None:
    """``--max_draft_len 3,4``: two points.  1.2's draft manager has ``max_draft_len`` layers (PR #12188): 3 x 4,096
    = 12,288 B -> 4,213 blocks, 16 requests of 8k (5 extra tokens, 257 blocks each); 4 x 4,096 = 16,384 B ->
    19,327,352,832 // 147,456 = 131,072 tokens, 4,096 blocks; (4 - 1) + 4 = 7 extra tokens, ceil(8,199 / 32) = 257
    blocks, 4,096 // 257 = 15 requests."""
    rows = sweep_trtllm(
        ["llama-3.1-8b"],
        budgets=[{"memory": "20GiB"}],
        contexts=["8k"],
        max_draft_lens=[3, 4],
        draft={"decoding_type": "Eagle3", "speculative_model_dir": eagle3_8b},
    )
    assert [(r["max_draft_len"], r["max_num_blocks"], r["max_kv_tokens"], r["requests@8192"]) for r in rows] == [
        (3, 4_213, 134_816, 16),
        (4, 4_096, 131_072, 15),
    ]
    runner = CliRunner()
    args = ["sweep", "--model", "llama-3.1-8b", "--memory", "20GiB", "--accounting", "trtllm", "--context", "8k",
            "--decoding_type", "Eagle3", "--speculative_model_dir", eagle3_8b, "--max_draft_len", "3,4",
            "--format", "json"]  # fmt: skip
    shown = runner.invoke(main, args)
    assert shown.exit_code == 0, shown.output
    assert [row["max_num_blocks"] for row in json.loads(shown.stdout)] == [4_213, 4_096]
    bad = runner.invoke(main, [*args[:-2], "--max_draft_len", "three"])
    assert bad.exit_code == 1 and "--max_draft_len takes integers" in bad.stderr and "Traceback" not in bad.output


@pytest.mark.parametrize("command", ["fit", "sweep"])
def test_trtllm_draft_flags_refused_without_trtllm(command: str) -> None:
    runner = CliRunner()
    args = (
        ["fit", "llama-3.1-8b", "--requests", "1", "--context", "8k", "--gpu", "h100"]
        if command == "fit"
        else ["sweep", "--model", "llama-3.1-8b", "--memory", "20GiB"]
    )
    for flag, value in (("--decoding_type", "Eagle3"), ("--tokens_per_block", "64"), ("--max_draft_len", "3")):
        shown = runner.invoke(main, [*args, flag, value])
        assert shown.exit_code == 1 and f"{flag}: TensorRT-LLM's, only with --accounting trtllm" in shown.stderr


# -- 2. DeepSeek-V4's tokens_per_block in fit, sweep and compare ------------------------------------------------


def test_deepseek_v4_refusal_names_the_block_size_to_pass() -> None:
    """TensorRT-LLM's default ``tokens_per_block`` 32 trips ``DeepseekV4CacheManager``'s assertion; the refusal says
    to pass 128, the value TensorRT-LLM's DeepSeek-V4 examples set.  ``fit`` raises it (every configuration hits
    it), ``sweep`` puts it in the row, ``compare`` in ``trtllm_refusal``."""
    with pytest.raises(UnsupportedCombinationError, match=r"Pass --tokens_per_block 128 \(what TensorRT-LLM's"):
        fit_trtllm("deepseek-v4-flash", 64, 8192, gpu="b200")
    (row,) = sweep_trtllm(["deepseek-v4-flash"], budgets=[{"memory": "60GiB"}], contexts=["8k"])
    assert "Pass --tokens_per_block 128" in row["error"]
    shown = CliRunner().invoke(main, ["compare", "deepseek-v4-flash", "--memory", "60GiB", "--context-length",
                                      "65536", "--json"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert "Pass --tokens_per_block 128" in json.loads(shown.stdout)["trtllm_refusal"]


def test_deepseek_v4_compare_and_sweep_take_tokens_per_block() -> None:
    """``kvpools compare deepseek-v4-flash --memory 60GiB --context-length 65536 --tokens_per_block 128``: the
    TensorRT-LLM column is the worked example's ``{maxNumBlocks: 22016, tokensPerBlock: 128, maxNumTokens:
    2818048}``.  ``sweep --tokens_per_block 128,256`` on 400 GiB (the default ``max_seq_len`` of 1,048,576 pins
    364,099,141,632 B): a 256-token slot holds twice a 128-token slot's bytes, so the solve gives half the slots --
    the page bound halves (352,256 -> 176,128) and the window-less group's tokens stay 4,648,192."""
    shown = CliRunner().invoke(main, ["compare", "deepseek-v4-flash", "--memory", "60GiB", "--context-length",
                                      "65536", "--tokens_per_block", "128", "--json"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["trtllm_refusal"] is None
    assert data["trtllm"]["kv_cache_capacity"] == {
        "maxNumBlocks": 22016,
        "tokensPerBlock": 128,
        "maxNumTokens": 2818048,
    }
    rows = sweep_trtllm(
        ["deepseek-v4-flash"], budgets=[{"memory": "400GiB"}], contexts=["8k"], tokens_per_blocks=[128, 256]
    )
    assert [row["error"] for row in rows] == [None, None]
    assert [row["tokens_per_block"] for row in rows] == [128, 256]
    assert [row["max_num_blocks"] for row in rows] == [352_256, 176_128]
    assert [row["max_kv_tokens"] for row in rows] == [4_648_192, 4_648_192]


def test_fit_deepseek_v4_with_tokens_per_block() -> None:
    """``kvpools fit deepseek-v4-flash ... --tokens_per_block 128`` plans (pipeline stages are refused by name and
    counted); every fit launches with ``kv_cache_config.tokens_per_block: 128``."""
    found = fit_trtllm("deepseek-v4-flash", 64, 8192, gpu="b200", tokens_per_block=128)
    assert found.fits
    assert {fit.to_dict()["extra_llm_api_options"]["kv_cache_config"]["tokens_per_block"] for fit in found.fits} == {
        128
    }
    assert any("pipeline stages" in reason for reason in found.skipped)
    assert all(fit.describe().endswith("tokens_per_block 128") for fit in found.fits)


# -- invariants over the context length ----------------------------------------------------------------------------

_FLASH_60 = plan_trtllm("deepseek-v4-flash", memory="60GiB", tokens_per_block=128, max_seq_len=65536)
_DSV3_MTP = plan_trtllm("deepseek-v3", memory="60GiB", num_nextn_predict_layers=2)


@settings(max_examples=40, deadline=None)
@given(context=st.integers(min_value=1, max_value=65536))
def test_v2_record_holds_its_groups_tightest_limit(context: int) -> None:
    """At any context: the window-less group holds ``ceil(L / 128)`` blocks a request, a windowed group at most
    ``ceil(window / 128) + 1``; ``max_concurrency`` is the tightest group's ``slots // blocks``, capped by
    ``max_batch_size``, and equals :meth:`concurrency_at`."""
    record = trtllm_capacity_document(_FLASH_60, context_len=context)["records"][0]
    groups = _groups(record)
    assert groups["full"]["blocks_per_request"] == -(-context // 128)
    for name in ("window_128", "window_8"):
        assert 1 <= groups[name]["blocks_per_request"] <= 2
    tightest = min(group["total_blocks"] // group["blocks_per_request"] for group in groups.values())
    assert record["max_concurrency"] == min(tightest, 2048) == _FLASH_60.concurrency_at(context)


@settings(max_examples=40, deadline=None)
@given(context=st.integers(min_value=1, max_value=163840))
def test_mtp_record_counts_the_draft_tokens_in_both_pools(context: int) -> None:
    """Two MTP layers: a request holds ``(2 - 1) + 2 = 3`` tokens more, ``ceil((L + 3) / 32)`` blocks of the target's
    and of the draft's pool."""
    record = trtllm_capacity_document(_DSV3_MTP, context_len=context)["records"][0]
    groups = _groups(record)
    assert groups["full"]["blocks_per_request"] == groups["draft"]["blocks_per_request"] == -(-(context + 3) // 32)
    assert record["max_concurrency"] == _DSV3_MTP.concurrency_at(context)
