"""``--accounting trtllm`` with helix context parallelism (``--context_parallel_size`` / ``--cp_size``,
``cp_config: {cp_type: HELIX}``, issue 35), hand-computed from TensorRT-LLM's sources read through the code index
(``NVIDIA/TensorRT-LLM``; a commit where the index names one, else the stored copy's id):

- ``tensorrt_llm/_torch/pyexecutor/_util.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412,
  ``KvCacheCreator.try_prepare_estimation``: with ``'cp_type' in cp_config`` "KV cache size estimation is not
  supported for context parallelism, disable it" -- no warm-up, no ``max_tokens`` written by the creator;
- ``tensorrt_llm/_torch/pyexecutor/resource_manager.py`` (stored copy 51768596745),
  ``KVCacheManager.calculate_max_num_blocks``: ``max_tokens = free_gpu_memory_fraction x free_mem /
  get_cache_bytes_per_token()``, ``min`` with ``kv_cache_config.max_tokens``, MIN across ranks,
  ``blocks_in_primary_pool = max_tokens // tokens_per_block``; ``prepare_resources``: decode blocks round-robin;
- ``ExecutorRequestQueue._merge_helix_requests`` (stored copy 903912077: contiguous ``tensor_split`` of the blocks)
  and ``request_utils.partition_context_for_helix`` (stored copy 66644507211: round-robin ``blocks[r::cp]``): rank
  ``r`` holds ``ceil((n - r) / cp)`` of a request's ``n = ceil(L / tokens_per_block)`` blocks; "There aren't enough
  tokens to get at least one block per CP rank" when ``n < cp``; ``_merge_requests``: "Unsupported cp type";
- ``tensorrt_llm/_torch/modules/attention.py`` ``MLA.__init__`` (stored copy 57637097072): "MLA doesn't support CP
  Ulysses yet", ``num_heads % (tp_size * cp_size) == 0``;
- ``tensorrt_llm/commands/serve.py`` @ 00209af149e7774406881a37283dce303571eb11: ``--context_parallel_size`` /
  ``--cp_size``, "Invalid cp_type: ... Must be one of: ULYSSES, STAR, RING, HELIX";
- ``docs/source/features/helix.md`` @ 04c8822cc42ffd1f5b6270874e5b9a64a20e7a58: MLA models (DeepSeek-V3 /
  V3-Lite) on Blackwell, ``cp_config.tokens_per_block`` equal to ``kv_cache_config.tokens_per_block``.

DeepSeek-V3: 61 MLA layers of ``kv_lora_rank 512 + qk_rope_head_dim 64 = 576`` elements, K only, one head that
neither TP nor CP divides: ``61 x 576 x 2 B = 70,272 B`` per token on every rank.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

import kvpools_core.cli as cli
from kvpools_core.engines.trtllm import TrtllmHelixPlanResult, plan_trtllm
from kvpools_core.engines.trtllm.context_parallel import ContextParallel
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.values import Serving

GIB = 1 << 30
BUDGET = 57_982_058_496
"""``0.9 x 60 GiB`` (64,424,509,440 B): the fraction of the memory free when each CP rank builds its manager."""


def test_helix_rank_pool_deepseek_v3_cp2() -> None:
    """CP 2 on 60 GiB free: ``0.9 x 64,424,509,440 / 70,272 = 825,108.98`` tokens a rank (calculate_max_num_blocks,
    no estimate with cp_type set), ``// 32 = 25,784`` blocks; get_kv_cache_capacity() publishes that rank's pool."""
    result = plan_trtllm("deepseek-v3", memory="60GiB", context_parallel_size=2)
    assert isinstance(result, TrtllmHelixPlanResult)
    rank = result.ranks[0]
    assert rank.cache_bytes_per_token == 61 * 576 * 2 == 70_272
    assert rank.available_kv_memory == int(60 * GIB * 0.9) == BUDGET
    assert rank.max_tokens == 825_108 == BUDGET // 70_272
    assert [pool.primary_blocks for pool in result.pools] == [25_784] == [825_108 // 32]
    assert result.kv_cache_capacity() == {"maxNumBlocks": 25_784, "tokensPerBlock": 32, "maxNumTokens": 825_088}
    assert result.group_kv_tokens == 2 * 825_088
    assert result.gpus == 2
    assert result.max_seq_len == 163_840  # 25,784 x 32 = 825,088 >= DeepSeek-V3's 163,840: no window bound
    assert result.warnings == ()


@pytest.mark.parametrize(
    ("cp", "context", "requests"),
    [
        # 128k: ceil(131,072 / 32) = 4,096 blocks; rank 0 holds ceil(4,096 / cp)
        (1, 131_072, 6),  # no CP: 25,784 // 4,096
        (2, 131_072, 12),  # 25,784 // 2,048
        (4, 131_072, 25),  # 25,784 // 1,024
        # 8k: 256 blocks
        (2, 8_192, 201),  # 25,784 // 128
        (4, 8_192, 402),  # 25,784 // 64
        # 100,000 tokens: 3,125 blocks; CP 4 gives ranks 782, 781, 781, 781: rank 0 binds, 25,784 // 782 = 32
        (4, 100_000, 32),
    ],
)
def test_helix_requests_split_over_cp_ranks(cp: int, context: int, requests: int) -> None:
    result = plan_trtllm("deepseek-v3", memory="60GiB", context_parallel_size=cp if cp > 1 else None)
    assert result.pools[0].primary_blocks == 25_784  # the per-rank pool does not change with CP
    assert result.concurrency_at(context) == requests


def test_helix_fp8_cp4() -> None:
    """fp8 KV: ``61 x 576 x 1 = 35,136 B``; ``57,982,058,496 / 35,136 = 1,650,217.97`` tokens, ``// 32 = 51,569``
    blocks; a 128k request holds 1,024 blocks on rank 0: 50 requests."""
    result = plan_trtllm("deepseek-v3", Serving(kv_cache_dtype="fp8_e4m3"), memory="60GiB", context_parallel_size=4)
    assert result.ranks[0].cache_bytes_per_token == 35_136
    assert result.ranks[0].max_tokens == 1_650_217
    assert result.pools[0].primary_blocks == 51_569
    assert result.concurrency_at(131_072) == 50
    assert result.extra_llm_api_options()["kv_cache_config"]["dtype"] == "fp8"


def test_helix_tp_does_not_shard_the_latent_row() -> None:
    """TP 2 x CP 2 (4 GPUs): MLA's latent row is one head, the same 70,272 B a token on every rank."""
    result = plan_trtllm("deepseek-v3", Serving(tp_size=2), memory="60GiB", context_parallel_size=2)
    assert result.ranks[0].cache_bytes_per_token == 70_272
    assert result.pools[0].primary_blocks == 25_784
    assert result.gpus == 4
    assert "--tp_size 2 --pp_size 1 --cp_size 2" in result.serve_command()


def test_helix_pipeline_stages_take_the_min() -> None:
    """PP 2: ``Mapping.pp_layers`` gives 31 and 30 layers (35,712 and 34,560 B a token);
    ``57,982,058,496 / 35,712 = 1,623,601.5`` -> 50,737 blocks, ``/ 34,560 = 1,677,721.6`` -> 52,428; the MIN
    across ranks leaves every rank 50,737."""
    result = plan_trtllm("deepseek-v3", Serving(pp_size=2), memory="60GiB", context_parallel_size=2)
    assert [rank.cache_bytes_per_token for rank in result.ranks] == [31 * 1_152, 30 * 1_152]
    assert [rank.max_tokens for rank in result.ranks] == [1_623_601, 1_677_721]
    assert result.pools[0].primary_blocks == 50_737
    assert result.gpus == 4


def test_helix_window_bound_lowers_max_seq_len() -> None:
    """4 GiB free: ``0.9 x 4 GiB / 70,272 = 55,007.3`` tokens, 1,718 blocks: one sequence fits 54,976 tokens on a
    rank, so get_max_atten_window_upper_bound lowers the 163,840 window (and max_seq_len) with TensorRT-LLM's
    warnings -- the V1 manager checks the rank's pool against the full max_seq_len."""
    result = plan_trtllm("deepseek-v3", memory="4GiB", context_parallel_size=2)
    assert result.pools[0].primary_blocks == 1_718
    assert result.max_seq_len == 54_976 == 1_718 * 32
    assert result.warnings == (
        "Attention window size 163840 exceeds upper bound 54976 for available blocks. Reducing to 54976.",
        "Adjusted max_seq_len to 54976",
    )
    assert result.concurrency_at(65_536) is None  # past max_seq_len
    assert result.concurrency_at(32_768) == 1_718 // 512  # 1,024 blocks over 2 ranks


def test_helix_max_tokens_is_rank_local() -> None:
    """``kv_cache_config.max_tokens`` reaches each rank's manager as given (no KvCacheCreator estimate):
    ``min(100,000, 825,108.98)`` -> 3,125 blocks a rank."""
    result = plan_trtllm("deepseek-v3", memory="60GiB", context_parallel_size=2, max_tokens=100_000)
    assert result.ranks[0].max_tokens == 100_000
    assert result.pools[0].primary_blocks == 3_125
    assert any("rank's tokens" in note for note in result.notes)
    assert result.extra_llm_api_options()["kv_cache_config"]["max_tokens"] == 100_000


def test_helix_on_b200_with_weights() -> None:
    """B200 (192,265,846,784 B) - 90 GiB of weights = 95,629,082,624 B free once loaded;
    ``0.9 x 95,629,082,624 / 70,272 = 1,224,757.7`` tokens -> 38,273 blocks."""
    result = plan_trtllm("deepseek-v3", gpu="b200", weights_memory="90GiB", context_parallel_size=2)
    assert result.ranks[0].free_after_warmup == 192_265_846_784 - 90 * GIB == 95_629_082_624
    assert result.pools[0].primary_blocks == 38_273


def test_helix_yaml_and_serve_line() -> None:
    """``cp_config.tokens_per_block`` equal to ``kv_cache_config.tokens_per_block`` (helix.md), the CP size on the
    ``trtllm-serve`` line as ``--cp_size``."""
    result = plan_trtllm("deepseek-v3", memory="60GiB", context_parallel_size=4, tokens_per_block=64)
    options = result.extra_llm_api_options()
    assert options["cp_config"] == {"cp_type": "HELIX", "tokens_per_block": 64}
    assert options["kv_cache_config"]["tokens_per_block"] == 64
    assert result.extra_options_yaml().endswith("cp_config:\n  cp_type: HELIX\n  tokens_per_block: 64\n")
    assert "--pp_size 1 --cp_size 4 --max_batch_size" in result.serve_command()
    data = result.to_dict()
    assert data["context_parallel_size"] == 4 and data["cp_config"]["cp_type"] == "HELIX"
    # 64-token blocks: 0.9 x 60 GiB / 70,272 = 825,108 tokens // 64 = 12,892 blocks
    assert result.pools[0].primary_blocks == 12_892


@pytest.mark.parametrize(
    ("context", "tokens_per_block", "cp", "blocks"),
    [
        (200, 32, 4, (2, 2, 2, 1)),  # 7 blocks: round-robin {0,4} {1,5} {2,6} {3}; contiguous 2,2,2,1
        (129, 32, 4, (2, 1, 1, 1)),  # 5 blocks
        (131_072, 32, 4, (1_024,) * 4),
        (100_000, 32, 4, (782, 781, 781, 781)),
    ],
)
def test_rank_blocks(context: int, tokens_per_block: int, cp: int, blocks: tuple[int, ...]) -> None:
    assert ContextParallel(size=cp, tokens_per_block=tokens_per_block).rank_blocks(context) == blocks


def _round_robin(blocks: int, cp: int) -> list[int]:
    """partition_context_for_helix: rank r owns blocks r, r + cp, ... (``blocks[cp_rank::cp_size]``)."""
    return [len(range(rank, blocks, cp)) for rank in range(cp)]


def _contiguous(blocks: int, cp: int) -> list[int]:
    """_merge_helix_requests: ``torch.tensor_split`` of the blocks into cp runs (the first ``n % cp`` one longer)."""
    base, extra = divmod(blocks, cp)
    return [base + (1 if rank < extra else 0) for rank in range(cp)]


@given(st.integers(1, 2_000_000), st.sampled_from([8, 16, 32, 64, 128]), st.integers(2, 64))
def test_rank_blocks_match_both_partitions(context: int, tokens_per_block: int, cp: int) -> None:
    """Both TensorRT-LLM partitions give the same blocks per rank; they sum to the request's blocks, and rank 0 holds
    the most, ``ceil(n / cp)``."""
    blocks = math.ceil(context / tokens_per_block)
    helix = ContextParallel(size=cp, tokens_per_block=tokens_per_block)
    if blocks < cp:
        with pytest.raises(ConfigError, match="at least one block per CP rank"):
            helix.rank_blocks(context)
        return
    got = list(helix.rank_blocks(context))
    assert got == _round_robin(blocks, cp) == _contiguous(blocks, cp)
    assert sum(got) == blocks and got[0] == max(got) == math.ceil(blocks / cp)


def test_helix_refuses_a_request_shorter_than_one_block_per_rank() -> None:
    """64 tokens are 2 blocks of 32: fewer than 4 CP ranks, which TensorRT-LLM's partition raises on."""
    result = plan_trtllm("deepseek-v3", memory="60GiB", context_parallel_size=4)
    with pytest.raises(ConfigError, match="num_total_blocks 2 < num_cp_ranks 4"):
        result.concurrency_at(64)


@pytest.mark.parametrize(
    ("model", "kwargs", "error", "message"),
    [
        # TensorRT-LLM's own refusals
        ("deepseek-v3", {"cp_type": "ring"}, UnsupportedCombinationError, "'Unsupported cp type RING.'"),
        ("deepseek-v3", {"cp_type": "ULYSSES"}, UnsupportedCombinationError, "MLA doesn't support CP Ulysses yet"),
        ("deepseek-v3", {"cp_type": "bogus"}, ConfigError, "Invalid cp_type: bogus. Must be one of"),
        (
            "deepseek-v3",
            {"serving": Serving(tp_size=8), "context_parallel_size": 32},
            UnsupportedCombinationError,
            "num_heads % (tp_size * cp_size) == 0 and 128 query heads do not divide by 256",
        ),
        ("deepseek-v3", {"context_parallel_size": 1, "cp_type": "HELIX"}, ConfigError, "cp_size > 1"),
        # what kvpools does not model with helix yet, by name
        ("llama-3.1-8b", {}, UnsupportedCombinationError, "Multi-head Latent Attention only"),
        ("deepseek-v3.2", {}, UnsupportedCombinationError, "indexer K cache"),
        ("deepseek-v4-flash", {}, UnsupportedCombinationError, "KVCacheManagerV2"),
        ("qwen3-next-80b-a3b-thinking", {}, UnsupportedCombinationError, "Mamba / linear-attention hybrid"),
        ("deepseek-v3", {"cp_type": "star"}, UnsupportedCombinationError, "star attention"),
        ("deepseek-v3", {"num_nextn_predict_layers": 1}, UnsupportedCombinationError, "speculative decoding"),
        ("deepseek-v3", {"max_attention_window": "4096"}, UnsupportedCombinationError, "--max_attention_window"),
        ("deepseek-v3", {"host_cache_size": "1GiB"}, UnsupportedCombinationError, "--host_cache_size"),
        (
            "deepseek-v3",
            {"serving": Serving(tp_size=2), "enable_attention_dp": True},
            UnsupportedCombinationError,
            "--enable_attention_dp",
        ),
    ],
)
def test_helix_refusals(model: str, kwargs: dict, error: type[Exception], message: str) -> None:
    kwargs = {"memory": "60GiB", "context_parallel_size": 2, **kwargs}
    with pytest.raises(error) as raised:
        plan_trtllm(model, **kwargs)
    assert message in str(raised.value)


def test_helix_gpu_budgets_refused_where_not_modelled() -> None:
    with pytest.raises(UnsupportedCombinationError, match="Blackwell GPUs only"):
        plan_trtllm("deepseek-v3", gpu="h200", weights_memory="80GiB", context_parallel_size=2)
    with pytest.raises(UnsupportedCombinationError, match="does not estimate helix's weights"):
        plan_trtllm("deepseek-v3", gpu="b200", context_parallel_size=2)


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_cli_capacity_with_cp_size() -> None:
    code, out, err = _cli(
        "capacity", "deepseek-v3", "--accounting", "trtllm", "--memory", "60GiB", "--cp_size", "4",
        "--context", "128k", "--json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["capacity"] == [{"context_len": 131_072, "max_requests": 25}]
    assert data["cp_config"] == {"cp_type": "HELIX", "tokens_per_block": 32}
    assert "--cp_size 4" in data["serve_command"]


def test_cli_refusals() -> None:
    code, _, err = _cli("plan", "deepseek-v3", "--memory", "60GiB", "--context_parallel_size", "2")
    assert code == 1 and "only with --accounting trtllm" in err
    code, _, err = _cli(
        "plan", "deepseek-v3", "--accounting", "trtllm", "--memory", "60GiB", "--cp_size", "2",
        "--format", "capacity-json",
    )  # fmt: skip
    assert code == 1 and "capacity record of helix" in err and "Traceback" not in err


def test_cli_capacity_table_names_helix() -> None:
    """The human report: CP in the header, the memory free at the KV cache's creation (no warm-up), the requests'
    split in the table's title, and the launch line with ``--cp_size``."""
    code, out, err = _cli(
        "capacity", "deepseek-v3", "--accounting", "trtllm", "--memory", "60GiB", "--cp_size", "4",
        "--context", "128k",
    )  # fmt: skip
    assert code == 0, err
    text = " ".join(out.split())
    assert "CP 4 (helix)" in text
    assert "free at KV cache creation" in text and "free after warm-up" not in text
    assert "ceil(ceil(L / tokens) / cp 4)" in text
    assert "│ 131072 │ 25 │" in text
    assert "--cp_size 4" in text and "cp_type: HELIX" in text


def test_the_capacity_record_refuses_a_helix_plan_from_python() -> None:
    """The record's one blocks-per-request field cannot say a helix request's blocks split over the CP ranks, so the
    library refuses it as the CLI's ``--format capacity-json`` does, instead of writing rank 0's pool as if it held
    whole requests."""
    from kvpools_core.planning.capacity_record import trtllm_capacity_document

    result = plan_trtllm("deepseek-v3", memory="60GiB", context_parallel_size=2)
    with pytest.raises(UnsupportedCombinationError, match="helix context parallelism"):
        trtllm_capacity_document(result, context_len=8192)
