"""The real console script, end to end: output, JSON, and the error paragraphs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kvpools_core import Plan


def run(exe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)


def test_plan_human_report(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "plan", "llama-3.1-8b", "--memory", "60GiB")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "max_total_num_tokens = 483,293" in text
    assert "max_running_requests = 2,048" in text
    assert "131072 B = k 65536 + v 65536" in text
    assert "req_to_token" in text and "allocator" in text
    assert (
        "decided by platform_traits: cuda; parse_model_config: mha; estimate_cell_size: mha; size_pools: core" in text
    )


def test_plan_json_carries_sglang_names_and_round_trips(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(
        kvpools_exe,
        cli_env,
        "plan",
        "qwen3-8b",
        "--memory",
        "64424509440",
        "--tp-size",
        "2",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--page-size",
        "16",
        "--accounting",
        "sglang",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    # 4 heads x 256 x 36 layers x 1 byte = 36864 B/token; 64424509440 // 36864 = 1747626 -> page 16: 1747616
    assert data["cell_size_bytes"] == 36864
    assert data["max_total_num_tokens"] == 1747616
    assert data["max_running_requests"] == 4096
    assert data["budget_bytes"] == 64424509440
    assert {p["name"] for p in data["pools"]} == {"kv", "req_to_token", "allocator"}
    assert data["provenance"]["estimate_cell_size"] == ["mha"]
    loaded = Plan.from_json(out.stdout)
    assert loaded.max_total_num_tokens == 1747616
    assert Plan.from_json(loaded.to_json()) == loaded


def test_plan_accepts_a_config_file_and_a_directory(kvpools_exe: str, cli_env: dict[str, str], tmp_path: Path) -> None:
    config = {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "max_position_embeddings": 1024,
        "torch_dtype": "float16",
    }
    model_dir = tmp_path / "tiny-mistral"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config))
    for target in (str(model_dir), str(model_dir / "config.json")):
        out = run(kvpools_exe, cli_env, "plan", target, "--memory", "1GiB", "--json")
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert data["bytes_per_token"] == 4 * (64 + 64) * 2 * 2  # 4 KV heads, head_dim 256/4, 2 layers, fp16
        assert data["plan"]["model"]["name"] == "tiny-mistral"


def test_plugins_and_presets_commands(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "plugins", "--json")
    assert out.returncode == 0, out.stderr
    by_name = {p["name"]: p for p in json.loads(out.stdout)}
    assert by_name["example"]["distribution"] == "kvpools-example"
    assert by_name["example"]["status"] == "loaded"
    assert "estimate_cell_size" in by_name["mha"]["hooks"]
    table = run(kvpools_exe, cli_env, "plugins")
    assert "kvpools-example" in table.stdout and "loaded" in table.stdout
    presets = run(kvpools_exe, cli_env, "presets")
    assert "llama-3.1-70b" in presets.stdout and "qwen3-235b-a22b" in presets.stdout


def test_environment_controls_reach_the_cli(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    env = dict(cli_env, KVPOOLS_DISABLED_PLUGINS="example")
    out = run(kvpools_exe, env, "plugins", "--json")
    assert {p["name"]: p["status"] for p in json.loads(out.stdout)}["example"] == "blocked"
    traced = run(
        kvpools_exe, dict(cli_env, KVPOOLS_TRACE_PLUGINS="1"), "plan", "qwen3-8b", "--memory", "8GiB", "--json"
    )
    assert "kvpools trace: estimate_cell_size" in traced.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "no-such-model", "--memory", "1GiB"], "Unknown model 'no-such-model'"),
        (["plan", "llama-3.1-8b", "--memory", "-5GiB"], "--memory must not be negative"),
        (
            ["plan", "llama-3.1-8b", "--memory", "1GiB", "--page-size", "0"],
            "--page-size must be a positive integer, got 0",
        ),
        (["plan", "llama-3.1-8b"], "No memory budget: pass --memory"),
        (["plan", "llama-3.1-70b", "--memory", "1MiB"], "Not enough memory for the KV cache"),
        (
            ["plan", "llama-3.1-8b", "--memory", "1GiB", "--speculative-algorithm", "EAGLE"],
            "--speculative-draft-model-path",
        ),
    ],
)
def test_bad_input_exits_nonzero_with_one_paragraph(
    kvpools_exe: str, cli_env: dict[str, str], args: list[str], message: str
) -> None:
    out = run(kvpools_exe, cli_env, *args)
    assert out.returncode == 1
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1  # one paragraph


def test_unreadable_json_is_named(kvpools_exe: str, cli_env: dict[str, str], tmp_path: Path) -> None:
    broken = tmp_path / "config.json"
    broken.write_text('{"model_type": "llama",,}')
    out = run(kvpools_exe, cli_env, "plan", str(broken), "--memory", "1GiB")
    assert out.returncode == 1
    assert f"Model config {broken} is not valid JSON (line 1" in out.stderr


def test_unsupported_dtype_choice(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "plan", "llama-3.1-8b", "--memory", "1GiB", "--kv-cache-dtype", "int4")
    assert out.returncode == 2  # click rejects it before kvpools runs, listing the choices
    assert "auto" in out.stderr and "fp8_e4m3" in out.stderr and "Traceback" not in out.stderr


def test_draft_model_path_sets_draft_layers(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(
        kvpools_exe,
        cli_env,
        "plan",
        "llama-3.1-70b",
        "--memory",
        "40GiB",
        "--tp-size",
        "4",
        "--accounting",
        "sglang",
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-draft-model-path",
        "llama-3.1-8b",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["plan"]["serving"]["speculative_draft_num_layers"] == 32
    # 2 heads x 256 x 80 x 2 = 81920 B; x (1 + 32/80) = 114688
    assert data["cell_size_bytes"] == 114688


def test_device_cpu_measures_host_memory(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    import psutil

    out = run(kvpools_exe, cli_env, "plan", "qwen3-8b", "--device", "cpu", "--weights-memory", "1GiB", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    budget = data["plan"]["budget"]
    assert budget["source"] == "measured by cpu"
    assert data["plan"]["serving"]["platform"] == "cpu"
    assert data["provenance"]["available_memory"] == ["cpu"]
    assert 0 < budget["free_bytes"] <= psutil.virtual_memory().total
    # SGLang's arithmetic: free - weights - free x (1 - 0.9)
    expected = int(((budget["free_bytes"] - (1 << 30)) / 2**30 - budget["free_bytes"] / 2**30 * (1 - 0.9)) * 2**30)
    assert budget["budget_bytes"] == expected


def test_device_cuda_without_a_gpu_says_how_to_plan_anyway(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the measured path is exercised instead")
    out = run(kvpools_exe, dict(cli_env, CUDA_VISIBLE_DEVICES=""), "plan", "qwen3-8b", "--device", "cuda:0")
    assert out.returncode == 1
    assert "no CUDA device is visible" in out.stderr and "--memory or --free-memory" in out.stderr
