"""Consumer and workstation NVIDIA GPUs in the CUDA catalogue (issue 34): each total is the ``nvidia-smi``
``memory.total`` a cited public capture prints, and ``kvpools plan --gpu rtx-4090`` plans from it end to end, under
SGLang's accounting (the MiB SGLang reads) and under vLLM's (torch's total, derived from it)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvpools_core import find_gpu
from kvpools_core.cli import main
from kvpools_core.engines.vllm import runtime_memory
from kvpools_core.parts.device_memory import SMI_TO_TORCH_GAP_BYTES, torch_total_memory

MiB = 1 << 20
GiB = 1 << 30

# name, nvidia-smi MiB as the cited capture prints it, the capture, compute capability (NVIDIA's table)
CITED = [
    ("rtx-3090", 24576, "github.com/noonghunna/club-3090/issues/390", (8, 6)),
    ("rtx-3090-ti", 24564, "github.com/noonghunna/club-3090/issues/769", (8, 6)),
    ("rtx-4090", 24564, "github.com/RLinf/RLinf/issues/255", (8, 9)),
    ("rtx-5090", 32607, "github.com/noonghunna/club-3090/issues/617", (12, 0)),
    ("rtx-pro-6000", 97887, "github.com/vllm-project/vllm/issues/27542", (12, 0)),
    ("a40", 46068, "github.com/guqiong96/Lvllm/issues/35", (8, 6)),
    ("h20", 97871, "github.com/NVIDIA/nvtrust/issues/128", (9, 0)),
]


@pytest.fixture(autouse=True)
def _no_installed_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: None)


@pytest.mark.parametrize(("name", "mib", "url", "capability"), CITED)
def test_totals_are_the_cited_nvidia_smi_figures(name: str, mib: int, url: str, capability: tuple[int, int]) -> None:
    gpu = find_gpu(name)
    assert gpu.platform == "cuda"
    assert gpu.total_bytes == mib * MiB and gpu.total_mib == mib
    assert f"{mib} MiB" in gpu.source and url in gpu.source
    assert gpu.compute_capability == capability


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("RTX 4090", "rtx-4090"),
        ("4090", "rtx-4090"),
        ("GeForce RTX 3090", "rtx-3090"),
        ("rtx_3090_ti", "rtx-3090-ti"),
        ("5090", "rtx-5090"),
        ("RTX PRO 6000 Blackwell", "rtx-pro-6000"),
        ("H20", "h20"),
        ("A40", "a40"),
    ],
)
def test_the_names_people_write(spelling: str, name: str) -> None:
    assert find_gpu(spelling).name == name


@pytest.mark.parametrize(("name", "mib"), [("rtx-4090", 24564), ("rtx-3090", 24576), ("rtx-5090", 32607)])
def test_torch_total_is_derived_as_for_every_catalogue_gpu_without_a_measured_one(name: str, mib: int) -> None:
    """vLLM budgets from ``torch.cuda.mem_get_info()[1]``: nvidia-smi's total less the 0.46 GiB gap
    (``SMI_TO_TORCH_GAP_BYTES``).  A logged RTX 4090 reads '23.52 GiB total' (vllm#42049): 24564 MiB - 0.46 GiB =
    23.528 GiB; an RTX 3090 logged 23.58 GiB (vllm#10517): 24576 MiB - 0.46 GiB = 23.540 GiB (0.17 % low)."""
    total = torch_total_memory(find_gpu(name))
    assert not total.measured
    assert total.bytes == mib * MiB - SMI_TO_TORCH_GAP_BYTES == mib * MiB - round(0.46 * GiB)
    if name == "rtx-4090":
        assert abs(total.bytes / GiB - 23.52) < 0.01


def _plan_json(*args: str) -> dict:
    result = CliRunner().invoke(main, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_plan_on_an_rtx_4090_with_sglang_accounting() -> None:
    """SGLang 0.5.23's default fraction on 24564 MiB: reserved = 512 (constant) + 1.5 x 4096 (chunked prefill 4096
    below 35 GiB) + 1024 x 1 / 8 (TP x PP) + 2 x 48 (decode graphs, max_bs 48) + 8 x 50 (prefill graphs) = 7280 MiB;
    round((24564 - 7280) / 24564, 3) = 0.704.  Budget: (24564 MiB - 1 GiB runtime) x 0.704 - Qwen3-8B's bf16 weights
    16,381,470,720 B = 24,683,479,040 x 0.704 - 16,381,470,720 = 995,698,524 B; 147,456 B per token (36 layers x 8
    KV heads x 128 x 2 x 2 B) -> 6,295 tokens after the req_to_token pool (2,048 requests x 32,784 B) is taken."""
    data = _plan_json("qwen3-8b", "--gpu", "rtx-4090", "--context-length", "8192")
    budget = data["plan"]["budget"]
    assert budget["gpu"] == "rtx-4090" and budget["gpu_total_bytes"] == 24564 * MiB
    assert budget["mem_fraction_static"] == 0.704
    assert budget["pre_model_load_bytes"] == 24564 * MiB - GiB == 24_683_479_040
    assert budget["weights_bytes"] == 16_381_470_720
    assert data["budget_bytes"] == int(24_683_479_040 * 0.704) - 16_381_470_720 == 995_698_524
    assert data["bytes_per_token"] == 36 * 8 * 128 * 2 * 2 == 147_456
    assert data["max_total_num_tokens"] == 6_295
    assert data["plan"]["serving"]["platform_traits"]["compute_capability"] == [8, 9]


def test_plan_on_an_rtx_4090_with_vllm_accounting() -> None:
    """vLLM 0.19's profile on the 4090: total = 24564 MiB - round(0.46 GiB) = 25,757,220,864 - 493,921,239 =
    25,263,299,625 B; requested = ceil(total x 0.92) (vllm serve's default utilisation here, as the plan states)."""
    data = _plan_json("qwen3-8b", "--gpu", "rtx-4090", "--engine-version", "vllm==0.19", "--max-model-len", "8192")
    assert data["gpu"] == "rtx-4090"
    assert data["runtime_memory"]["total_memory"] == 25_263_299_625 == 24564 * MiB - 493_921_239
    assert data["runtime_memory"]["total_measured"] is False
    (budget,) = data["budget"]
    assert budget["total_memory"] == 25_263_299_625
    utilization = data["gpu_memory_utilization"]
    assert budget["requested_memory"] == -(-25_263_299_625 * round(utilization * 100) // 100)
    assert budget["available_kv_cache_memory"] > 0 and data["num_gpu_blocks"] > 0


def test_the_vllm_note_names_a_derived_total_once() -> None:
    """The plan's note labels the total ("derived: <how>"); the total's own source must not repeat the label."""
    data = _plan_json("qwen3-8b", "--gpu", "rtx-4090", "--engine-version", "vllm==0.19", "--max-model-len", "8192")
    notes = " ".join(data["notes"])
    assert "(derived: catalogue total 23.99 GiB less the 0.46 GiB nvidia-smi-to-torch gap)" in notes
    assert "derived: derived" not in notes
