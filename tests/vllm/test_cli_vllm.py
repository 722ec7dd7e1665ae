"""``--accounting vllm`` through ``plan_vllm``, ``kvpools plan`` and ``kvpools capacity`` (issue 18).

Expected numbers are worked out beside each assertion from the vLLM formulas ``kvpools_core/vllm`` cites; the
last test plans through vLLM's own code (``peer.py``) where the peers venv exists, skipping as the other
differential tests do.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from click.testing import CliRunner

from kvpools_core import plan
from kvpools_core.cli import main
from kvpools_core.engines.vllm import VllmMemoryError, concurrency_at, plan_kv_cache, plan_vllm
from kvpools_core.engines.vllm.deployment import server_defaults
from kvpools_core.engines.vllm.model import worker_kv_cache_specs
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.pipeline.gpus import find_gpu
from kvpools_core.pipeline.weights import estimate_weights
from kvpools_core.registry import Registry
from kvpools_core.values import Serving

GiB = 1 << 30
LLAMA_BLOCK = 32 * 16 * 8 * 128 * 2 * 2
"""llama-3.1-8b, one block: 32 layers x 16 tokens x 8 KV heads x 128 x (K + V) x 2 B (bf16) = 2 MiB."""


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def cli_json(*args: str) -> dict[str, Any]:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_llama_at_40gib_by_hand() -> None:
    data = cli_json(
        "plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "40GiB", "--block-size", "16",
        "--max-model-len", "32768",
    )  # fmt: skip
    assert LLAMA_BLOCK == 2 << 20
    # 40 GiB // 2 MiB = 20480 blocks; block 0 is the null block, and the memory check leaves room for it
    assert data["num_gpu_blocks"] == 40 * GiB // LLAMA_BLOCK == 20480
    assert data["kv_cache_groups"][0] | {"layer_names": None} == {
        "spec": "FullAttentionSpec",
        "num_layers": 32,
        "block_size": 16,
        "page_size_bytes": 16 * 8 * 128 * 2 * 2,
        "layer_names": None,
    }
    assert data["blocks_per_request"] == 32768 // 16
    assert data["max_concurrency"] == 20480 / 2048 == 10.0
    assert data["kv_cache_size_tokens"] == 10 * 32768
    assert data["budget"][0]["available_kv_cache_memory"] == data["kv_cache_memory_bytes"] == 40 * GiB
    assert data["serve_command"] == (
        "vllm serve meta-llama/Meta-Llama-3.1-8B --tensor-parallel-size 1 --max-model-len 32768 "
        f"--kv-cache-memory-bytes {40 * GiB} --block-size 16 --kv-cache-dtype auto --max-num-seqs 256 "
        "--max-num-batched-tokens 2048"
    )
    text = cli(
        "plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "40GiB", "--max-model-len", "32768"
    ).stdout  # fmt: skip
    assert "num_gpu_blocks: 20480 (block 0 is vLLM's null block: 20479 usable)" in text
    assert "GPU KV cache size: 327,680 tokens, Maximum concurrency for 32,768 tokens per request: 10.00x" in text
    # issue 29: the preset's Hugging Face id, not its kvpools name (`vllm serve llama-3.1-8b` loads nothing)
    assert "vllm serve meta-llama/Meta-Llama-3.1-8B --tensor-parallel-size 1 --max-model-len 32768" in text


def test_gpt_oss_has_a_sliding_and_a_full_group() -> None:
    data = cli_json("plan", "gpt-oss-120b", "--accounting", "vllm", "--memory", "40GiB", "--max-model-len", "131072")
    # 36 layers alternate window-128 / full, 8 KV heads x 64, bf16: page 16 x 8 x (64 + 64) x 2 = 32768 for both
    groups = [
        {k: g[k] for k in ("spec", "num_layers", "block_size", "page_size_bytes")} for g in data["kv_cache_groups"]
    ]
    assert groups == [
        {"spec": "SlidingWindowSpec", "num_layers": 18, "block_size": 16, "page_size_bytes": 32768},
        {"spec": "FullAttentionSpec", "num_layers": 18, "block_size": 16, "page_size_bytes": 32768},
    ]
    assert data["bytes_per_block"] == [18 * 32768]
    # in flight: (PP 1 + 1) batches x 2048 tokens (vllm serve's default without a >= 70 GiB GPU) = 4096;
    # sliding: cdiv(min(128 - 1 + 4096, L), 16) + 1 = 264 + 1 blocks; full: 131072 / 16 = 8192
    assert (data["max_num_batched_tokens"], data["max_concurrent_batches"]) == (2048, 2)
    assert data["blocks_per_request"] == 265 + 8192
    blocks = 40 * GiB // (18 * 32768)
    assert data["num_gpu_blocks"] == blocks == 72817
    assert data["max_concurrency"] == blocks / 8457
    assert data["kv_cache_size_tokens"] == int(blocks / 8457 * 131072)


def test_h100_budget_terms() -> None:
    data = cli_json("plan", "llama-3.1-8b", "--accounting", "vllm", "--gpu", "h100", "--max-model-len", "32768")
    total = find_gpu("h100").total_bytes
    weights = estimate_weights("llama-3.1-8b", Serving()).bytes_per_rank
    requested = math.ceil(total * 0.92)  # vLLM's request_memory: ceil(total x util)
    (budget,) = data["budget"]
    assert budget == {
        "pp_rank": 0,
        "source": "gpu_memory_utilization",
        "total_memory": total,
        "requested_memory": requested,
        "weights_memory": weights,
        "non_kv_cache_memory": weights,
        "cudagraph_memory": 0,
        "available_kv_cache_memory": requested - weights,
    }
    assert data["num_gpu_blocks"] == (requested - weights) // LLAMA_BLOCK
    # vllm serve's defaults on a >= 70 GiB GPU (not an A100): 8192 batched tokens, 1024 sequences
    assert (data["max_num_batched_tokens"], data["max_num_seqs"], data["gpu_memory_utilization"]) == (8192, 1024, 0.92)
    assert "--gpu-memory-utilization 0.92 --block-size 16" in data["serve_command"]
    given = cli_json(
        "plan", "llama-3.1-8b", "--accounting", "vllm", "--gpu", "h100", "--gpu-memory-utilization", "0.5",
        "--weights-memory", "16GiB", "--max-model-len", "8192", "--max-num-seqs", "64",
    )  # fmt: skip
    assert given["budget"][0]["available_kv_cache_memory"] == math.ceil(total * 0.5) - 16 * GiB
    assert "--gpu-memory-utilization 0.5" in given["serve_command"] and "--max-num-seqs 64" in given["serve_command"]


def test_memory_check_is_vllms_one_line_error(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = subprocess.run(
        [kvpools_exe, "plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "1GiB"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=120,
    )
    assert out.returncode == 1 and out.stdout == ""
    # 131072 tokens x 32 layers x 2 KiB = 16 GiB; 1 GiB less the null block holds 511 blocks = 8176 tokens
    assert out.stderr.startswith(
        "Error: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed"
    )
    assert "the estimated maximum model length is 8176." in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_jamba_hybrid_at_40gib_by_hand() -> None:
    """jamba-1.5-mini: 32 layers, attention at 4, 12, 20, 28 (8 KV heads x 128), 28 Mamba-1 layers (inner 2 x
    4096, d_state 16, d_conv 4), bf16, vLLM's default prefix caching (mamba_cache_mode align)."""
    data = cli_json(
        "plan", "jamba-1.5-mini", "--accounting", "vllm", "--memory", "40GiB", "--max-model-len", "32768"
    )  # fmt: skip
    conv, ssm = 3 * 8192 * 2, 8192 * 16 * 2  # (d_conv - 1, inner) and (inner, d_state), both bf16 (ssm dtype auto)
    state = conv + ssm
    assert state == 311_296
    attention_per_token = 8 * (128 + 128) * 2
    # _align_hybrid_block_size: 16 x cdiv(state, 16 x 4096) = 80 tokens, the state padded to the 80-token page
    block_size = 16 * math.ceil(state / (16 * attention_per_token))
    page = block_size * attention_per_token
    assert (block_size, page) == (80, 327_680)
    groups = data["kv_cache_groups"]
    # 28 Mamba layers and 4 attention layers, one page size: groups of 4 layers, Mamba first (layer 0 is Mamba)
    assert [(g["spec"], g["num_layers"], g["block_size"], g["page_size_bytes"]) for g in groups] == [
        ("MambaSpec", 4, 80, page)
    ] * 7 + [("FullAttentionSpec", 4, 80, page)]
    assert groups[-1]["layer_names"] == [f"model.layers.{i}.attn" for i in (4, 12, 20, 28)]
    mamba_layers = [i for i in range(32) if i not in (4, 12, 20, 28)]
    assert (
        groups[0]["layer_names"]
        == [f"model.layers.{i}.mixer" for i in mamba_layers[0::7]]
        == [f"model.layers.{i}.mixer" for i in (0, 8, 16, 24)]
    )
    assert data["bytes_per_block"] == [4 * page]
    assert data["num_gpu_blocks"] == 40 * GiB // (4 * page) == 32768
    # a request: cdiv(32768, 80) attention blocks + 7 Mamba groups x 2 blocks (align: running + cached state)
    assert data["blocks_per_request"] == math.ceil(32768 / 80) + 7 * 2 == 424
    assert data["max_concurrency"] == 32768 / 424
    assert data["kv_cache_size_tokens"] == int(32768 / 424 * 32768)
    # vLLM runs with the aligned block, so the flags that realise the plan say 80, and --json keeps what was asked
    assert (data["block_size"], data["block_size_requested"]) == (80, 16)
    assert "--block-size 80 " in data["serve_command"]


def test_raised_block_size_is_what_the_serve_line_passes() -> None:
    """MiniMax-M3's indexer kernels take blocks of 128, so vLLM resolves the default 16 to 128: a serve line
    passing 16 would describe a different deployment from the plan printed above it."""
    data = cli_json("plan", "minimax-m3", "--accounting", "vllm", "--memory", "80GiB", "--tp-size", "8")
    assert {group["block_size"] for group in data["kv_cache_groups"]} == {128}
    assert (data["block_size"], data["block_size_requested"]) == (128, 16)
    assert "--block-size 128 " in data["serve_command"]


def test_kimi_linear_plans_with_the_mla_aligned_block() -> None:
    """KDA states of 2,170,880 B beside 1,152-B latent rows: 128 x cdiv(2,170,880, 128 x 1152) = 1920-token blocks."""
    data = cli_json("plan", "kimi-linear-48b-a3b-instruct-nvfp4", "--accounting", "vllm", "--memory", "40GiB")
    assert {group["block_size"] for group in data["kv_cache_groups"]} == {1920}
    assert data["block_size"] == 1920 and "--block-size 1920 " in data["serve_command"]
    assert data["num_gpu_blocks"] == 40 * GiB // (7 * 1920 * 1152) == 2774


def test_unmodelled_architectures_are_refused_by_plugin() -> None:
    result = cli("plan", "deepseek-v4-flash", "--accounting", "vllm", "--memory", "10GiB", "--kv-cache-dtype", "bf16")
    assert result.exit_code == 1
    assert "DeepseekV4 fp8_ds_mla layout only supports fp8 kv-cache, got bf16" in result.stderr
    result = cli(
        "plan", "kimi-linear-48b-a3b-instruct-nvfp4", "--accounting", "vllm", "--memory", "10GiB", "--platform", "rocm"
    )
    assert result.exit_code == 1
    assert "Kimi-Linear is modelled on CUDA only (on rocm vLLM builds kimi_k3/amd/linear.py)" in result.stderr
    result = cli("plan", "falcon-h1-0.5b", "--accounting", "vllm", "--memory", "10GiB")
    assert result.exit_code == 1
    assert "sizes Falcon-H1's Mamba2 state from mamba_d_ssm, which this config lacks" in result.stderr
    assert "Traceback" not in result.output + result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--block-size", "16"), "--block-size is vLLM's: only with --accounting vllm"),
        (("--accounting", "sglang", "--max-model-len", "4096"), "--max-model-len is vLLM's"),
        (
            ("--accounting", "vllm", "--context-length", "4096"),
            "--context-length is SGLang's option; --accounting vllm does not read it: use --max-model-len.",
        ),
        (("--accounting", "vllm", "--max-running-requests", "8"), "use --max-num-seqs"),
        (("--accounting", "vllm", "--page-size", "16"), "use --block-size"),
        (("--accounting", "vllm", "--mem-fraction-static", "0.8"), "use --gpu-memory-utilization"),
        (("--accounting", "vllm", "--free-memory", "80GiB"), "--free-memory belongs to SGLang's planning"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "capacity"])
def test_flags_belong_to_their_engine(command: str, args: tuple[str, ...], message: str) -> None:
    memory = () if "--free-memory" in args else ("--memory", "10GiB")
    result = cli(command, "llama-3.1-8b", *memory, *args)
    assert result.exit_code == 1, result.output
    assert message in result.stderr


def test_one_budget_and_sglangs_pipeline_refuses_vllm() -> None:
    result = cli("plan", "llama-3.1-8b", "--accounting", "vllm")
    assert result.exit_code == 1 and "--accounting vllm needs one budget" in result.stderr
    requests = cli("capacity", "llama-3.1-8b", "--accounting", "vllm", "--memory", "4GiB", "--requests", "4")
    assert requests.exit_code == 1 and "--requests belongs to SGLang's planning" in requests.stderr
    with pytest.raises(UnsupportedCombinationError, match="accounting vllm plans vLLM's KV cache"):
        plan("llama-3.1-8b", Serving(accounting="vllm"), memory="10GiB")
    build = cli("build", "llama-3.1-8b", "--accounting", "vllm", "--memory", "1GiB", "--device", "meta")
    assert build.exit_code == 1 and "use kvpools_core.engines.vllm.plan_vllm" in build.stderr
    with pytest.raises(
        ConfigError, match=r"context_length is SGLang's option; accounting vllm does not read it: use max_model_len\."
    ):
        plan_vllm("llama-3.1-8b", Serving(context_length=4096), memory="10GiB")
    with pytest.raises(ConfigError, match="apply to a --gpu budget only"):
        plan_vllm("llama-3.1-8b", memory="10GiB", gpu_memory_utilization=0.5)


def test_capacity_in_vllms_terms() -> None:
    data = cli_json(
        "capacity", "llama-3.1-8b", "--accounting", "vllm", "--memory", "40GiB", "--max-model-len", "32768",
        "--context", "8k,32k,64k",
    )  # fmt: skip
    # 20480 blocks; a request of L tokens holds L / 16 blocks of the one group
    assert data["capacity"] == [
        {"context_len": 8192, "max_concurrency": 20480 / 512},
        {"context_len": 32768, "max_concurrency": 10.0},
        {"context_len": 65536, "max_concurrency": None},
    ]
    text = cli("capacity", "llama-3.1-8b", "--accounting", "vllm", "--memory", "40GiB", "--max-model-len", "32768")
    assert text.exit_code == 0, text.output
    assert "40.00x" in text.stdout and "10.00x" in text.stdout and "1024 " in text.stdout


def test_plan_vllm_equals_plan_kv_cache_on_the_same_specs(registry: Registry) -> None:
    serving = Serving(tp_size=2, pp_size=2)
    result = plan_vllm("gpt-oss-120b", serving, gpu="h200", registry=registry)
    workers = worker_kv_cache_specs(result.model, serving, registry, block_size=16)
    # each stage holds its own weights (vLLM's split: 18 + 18 layers), so each has its own budget
    assert len(result.budgets) == 2
    memory = [budget.available_kv_cache_memory for budget in result.budgets]
    assert result.plan == plan_kv_cache(workers, memory, result.limits)
    # PP 2 + 1 batches in flight (async scheduling, Model Runner V2); H200's 140 GiB < 160 GiB: 8192 tokens per step
    assert result.limits.max_concurrent_batches == 3 and result.limits.max_num_batched_tokens == 8192
    assert plan_vllm("llama-3.1-8b", gpu="b200", registry=registry).limits.max_num_batched_tokens == 16384
    assert concurrency_at(result, result.max_model_len) == result.plan.max_concurrency
    with pytest.raises(VllmMemoryError):
        plan_vllm("gpt-oss-120b", memory="100MiB", registry=registry)
    override = plan_vllm("llama-3.1-8b", memory="40GiB", num_gpu_blocks_override=1000, max_model_len=8192)
    assert override.plan.num_gpu_blocks == 1000 and "--num-gpu-blocks-override 1000" in override.serve_command()


@pytest.fixture(scope="module")
def vllm_planner() -> Iterator[Any]:
    from .peer import VllmPlanner, require_vllm

    planner = VllmPlanner(require_vllm())
    yield planner
    planner.close()


@pytest.mark.parametrize(
    ("preset", "tp", "pp", "gpu"),
    [
        ("gpt-oss-120b", 2, 2, "h200"),
        ("llama-3.1-8b", 1, 1, "h100"),
        ("qwen3-next-80b-a3b-thinking", 4, 1, "h100"),
        ("nemotron-3-nano-30b-a3b", 1, 1, "h100"),
        ("qwen3.5-397b-a17b", 8, 2, "h200"),
    ],
)
def test_plan_vllm_equals_vllm(vllm_planner: Any, registry: Registry, preset: str, tp: int, pp: int, gpu: str) -> None:
    from .test_differential import runner_spec

    serving = Serving(tp_size=tp, pp_size=pp)
    result = plan_vllm(preset, serving, gpu=gpu, registry=registry)
    workers = worker_kv_cache_specs(result.model, serving, registry, block_size=result.block_size)
    answer = vllm_planner.plan(
        {
            "workers": [{name: runner_spec(spec) for name, spec in worker.items()} for worker in workers],
            "limits": attrs.asdict(result.limits),
            "tp_size": tp,
            "num_gpu_blocks_override": None,
            "auto_fit": False,
            "available_memory": [budget.available_kv_cache_memory for budget in result.budgets],
        }
    )
    assert "error" not in answer, answer
    data = result.to_dict()
    got = [
        {"layers": group["layer_names"], "block_size": group["block_size"], "page": group["page_size_bytes"]}
        for group in data["kv_cache_groups"]
    ]
    assert got == answer["groups"]
    assert data["bytes_per_block"] == answer["bytes_per_block"]
    assert (data["num_gpu_blocks"], data["max_concurrency"], data["kv_cache_size_tokens"]) == (
        answer["num_gpu_blocks"],
        answer["max_concurrency"],
        answer["kv_cache_size_tokens"],
    )


@pytest.mark.parametrize(
    ("gpu", "defaults"),
    [("b200", (16384, 1024)), ("h100", (8192, 1024)), ("a100-80gb", (2048, 256)), ("l40s", (2048, 256))],
)
def test_vllm_serve_defaults_follow_the_gpu(gpu: str, defaults: tuple[int, int]) -> None:
    # arg_utils.py L2973-3006: >= 160 GiB; >= 70 GiB unless an A100 (80 GiB, still the small tier); the rest
    chosen = find_gpu(gpu)
    assert server_defaults(chosen.total_bytes, chosen.label) == defaults
    assert server_defaults(None) == (2048, 256)  # no device known: vLLM's except branch


def test_max_model_len_auto_by_hand() -> None:
    """``--max-model-len auto`` on llama-3.1-8b at 8 GiB: 8 GiB // 2 MiB = 4096 blocks; the fit leaves the null
    block out, so one request may hold 4095 blocks = 65,520 tokens (< the model's 131,072)."""
    data = cli_json("plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "8GiB", "--max-model-len", "auto")
    assert data["num_gpu_blocks"] == 8 * GiB // LLAMA_BLOCK == 4096
    assert data["max_model_len"] == (4096 - 1) * 16 == 65520
    assert (data["max_model_len_auto"], data["max_model_len_before_auto_fit"]) == (True, 131072)
    # max_concurrency = 4096 / cdiv(65520, 16) = 4096 / 4095; kv_cache_size_tokens = int(that x 65520) = 65536
    assert data["max_concurrency"] == 4096 / 4095
    assert data["kv_cache_size_tokens"] == 65536
    assert "--max-model-len 65520 " in data["serve_command"]  # the resolved length, not "auto"
    assert data["auto_fit_log_line"] == (
        "Auto-fit max_model_len: reduced from 131072 to 65520 to fit in available KV cache memory (8.0 GiB GPU)"
    )  # format_gib(8 GiB - 2 MiB) = round(7.998, 2) = 8.0
    assert cli_json("plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "8GiB", "--max-model-len", "-1") == data


def test_max_model_len_auto_keeps_the_model_length_when_it_fits() -> None:
    # 40 GiB = 20480 blocks; one 131,072-token request needs 8192 of the 20479 usable: the model's length stays
    data = cli_json("plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "40GiB", "--max-model-len", "auto")
    assert (data["max_model_len"], data["num_gpu_blocks"]) == (131072, 20480)
    assert data["auto_fit_log_line"] == (
        "Auto-fit max_model_len: full model context length 131072 fits in available KV cache memory (40.0 GiB GPU)"
    )
    fixed = cli_json("plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "40GiB")
    assert (fixed["max_model_len_auto"], fixed["auto_fit_log_line"]) == (False, None)
    assert fixed["kv_cache_size_tokens"] == data["kv_cache_size_tokens"] == 327680


def test_max_model_len_auto_in_capacity_and_refusals() -> None:
    data = cli_json("capacity", "llama-3.1-8b", "--accounting", "vllm", "--memory", "8GiB", "--max-model-len", "auto")
    assert data["max_model_len"] == 65520
    # the default ladder stops at the auto-fitted length: 1k ... 64k (65,536 > 65,520)
    assert [row["context_len"] for row in data["capacity"]][-1] == 65536 // 2
    assert data["capacity"][0] == {"context_len": 1024, "max_concurrency": 4096 / 64}
    refused = cli("plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "8GiB", "--max-model-len", "0")
    assert refused.exit_code == 1 and "or auto (-1" in refused.output
    with pytest.raises(VllmMemoryError, match=r"^Cannot auto-fit max_model_len"):
        plan_vllm("llama-3.1-8b", memory=LLAMA_BLOCK + 1, max_model_len="auto")


@pytest.mark.parametrize(
    ("preset", "tp", "pp", "memory"), [("llama-3.1-8b", 1, 1, "8GiB"), ("gpt-oss-120b", 2, 2, "512MiB")]
)
def test_max_model_len_auto_equals_vllm(
    vllm_planner: Any, registry: Registry, preset: str, tp: int, pp: int, memory: str
) -> None:
    """vLLM's own ``get_kv_cache_configs`` with ``original_max_model_len == -1`` auto-fits to the same length."""
    from .test_differential import runner_spec

    serving = Serving(tp_size=tp, pp_size=pp)
    result = plan_vllm(preset, serving, memory=memory, max_model_len="auto", registry=registry)
    assert result.max_model_len < result.model.context_len  # these budgets do lower it
    workers = worker_kv_cache_specs(result.model, serving, registry, block_size=result.block_size)
    answer = vllm_planner.plan(
        {
            "workers": [{name: runner_spec(spec) for name, spec in worker.items()} for worker in workers],
            "limits": attrs.asdict(result.limits),
            "tp_size": tp,
            "num_gpu_blocks_override": None,
            "auto_fit": True,
            "available_memory": [budget.available_kv_cache_memory for budget in result.budgets],
        }
    )
    assert "error" not in answer, answer
    assert (result.max_model_len, result.plan.num_gpu_blocks) == (answer["max_model_len"], answer["num_gpu_blocks"])
    assert (result.plan.max_concurrency, result.plan.kv_cache_size_tokens) == (
        answer["max_concurrency"],
        answer["kv_cache_size_tokens"],
    )
