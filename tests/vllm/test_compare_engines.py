"""``kvpools compare`` / ``compare_engines``: SGLang's and vLLM's accounting of one model, side by side (issue 18).

Every expected number is worked out beside its assertion: SGLang's ``available_bytes // cell_size`` page-aligned
(``002_50706b73e02ffb67.txt`` L284-285, L403 with a window pool), vLLM's ``available // bytes_per_block`` blocks,
the null block, and ``num_gpu_blocks / Σ blocks per request`` (``kv_cache_utils.py``, as ``kvpools_core/vllm``
cites).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.errors import ConfigError
from kvpools_core.pipeline import plan
from kvpools_core.planning.compare import compare_engines
from kvpools_core.values import Serving

GiB = 1 << 30
BUDGET = 40 * GiB


def row(comparison: Any, kind: str) -> Any:
    return next(group for group in comparison.groups if group.kind == kind)


def test_llama_differs_by_the_null_block_only() -> None:
    comparison = compare_engines("llama-3.1-8b", memory="40GiB", contexts=(8192, 32768))
    full = row(comparison, "full attention")
    per_token = 32 * 8 * 128 * 2 * 2  # 32 layers x 8 KV heads x 128 x (K + V) x bf16
    assert full.sglang_bytes_per_unit == full.vllm_bytes_per_token == full.vllm_charged_bytes_per_token == per_token
    assert comparison.sglang_budget == comparison.vllm_budget == BUDGET
    assert full.sglang_slots == BUDGET // per_token == 327_680  # SGLang: int(budget / cell), page 1
    blocks = BUDGET // (16 * per_token)  # vLLM: 2 MiB blocks
    assert comparison.vllm is not None and comparison.vllm.plan.num_gpu_blocks == blocks == 20_480
    assert full.vllm_tokens == (blocks - 1) * 16 == 327_664  # block 0 is the null block: 16 tokens fewer
    assert "tokens: SGLang 327,680, vLLM 327,664 (its 20,479 usable blocks x 16): -16" in full.why
    at_8k, at_32k = comparison.contexts
    assert (at_8k.sglang_requests, at_32k.sglang_requests) == (327_680 // 8192, 327_680 // 32768) == (40, 10)
    assert (at_8k.vllm_blocks_per_request, at_32k.vllm_blocks_per_request) == (512, 2048)
    assert (at_8k.vllm_max_concurrency, at_32k.vllm_max_concurrency) == (20_480 / 512, 20_480 / 2048)
    # whole requests of the usable blocks: the null block costs the 40th and the 10th request
    assert (at_8k.vllm_requests, at_32k.vllm_requests) == (20_479 // 512, 20_479 // 2048) == (39, 9)
    assert "0 B unspent" in " ".join(comparison.notes)


def test_gpt_oss_full_and_sliding_window() -> None:
    comparison = compare_engines("gpt-oss-120b", memory="40GiB", contexts=(8192,))
    full, window = row(comparison, "full attention"), row(comparison, "sliding window")
    per_token = 18 * 8 * 64 * 2 * 2  # 18 layers of each kind x 8 KV heads x 64 x (K + V) x bf16
    assert full.sglang_bytes_per_unit == window.sglang_bytes_per_unit == per_token == 36_864
    assert full.vllm_bytes_per_token == window.vllm_bytes_per_token == per_token
    # SGLang: cell = full + 0.8 x SWA = 66,355.2 B; full tokens int(budget / cell), SWA int(full x 0.8)
    full_tokens = int(BUDGET // (per_token * 1.8))
    assert full.sglang_slots == full_tokens == 647_269
    assert window.sglang_slots == int(full_tokens * 0.8) == 517_815
    # vLLM: two 18-layer groups share 589,824 B blocks (no padding: equal layer counts)
    per_block = 18 * 16 * 8 * 64 * 2 * 2
    assert comparison.vllm is not None and comparison.vllm.plan.bytes_per_block == (per_block,)
    blocks = BUDGET // per_block
    assert comparison.vllm.plan.num_gpu_blocks == blocks == 72_817
    assert full.vllm_tokens == window.vllm_tokens == (blocks - 1) * 16
    (at_8k,) = comparison.contexts
    # full: cdiv(8192, 16) = 512; window 128, in flight 2 x 2048 (no GPU: vllm serve's 2048, pp + 1 batches):
    # cdiv(min(127 + 4096, 8192), 16) + 1 = 265
    assert full.vllm_blocks_per_request == (512,) and window.vllm_blocks_per_request == (265,)
    assert at_8k.vllm_blocks_per_request == 777
    assert at_8k.vllm_max_concurrency == blocks / 777
    assert at_8k.vllm_requests == (blocks - 1) // 777 == 93
    assert (at_8k.sglang_requests, at_8k.sglang_binding) == (full_tokens // 8192, "full tokens") == (79, "full tokens")
    assert any("a request past the window holds at most 258" in line for line in window.why)
    assert any("55.6% of its KV bytes" in line for line in full.why)


def test_vllm_padding_shows_in_the_charged_bytes() -> None:
    """gemma-3-27b at TP 2: 10 full layers, 52 sliding ones split into 6 groups of 9 or 8 (``layers[i::6]``);
    every block spans the widest group (10 layers x 65,536 B), so a sliding-window token is charged 6 blocks of
    655,360 B / 16 tokens = 245,760 B while its 52 layers store 52 x 65,536 / 16 = 212,992 B."""
    comparison = compare_engines("gemma-3-27b-it", Serving(tp_size=2), memory="20GiB", contexts=(8192,))
    window = row(comparison, "sliding window")
    assert comparison.vllm is not None and comparison.vllm.plan.bytes_per_block == (10 * 65_536,)
    assert (window.vllm_layers, len(window.vllm_groups)) == (52, 6)
    assert window.vllm_bytes_per_token == 52 * 65_536 // 16 == 212_992
    # SGLang 0.5.23 keeps Gemma-3's sliding layers in its one dense pool (disable_hybrid_swa_memory,
    # model_overrides/gemma2_gemma3.py line 26): no pool of this kind on its side
    assert window.sglang_bytes_per_unit is None and window.sglang_pools == ()
    assert window.vllm_charged_bytes_per_token == 6 * 10 * 65_536 // 16 == 245_760
    assert any("SGLang has no pool of this kind" in line for line in window.why)
    # where SGLang has the pool too (MiMo-V2-Flash is in is_hybrid_swa_model), the padding is named
    mimo = row(compare_engines("mimo-v2-flash", Serving(tp_size=2), memory="20GiB", contexts=(8192,)), "sliding window")
    assert any("pads" in line and "+15,360 B" in line for line in mimo.why)


def test_mla_latent() -> None:
    comparison = compare_engines("deepseek-v3", Serving(tp_size=8), memory="40GiB", contexts=(32768,))
    (mla,) = comparison.groups
    per_token = 61 * (512 + 64) * 2  # 61 layers x one (kv_lora_rank + rope) latent x bf16, on every TP rank
    assert mla.kind == "MLA" and mla.sglang_bytes_per_unit == mla.vllm_bytes_per_token == per_token == 70_272
    assert mla.sglang_slots == BUDGET // per_token == 611_191
    blocks = BUDGET // (16 * per_token)
    assert comparison.vllm is not None and comparison.vllm.plan.num_gpu_blocks == blocks == 38_199
    # vLLM: 7 tokens lost to whole blocks (550,912 B unspent) and 16 to the null block
    assert BUDGET - blocks * 16 * per_token == 550_912
    assert mla.vllm_tokens == (blocks - 1) * 16 == 611_191 - 23
    (at_32k,) = comparison.contexts
    assert (at_32k.sglang_requests, at_32k.vllm_requests) == (611_191 // 32768, (blocks - 1) // 2048) == (18, 18)


def test_gpu_budgets_are_each_engines_own() -> None:
    comparison = compare_engines("llama-3.1-8b", gpu="h100", contexts=(8192,))
    assert comparison.budget_basis == "gpu"
    vllm = comparison.vllm
    assert vllm is not None and vllm.gpu_memory_utilization == 0.92
    assert comparison.vllm_budget == vllm.budgets[0].available_kv_cache_memory
    plan = comparison.sglang
    assert comparison.sglang_budget == plan.budget.budget_bytes
    assert plan.budget.mem_fraction_static is not None  # SGLang's default for the GPU
    difference = (comparison.vllm_budget or 0) - comparison.sglang_budget
    assert f"budget difference: vLLM {difference:+,} B" in " ".join(comparison.notes)
    # each side is exactly what `kvpools plan --gpu h100` plans under that engine's accounting
    cli = CliRunner()
    for accounting, key, expected in (
        ("sglang", "max_total_num_tokens", plan.max_total_num_tokens),
        ("vllm", "num_gpu_blocks", vllm.plan.num_gpu_blocks),
    ):
        result = cli.invoke(main, ["plan", "llama-3.1-8b", "--gpu", "h100", "--accounting", accounting, "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)[key] == expected


def test_compare_says_why_kvpools_plan_gives_other_tokens() -> None:
    """Issue 29: `kvpools plan llama-3.1-8b --gpu h100` gave 403,998 tokens and `kvpools compare` 412,220, unexplained.

    compare's SGLang side is SGLang's own estimate (--accounting sglang: budget / 131,072 B); `kvpools plan`
    defaults to --accounting exact, which also fits req_to_token (2,048 requests + 1 padding row, 524,304 B a row:
    1,074,298,896 B), the KV pool's padding slot and the allocator's 8 B per token in the same budget."""
    comparison = compare_engines("llama-3.1-8b", gpu="h100", contexts=(8192,))
    default = plan("llama-3.1-8b", Serving(), gpu="h100")
    assert comparison.exact_max_total_num_tokens == default.max_total_num_tokens == 403_998
    assert comparison.sglang.max_total_num_tokens == 412_220
    budget = comparison.sglang_budget
    assert budget // 131_072 == 412_220
    assert (budget - 2_049 * 524_304 - 131_072) // (131_072 + 8) == 403_998
    note = comparison.notes[-1]
    assert "`kvpools plan` defaults to --accounting exact" in note
    assert "req_to_token 1,074,298,896 B" in note and "allocator 3,231,984 B" in note
    assert note.endswith("max_total_num_tokens 403,998, 8,222 fewer")
    assert comparison.to_dict()["sglang"]["exact_max_total_num_tokens"] == 403_998
    table = CliRunner().invoke(main, ["compare", "llama-3.1-8b", "--gpu", "h100"])
    assert "`kvpools plan`'s --accounting exact: 403,998" in table.output


def test_unmodelled_architecture_is_reported_not_crashed() -> None:
    model = "kimi-linear-48b-a3b-instruct-nvfp4"
    assert compare_engines(model, Serving(tp_size=4), memory="20GiB").vllm is not None
    comparison = compare_engines(model, Serving(tp_size=4, kv_cache_dtype="fp8_e5m2"), memory="20GiB")
    assert comparison.vllm is None
    assert comparison.vllm_refusal is not None and "takes a fp8_e5m2 KV cache" in comparison.vllm_refusal
    assert {group.unit for group in comparison.groups} == {"token", "state_slot"}
    assert all(group.vllm_groups == () for group in comparison.groups)
    assert comparison.contexts[0].vllm_max_concurrency is None


def test_refusals() -> None:
    with pytest.raises(ConfigError, match="pp_size 2 is not compared"):
        compare_engines("llama-3.1-8b", Serving(pp_size=2), memory="40GiB")
    with pytest.raises(ConfigError, match="weights_memory applies"):
        compare_engines("llama-3.1-8b", memory="40GiB", weights_memory="16GiB")
    with pytest.raises(ConfigError, match="is one engine's"):
        compare_engines("llama-3.1-8b", Serving(max_running_requests=8), memory="40GiB")


def test_cli_table_and_json() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["compare", "gpt-oss-120b", "--memory", "40GiB", "--context", "8k", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sglang"]["budget_bytes"] == data["vllm"]["available_kv_cache_memory"] == BUDGET
    assert [group["kind"] for group in data["groups"]] == ["full attention", "sliding window"]
    assert data["contexts"][0]["vllm_requests"] == 93 and data["contexts"][0]["sglang_requests"] == 79
    table = runner.invoke(main, ["compare", "deepseek-v3", "--tp-size", "8", "--memory", "40GiB"])
    assert table.exit_code == 0, table.output
    assert "where the difference comes from" in table.output and "vllm serve deepseek-ai/DeepSeek-V3 " in table.output
    refused = runner.invoke(main, ["compare", "llama-3.1-8b", "--memory", "40GiB", "--context", "zero"])
    assert refused.exit_code == 1 and "Traceback" not in refused.output


def test_vllm_refusing_to_start_is_reported_in_its_words() -> None:
    # 1 GiB = 512 blocks of 2 MiB; one 131,072-token request needs 8192: vLLM refuses, SGLang plans 8,192 tokens
    comparison = compare_engines("llama-3.1-8b", memory="1GiB", contexts=(8192,))
    assert comparison.vllm is None and comparison.vllm_refusal is not None
    assert comparison.vllm_refusal.startswith("vLLM would refuse it: To serve at least one request")
    assert "the estimated maximum model length is 8176" in comparison.vllm_refusal  # 511 usable blocks x 16
    assert comparison.sglang.max_total_num_tokens == GiB // 131_072 == 8192
    assert comparison.contexts[0].sglang_requests == 1


def test_a_context_length_both_engines_share() -> None:
    comparison = compare_engines("llama-3.1-8b", memory="4GiB", context_length=16384, contexts=(8192, 32768))
    assert comparison.sglang.model.context_len == 16384
    assert comparison.vllm is not None and comparison.vllm.max_model_len == 16384
    past = comparison.contexts[1]
    assert (past.sglang_binding, past.vllm_binding, past.vllm_max_concurrency) == (
        "context length",
        "max_model_len",
        None,
    )
