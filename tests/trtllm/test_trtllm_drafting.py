"""``--accounting trtllm``: a separate draft model's KV cache -- Eagle3 one-model and two-model, Draft_Target --
(issue 35), hand-computed from TensorRT-LLM's sources read through the code index:

- ``tensorrt_llm/_torch/pyexecutor/_util.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412, class ``KvCacheCreator``:
  ``_get_kv_size_per_token`` (the target's ``get_cache_size_per_token`` plus, two-model, the draft engine's
  ``get_cache_size_per_token(draft_model_config)`` over its layers, or, one-model with a separate draft cache,
  ``get_cache_size_per_token(effective_draft_config, num_layers=_get_num_draft_layers())``);
  ``configure_kv_cache_capacity`` (V1: ``kv_cache_config.max_tokens = tokens_for_budget(budget)`` over that sum);
  ``build_managers`` (the GPU split ``_split_kv_cache_budget_for_draft("max_gpu_total_bytes")`` only "when each
  manager sizes its pools from max_gpu_total_bytes (V2 and V1 VSWA). V1 non-VSWA and estimation size GPU pools
  from a shared max_tokens instead"; the draft manager built after the target's from the same config);
  ``_should_create_separate_draft_kv_cache`` (no separate draft cache with attention DP);
  ``_get_effective_draft_config`` (Eagle3: the draft checkpoint's config);
- ``tensorrt_llm/_torch/pyexecutor/resource_manager.py`` (stored copy, id 77926604):
  ``KVCacheManager.get_cache_size_per_token`` (``num_key_value_heads``, ``head_dim`` or ``hidden_size //
  num_attention_heads``, ``head_dim x heads // tp``, 2 B or 1 B with an fp8 KV cache);
- ``tensorrt_llm/llmapi/llm_args.py`` (the 1.2-era stored copy, id 7019226376): ``DecodingBaseConfig.
  _allow_separate_draft_kv_cache = PrivateAttr(True)``, ``speculative_model`` (alias ``speculative_model_dir``),
  ``EagleDecodingConfig.eagle3_one_model`` default True and ``validate_eagle_config``: "max_draft_len must be > 0
  for Eagle", ``num_eagle_layers = max_draft_len``; ``validate_speculative_model``: "Draft model must be provided
  for EAGLE"; ``DraftTargetDecodingConfig`` ``Literal["Draft_Target"]``;
- ``tensorrt_llm/_torch/speculative/utils.py`` (the 1.2-era stored copy, id 13542650405): ``get_num_spec_layers``
  = ``num_eagle_layers`` for Eagle3 one-model; ``get_num_extra_kv_tokens`` = ``max_draft_len - 1`` for a
  one-engine drafter, 0 otherwise; ``py_executor_creator.py`` (id 1083207948): the two-model draft engine is a
  ``PyTorchModelEngine(speculative_model_dir, mapping=mapping, spec_config=draft_spec_config)`` with
  ``max_draft_len = 0`` and ``kv_cache_manager_key = DRAFT_KV_CACHE_MANAGER``;
- ``modeling_speculative.py``: the one-model draft config takes the target's ``kv_cache_quant_algo``.

The draft checkpoint is the geometry of ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``'s ``config.json`` (one
``LlamaForCausalLMEagle3`` layer, 32 attention heads, 8 KV heads, hidden 4096: head_dim 128, float16).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.values import Serving

GIB = 1 << 30
BUDGET_20 = 19_327_352_832  # int(20 GiB x 0.9), _cal_max_memory
BUDGET_40 = 38_654_705_664  # int(40 GiB x 0.9)


def _eagle3_config(hidden: int, heads: int, dtype: str) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 14336,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "num_hidden_layers": 1,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-05,
        "torch_dtype": dtype,
        "vocab_size": 128256,
        "draft_vocab_size": 32000,
    }


@pytest.fixture(scope="module")
def eagle3_8b(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("eagle3-llama3.1-8b") / "config.json"
    path.write_text(json.dumps(_eagle3_config(4096, 32, "float16")))
    return str(path)


@pytest.fixture(scope="module")
def eagle3_70b(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("eagle3-llama3.3-70b") / "config.json"
    path.write_text(json.dumps(_eagle3_config(8192, 64, "bfloat16")))
    return str(path)


def test_eagle3_one_model_llama_8b(eagle3_8b: str) -> None:
    """Llama-3.1-8B + Eagle3 (one-model, TensorRT-LLM's default), ``max_draft_len`` 3, 20 GiB free after warm-up.

    Target: 32 layers x 2 x 8 x 128 x 2 B = 131,072 B.  Draft manager: ``num_layers = get_num_spec_layers`` =
    ``num_eagle_layers`` = ``max_draft_len`` = 3 layers of the draft config's layout: 3 x 2 x 8 x 128 x 2 =
    12,288 B.  ``max_tokens`` = 19,327,352,832 // 143,360 = 134,816 -> 4,213 blocks in the target's manager
    (min with 0.9 x free / 131,072 = 147,456) and in the draft's (0.9 x (free - 4,213 x 32 x 131,072) / 12,288 =
    278,668).  Without the draft: 19,327,352,832 // 131,072 = 147,456 -> 4,608 blocks.  A request holds (3 - 1) + 3
    = 5 extra tokens: ceil(8,197 / 32) = 257 blocks, 4,213 // 257 = 16 requests of 8k."""
    result = plan_trtllm(
        "llama-3.1-8b", memory="20GiB", decoding_type="Eagle3", speculative_model_dir=eagle3_8b, max_draft_len=3
    )
    rank = result.ranks[0]
    assert rank.available_kv_memory == BUDGET_20
    assert (rank.estimated_size_per_token, rank.draft_estimated_size_per_token) == (131_072, 12_288)
    assert rank.max_tokens == BUDGET_20 // 143_360 == 134_816
    target, draft = result.pools
    assert (target.draft, target.bytes_per_token, target.primary_blocks, len(target.layers)) == (
        False,
        131_072,
        4_213,
        32,
    )
    assert (draft.draft, draft.bytes_per_token, draft.primary_blocks, draft.layers) == (
        True,
        12_288,
        4_213,
        (32, 33, 34),
    )
    assert result.draft_kv_cache == "separate"
    assert result.drafting is not None and result.drafting.mode == "eagle3_one_model"
    assert result.kv_cache_capacity() == {"maxNumBlocks": 4_213, "tokensPerBlock": 32, "maxNumTokens": 134_816}
    assert result.extra_tokens_per_request == 5
    assert result.concurrency_at(8192) == 4_213 // 257 == 16
    assert plan_trtllm("llama-3.1-8b", memory="20GiB").pools[0].primary_blocks == 4_608
    assert result.extra_llm_api_options()["speculative_config"] == {
        "decoding_type": "Eagle3",
        "max_draft_len": 3,
        "speculative_model_dir": str(Path(eagle3_8b).parent),
        "eagle3_one_model": True,
    }
    assert "speculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n" in result.extra_options_yaml()


def test_eagle3_draft_layers_are_max_draft_len_in_1_2(eagle3_8b: str) -> None:
    """NVIDIA/TensorRT-LLM PR #12188 (https://github.com/NVIDIA/TensorRT-LLM/pull/12188): "EAGLE3: config says 1
    layer, runtime uses 4" -- with ``max_draft_len`` 4 the draft manager holds 4 layers of a one-layer checkpoint,
    4 x 4,096 = 16,384 B per token, the over-allocation PR #15017 (https://github.com/NVIDIA/TensorRT-LLM/pull/15017,
    after 1.2: ``get_num_spec_layers`` from ``_num_draft_hidden_layers``) removed.  19,327,352,832 // (131,072 +
    16,384) = 131,072 tokens exactly -> 4,096 blocks; counting the checkpoint's one layer would give
    19,327,352,832 // 135,168 = 142,987 -> 4,468 (the two-model figure below)."""
    result = plan_trtllm(
        "llama-3.1-8b", memory="20GiB", decoding_type="Eagle3", speculative_model_dir=eagle3_8b, max_draft_len=4
    )
    assert result.drafting is not None and result.drafting.draft.num_layers == 1
    draft = result.pools[1]
    assert (len(draft.layers), draft.bytes_per_token) == (4, 16_384)
    assert result.ranks[0].max_tokens == BUDGET_20 // 147_456 == 131_072
    assert [pool.primary_blocks for pool in result.pools] == [4_096, 4_096]
    assert result.extra_tokens_per_request == (4 - 1) + 4


def test_eagle3_one_model_fp8_tp4(eagle3_70b: str) -> None:
    """Llama-3.1-70B on TP 4 with an fp8 KV cache and an Eagle3 draft (8 KV heads of 8192 / 64 = 128), the draft
    taking the target's ``kv_cache_quant_algo``.  Estimates: ``head_dim x heads // tp`` = 128 x 8 // 4 = 256;
    target 2 x 80 x 256 x 1 B = 40,960, draft 2 x 3 x 256 = 1,536.  40 GiB: 38,654,705,664 // 42,496 = 909,608 ->
    28,425 blocks each (target: min with 0.9 x free / 40,960 = 943,718); 8k + 5 tokens = 257 blocks: 110."""
    result = plan_trtllm(
        "llama-3.1-70b",
        Serving(tp_size=4, kv_cache_dtype="fp8_e4m3"),
        memory="40GiB",
        decoding_type="Eagle3",
        speculative_model_dir=eagle3_70b,
        max_draft_len=3,
    )
    rank = result.ranks[0]
    assert (rank.estimated_size_per_token, rank.draft_estimated_size_per_token) == (40_960, 1_536)
    assert rank.max_tokens == BUDGET_40 // 42_496 == 909_608
    assert [(pool.bytes_per_token, pool.primary_blocks) for pool in result.pools] == [(40_960, 28_425), (1_536, 28_425)]
    assert result.concurrency_at(8192) == 110
    assert "dtype: fp8" in result.extra_options_yaml()


def test_eagle3_two_model(eagle3_8b: str) -> None:
    """``eagle3_one_model: false``: a second engine whose manager sizes the draft checkpoint's one layer
    (``get_cache_size_per_token(draft_model_config)``, ``pp_layers`` of 1 layer): 4,096 B.  19,327,352,832 //
    135,168 = 142,987 -> 4,468 blocks each; ``get_num_extra_kv_tokens`` is 0 (not one engine), the target holds
    the 3 draft tokens: ceil(8,195 / 32) = 257 blocks, 4,468 // 257 = 17 requests of 8k."""
    result = plan_trtllm(
        "llama-3.1-8b",
        memory="20GiB",
        decoding_type="Eagle",
        speculative_model_dir=eagle3_8b,
        max_draft_len=3,
        eagle3_one_model=False,
    )
    assert result.drafting is not None and result.drafting.mode == "eagle3_two_model"
    assert result.ranks[0].draft_estimated_size_per_token == 4_096
    assert result.ranks[0].max_tokens == BUDGET_20 // 135_168 == 142_987
    assert [(len(pool.layers), pool.primary_blocks) for pool in result.pools] == [(32, 4_468), (1, 4_468)]
    assert result.extra_tokens_per_request == 3
    assert result.concurrency_at(8192) == 17
    assert result.extra_llm_api_options()["speculative_config"]["eagle3_one_model"] is False


def test_draft_target_llama_70b_with_8b() -> None:
    """``decoding_type: Draft_Target``, Llama-3.1-8B drafting for Llama-3.1-70B on TP 4 (the draft engine takes
    the same ``mapping``): target 80 x 2 x ceil(8/4) x 128 x 2 = 81,920 B, draft 32 x 2 x 2 x 128 x 2 = 32,768 B.
    38,654,705,664 // 114,688 = 337,042 -> 10,532 blocks each (draft: 0.9 x (free - 10,532 x 32 x 81,920) /
    32,768 = 421,362 does not bind); 4 draft tokens: ceil(8,196 / 32) = 257 blocks, 10,532 // 257 = 40."""
    result = plan_trtllm(
        "llama-3.1-70b",
        Serving(tp_size=4),
        memory="40GiB",
        decoding_type="DraftTarget",
        speculative_model_dir="llama-3.1-8b",
        max_draft_len=4,
    )
    rank = result.ranks[0]
    assert (rank.estimated_size_per_token, rank.draft_estimated_size_per_token) == (81_920, 32_768)
    assert rank.max_tokens == BUDGET_40 // 114_688 == 337_042
    assert [(pool.bytes_per_token, pool.primary_blocks) for pool in result.pools] == [
        (81_920, 10_532),
        (32_768, 10_532),
    ]
    assert result.kv_cache_capacity() == {"maxNumBlocks": 10_532, "tokensPerBlock": 32, "maxNumTokens": 337_024}
    assert result.concurrency_at(8192) == 40
    assert result.extra_llm_api_options()["speculative_config"] == {
        "decoding_type": "Draft_Target",
        "max_draft_len": 4,
        "speculative_model_dir": "meta-llama/Meta-Llama-3.1-8B",
    }


def test_draft_target_with_attention_dp_keeps_the_draft_engine() -> None:
    """Two-model drafting keeps its draft engine's manager with attention DP (the separate-cache bail-out is
    one-model's); neither model's KV heads are divided by TP: target 80 x 2 x 8 x 128 x 2 = 327,680 B, draft
    32 x 2 x 8 x 128 x 2 = 131,072 B; 38,654,705,664 // 458,752 = 84,260 -> 2,633 blocks each."""
    result = plan_trtllm(
        "llama-3.1-70b",
        Serving(tp_size=4),
        memory="40GiB",
        decoding_type="Draft_Target",
        speculative_model_dir="llama-3.1-8b",
        max_draft_len=4,
        enable_attention_dp=True,
    )
    assert [(pool.bytes_per_token, pool.primary_blocks) for pool in result.pools] == [
        (327_680, 2_633),
        (131_072, 2_633),
    ]


def test_eagle3_beside_an_mla_target(eagle3_8b: str) -> None:
    """DeepSeek-V3 (MLA, 61 x 576 x 2 = 70,272 B) with a Llama-layout Eagle3 draft: TensorRT-LLM estimates the
    draft with the target's ``KVCacheManager`` class on the draft config (no ``kv_lora_rank``: K and V), 3 x 2 x
    8 x 128 x 2 = 12,288 B.  60 GiB: 57,982,058,496 // 82,560 = 702,302 -> 21,946 blocks each."""
    result = plan_trtllm(
        "deepseek-v3", memory="60GiB", decoding_type="Eagle3", speculative_model_dir=eagle3_8b, max_draft_len=3
    )
    assert result.ranks[0].max_tokens == 57_982_058_496 // 82_560 == 702_302
    assert [(pool.bytes_per_token, pool.primary_blocks) for pool in result.pools] == [
        (70_272, 21_946),
        (12_288, 21_946),
    ]


@pytest.mark.parametrize(
    ("model", "serving", "kwargs", "error", "message"),
    [
        # what TensorRT-LLM refuses, with its reason (llm_args.py validators)
        ("llama-3.1-8b", {}, {"decoding_type": "Eagle3", "max_draft_len": 3}, ConfigError,
         "Draft model must be provided"),
        ("llama-3.1-8b", {}, {"decoding_type": "Eagle3", "speculative_model_dir": "DRAFT"}, ConfigError,
         "max_draft_len must be > 0 for Eagle"),
        ("llama-3.1-8b", {}, {"decoding_type": "Draft_Target", "speculative_model_dir": "llama-3.1-8b"}, ConfigError,
         "max_draft_len must be > 0 for DraftTarget"),
        ("llama-3.1-8b", {}, {"decoding_type": "Medusa"}, UnsupportedCombinationError, "supports_backend"),
        # options that need another, or that describe two speculative_configs
        ("llama-3.1-8b", {}, {"speculative_model_dir": "DRAFT", "max_draft_len": 3}, ConfigError, "--decoding_type"),
        ("llama-3.1-8b", {}, {"decoding_type": "MTP"}, ConfigError, "--num_nextn_predict_layers"),
        ("deepseek-v3", {}, {"decoding_type": "Eagle3", "speculative_model_dir": "DRAFT", "max_draft_len": 3,
                             "num_nextn_predict_layers": 1}, ConfigError, "two speculative_configs"),
        ("llama-3.1-8b", {}, {"decoding_type": "Draft_Target", "speculative_model_dir": "llama-3.1-8b",
                              "max_draft_len": 3, "eagle3_one_model": True}, ConfigError, "EagleDecodingConfig's"),
        # what kvpools does not model yet, by name
        ("llama-3.1-8b", {}, {"decoding_type": "NGram", "max_draft_len": 3}, UnsupportedCombinationError,
         "kvpools does not model speculative_config decoding_type 'NGram'"),
        ("llama-3.1-8b", {"pp_size": 2}, {"decoding_type": "Eagle3", "speculative_model_dir": "DRAFT",
                                          "max_draft_len": 3}, UnsupportedCombinationError, "over pipeline stages"),
        ("gpt-oss-20b", {}, {"decoding_type": "Eagle3", "speculative_model_dir": "DRAFT", "max_draft_len": 3},
         UnsupportedCombinationError, "beside attention windows"),
        ("qwen3-next-80b-a3b-thinking", {}, {"decoding_type": "Eagle3", "speculative_model_dir": "DRAFT",
                                             "max_draft_len": 3}, UnsupportedCombinationError, "hybrid"),
        ("deepseek-v3.2", {}, {"decoding_type": "Eagle3", "speculative_model_dir": "DRAFT", "max_draft_len": 3},
         UnsupportedCombinationError, "DeepSeek sparse attention"),
        ("llama-3.1-70b", {"tp_size": 4}, {"decoding_type": "Eagle3", "speculative_model_dir": "DRAFT",
                                           "max_draft_len": 3, "enable_attention_dp": True},
         UnsupportedCombinationError, "_build_per_layer_num_kv_heads"),
        ("llama-3.1-8b", {}, {"decoding_type": "Eagle3", "speculative_model_dir": "DRAFT", "max_draft_len": 3,
                              "host_cache_size": "8GiB"}, UnsupportedCombinationError, "splits host_cache_size"),
        ("llama-3.1-8b", {}, {"decoding_type": "Draft_Target", "speculative_model_dir": "gpt-oss-20b",
                              "max_draft_len": 3}, UnsupportedCombinationError, "every layer is full attention"),
    ],
)  # fmt: skip
def test_drafting_refusals(
    eagle3_8b: str, model: str, serving: dict[str, int], kwargs: dict[str, object], error: type, message: str
) -> None:
    kwargs = {key: eagle3_8b if value == "DRAFT" else value for key, value in kwargs.items()}
    with pytest.raises(error, match=message):
        plan_trtllm(model, Serving(**serving), memory="40GiB", **kwargs)  # type: ignore[arg-type]


def test_a_gpu_budget_needs_the_draft_weights(eagle3_8b: str) -> None:
    """``--gpu`` takes the free memory as ``total - weights`` from kvpools' estimate of the target's weights, which
    would leave out the draft model's: refused unless ``--weights-memory`` gives one rank's target + draft weights
    (H100 torch total 79.19 GiB - 20 GiB - the MLP activation 8192 x (3 x 14336 + 2 x 4096) x 2 B = 838,860,800 B
    free, x 0.9 over 131,072 + 12,288 B)."""
    kwargs = {"decoding_type": "Eagle3", "speculative_model_dir": eagle3_8b, "max_draft_len": 3}
    with pytest.raises(UnsupportedCombinationError, match="draft model's weights"):
        plan_trtllm("llama-3.1-8b", gpu="h100", **kwargs)  # type: ignore[arg-type]
    result = plan_trtllm("llama-3.1-8b", gpu="h100", weights_memory="20GiB", **kwargs)  # type: ignore[arg-type]
    rank = result.ranks[0]
    assert rank.free_after_warmup == 85_029_615_043 - 20 * GIB - 838_860_800 == 62_715_917_763
    assert rank.max_tokens == int(rank.free_after_warmup * 0.9) // 143_360


def test_drafting_cli(eagle3_8b: str) -> None:
    """``kvpools plan`` / ``capacity`` with ``--decoding_type``: the draft pool in the report, the YAML, the
    capacity at 8k and the capacity record; TensorRT-LLM's flags are refused without ``--accounting trtllm``
    and SGLang's speculative flags are refused under it, naming TensorRT-LLM's."""
    from click.testing import CliRunner

    from kvpools_core.cli import main

    runner = CliRunner()
    args = ["plan", "llama-3.1-8b", "--memory", "20GiB", "--accounting", "trtllm", "--decoding_type", "Eagle3",
            "--speculative_model_dir", eagle3_8b, "--max_draft_len", "3"]  # fmt: skip
    shown = runner.invoke(main, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert [pool["primary_blocks"] for pool in data["pools"]] == [4_213, 4_213]
    assert data["drafting"]["mode"] == "eagle3_one_model" and data["drafting"]["draft_layers"] == 3
    assert data["extra_llm_api_options"]["speculative_config"]["decoding_type"] == "Eagle3"
    table = runner.invoke(main, args, terminal_width=200)
    assert table.exit_code == 0 and "Eagle3 (eagle3_one_model) draft manager" in table.stdout
    assert "131072 (draft)" in table.stdout and "eagle3_one_model: true" in table.stdout
    capacity = runner.invoke(main, ["capacity", *args[1:], "--context", "8k", "--json"])
    assert capacity.exit_code == 0, capacity.output
    assert json.loads(capacity.stdout)["capacity"] == [{"context_len": 8192, "max_requests": 16}]
    two = runner.invoke(main, [*args, "--eagle3_one_model", "false", "--json"])
    assert two.exit_code == 0 and json.loads(two.stdout)["pools"][1]["primary_blocks"] == 4_468
    record = runner.invoke(main, [*args, "--format", "capacity-json", "--context", "8k"])
    assert record.exit_code == 0, record.output  # the draft pool is a group of its own (issue 35)
    assert json.loads(record.stdout)["records"][0]["trtllm"]["draft"]["decoding_type"] == "Eagle3"
    sglang = runner.invoke(main, ["plan", "llama-3.1-8b", "--memory", "20GiB", "--decoding_type", "Eagle3"])
    assert sglang.exit_code == 1 and "only with --accounting trtllm" in sglang.stderr
    path = runner.invoke(main, [*args[:6], "--speculative-draft-model-path", "llama-3.1-8b"])
    assert path.exit_code == 1 and "--speculative_model_dir" in path.stderr and "Traceback" not in path.output
    algorithm = runner.invoke(main, [*args[:6], "--speculative-algorithm", "EAGLE3"])
    assert algorithm.exit_code == 1 and "use --decoding_type" in algorithm.stderr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    free=st.integers(min_value=4 * GIB, max_value=120 * GIB),
    fraction=st.floats(min_value=0.05, max_value=0.95),
    draft_len=st.integers(min_value=1, max_value=8),
    tp_size=st.sampled_from([1, 2, 4, 8]),
    dtype=st.sampled_from(["auto", "fp8_e4m3"]),
    mode=st.sampled_from(["one", "two", "draft_target"]),
)
def test_the_draft_claims_no_budget_of_its_own(
    eagle3_70b: str, free: int, fraction: float, draft_len: int, tp_size: int, dtype: str, mode: str
) -> None:
    """Whatever the draft, ``KvCacheCreator`` divides one budget by target + draft bytes per token
    (``_get_kv_size_per_token``, ``tokens_for_budget``): ``max_tokens`` is the largest count whose target + draft
    bytes fit the budget, both managers keep ``max_tokens // tokens_per_block`` blocks unless the free memory
    binds first, and the two pools together never exceed ``int(free x fraction)`` -- the doubled budget of
    NVIDIA/TensorRT-LLM PR #12188 / #12855 does not happen on the V1 single-window path."""
    draft = {"one": eagle3_70b, "two": eagle3_70b, "draft_target": "llama-3.1-8b"}[mode]
    result = plan_trtllm(
        "llama-3.1-70b",
        Serving(tp_size=tp_size, kv_cache_dtype=dtype),
        memory=free,
        kv_cache_free_gpu_memory_fraction=fraction,
        decoding_type="Draft_Target" if mode == "draft_target" else "Eagle3",
        speculative_model_dir=draft,
        max_draft_len=draft_len,
        eagle3_one_model=None if mode == "draft_target" else mode == "one",
    )
    rank = result.ranks[0]
    per_token = rank.estimated_size_per_token + rank.draft_estimated_size_per_token
    budget = int(free * fraction)
    assert rank.available_kv_memory == budget
    assert rank.max_tokens * per_token <= budget < (rank.max_tokens + 1) * per_token
    target, draft_pool = result.pools
    assert draft_pool.draft and not target.draft
    assert len(draft_pool.layers) == (draft_len if mode == "one" else {"two": 1, "draft_target": 32}[mode])
    assert target.primary_blocks == draft_pool.primary_blocks == rank.max_tokens // 32
    block_bytes = 32 * (target.bytes_per_token + draft_pool.bytes_per_token)
    assert target.primary_blocks * block_bytes <= budget
