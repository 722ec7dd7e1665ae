"""Minimal cases where kvpools ``--accounting sglang`` and SGLang's sizing disagreed (reported, now fixed).

Kept as regression tests.  The last one pins a deliberate divergence: SGLang
starts a server that can hold no request, kvpools refuses the plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpools_core.errors import ConfigError, InsufficientMemoryError, KvpoolsError
from kvpools_core.pipeline import plan
from kvpools_core.values import Serving

from .adapter import compare, model_from_config, oracle_params, preset_model, run_oracle
from .locate import require_oracle

pytestmark = pytest.mark.oracle

require_oracle()

GiB = 1 << 30

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def write_config(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_float32_config_auto_kv_is_served_in_float16(tmp_path: Path) -> None:
    """SGLang runs a float32 checkpoint in float16 under ``--dtype auto`` (ModelConfig.
    _get_and_verify_dtype: "we use float16 for float32 models"), and ``--kv-cache-dtype auto``
    follows that dtype: 2 layers x 1 head x (128+128) x 2 B = 1024 B/token.  kvpools resolved
    auto to fp32: 2048 B/token, half the tokens (524288 instead of 1048576 in 1 GiB)."""
    config = {**TINY_LLAMA, "torch_dtype": "float32"}
    compare(write_config(tmp_path, config), model_from_config(config), Serving(), memory=GiB)


def test_multimodal_model_reserves_vlm_cache_from_profiled_budget(tmp_path: Path) -> None:
    """``_profile_available_bytes`` subtracts ``mm_runtime_reservation_gb`` (SGLANG_VLM_CACHE_SIZE_MB,
    100 MiB by default) for a multimodal model: 80 GiB free, 10 GiB weights, 0.9 →
    66467135488 B for KV (SGLang) vs 66571993088 B (kvpools before the fix), 64909312 vs 65011712 tokens."""
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "text_config": {k: v for k, v in TINY_LLAMA.items() if k != "architectures"},
    }
    compare(
        write_config(tmp_path, config),
        model_from_config(config),
        Serving(),
        free_memory=80 * GiB,
        weights_memory=10 * GiB,
    )


def test_empty_pipeline_stage_is_rejected() -> None:
    """A stage without layers: SGLang's DefaultPoolConfigurator has cell_size 0 and divides by it
    (ZeroDivisionError in calculate_pool_sizes); kvpools planned it with a made-up 1-byte cell
    ("could hold 10737418240 tokens").  Now kvpools refuses the partition up front."""
    serving = Serving(accounting="sglang", pp_size=2, pp_rank=0, pp_layer_partition=(0, 32))
    oracle = run_oracle(oracle_params(preset_model("llama-3.1-8b"), serving, memory=10 * GiB))
    assert oracle["error"]["type"] == "ZeroDivisionError"
    with pytest.raises(KvpoolsError):
        plan("llama-3.1-8b", serving, memory=10 * GiB)


def test_zero_requests_sglang_starts_kvpools_refuses() -> None:
    """Deliberate divergence: with one token of budget SGLang caps requests at tokens // 2 = 0 and
    carries on; kvpools raises."""
    want, got = compare("llama-3.1-8b", preset_model("llama-3.1-8b"), Serving(), memory=2 * 128 * 2 * 32 * 8)
    assert want.error is None and want.max_running_requests == 0
    assert isinstance(got, InsufficientMemoryError)
    assert "no request" in str(got)


def test_requests_below_the_dp_attention_width_sglang_starts_kvpools_refuses() -> None:
    """Deliberate divergence: 3 requests over 4 DP-attention workers is 0 per worker; SGLang starts a
    server that serves nothing, kvpools refuses the option itself (the cause, not an empty pool)."""
    fits = Serving(accounting="sglang", tp_size=4, dp_size=4, enable_dp_attention=True, max_running_requests=4)
    params = oracle_params(preset_model("llama-3.1-8b"), fits, memory=40 * GiB)
    params["server_args"]["max_running_requests"] = 3
    oracle = run_oracle(params)
    assert oracle.get("error") is None and oracle["memory_pool_config"]["max_running_requests"] == 0
    with pytest.raises(ConfigError, match=r"max_running_requests 3 is split over 4 DP-attention workers"):
        Serving(tp_size=4, dp_size=4, enable_dp_attention=True, max_running_requests=3)
