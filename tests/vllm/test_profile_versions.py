"""vLLM's runtime profiles per release range, 0.15 to 0.33 (issue 34, vers34; 0.17 / 0.18 v17x34).

Every boundary below was read in the wheels one by one (``pip download vllm==X --no-deps``; 0.33.0 in the peers
venv); each test plans one model on both sides and checks the term that changes by its hand-computed amount.

* 0.16 -> 0.17: ``apply_top_k_top_p`` masks >= 8 rows in place with a Triton kernel (0.17.0
  ``v1/sample/ops/topk_topp_sampler.py`` L245-255; 0.16.0 sorts, L262): 12 B per sampled logit and the kernel's cached
  program buffer (0.17.0 ``topk_topp_triton.py`` L992-1003) instead of the sort's 36 B.
* 0.17 -> 0.18: a Gated DeltaNet hybrid of head size 256 on a data-center Blackwell lays its attention blocks on the
  16-token grid, not 32 (0.17.0 ``model_executor/models/config.py`` L469-480; 0.18.0 L149).  0.18.0 also profiles the
  CUDA graphs inside the memory window (``v1/worker/gpu_worker.py`` L384-399), which moves the non-torch memory
  (0.13 -> 0.25 GiB in llm-d-planner's held-out sweep); not fitted: both profiles carry 0.19's constant.
* 0.18 -> 0.19: nothing modelled changes (``vllm-0.19.json`` covers both; each note cites the 0.18.0 lines).
* 0.19 -> 0.20: ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to 1 (0.19.1 ``envs.py`` L1655 "0", 0.20.0
  L1725 "1") and ``CacheConfig.gpu_memory_utilization`` to 0.92 (0.19.1 ``config/cache.py`` L41 0.9, 0.20.0 L66).
* 0.25 -> 0.26: FlashInfer's float workspace ``max(394 MiB, max_num_batched_tokens x heads x head_dim x 16)``
  (0.25.1 ``v1/attention/backends/flashinfer.py`` L893-901 fixed, 0.26.0 L936-959).
* 0.27 -> 0.28: ``get_batch_defaults``' >= 160 GiB tier, 16384 tokens / 1024 sequences (0.27.1
  ``engine/arg_utils.py`` L2515-2596 has none, 0.28.0 L2582-2591).
* 0.28 -> 0.29: Pixtral's dense block mask (0.28.0 ``model_executor/models/pixtral.py`` L1433-1445) gives way to
  ``cu_seqlens`` packing (0.29.0 L1511-1527).
* 0.31 -> 0.32: ``MambaMixer2.get_kv_cache_spec`` declares one prefill-checkpoint block (0.32.0
  ``model_executor/layers/mamba/mamba_mixer2.py`` L1098-1108; 0.31.0 has no such method), so a request holds
  ``2 + 1`` Mamba blocks (``MambaSpec.max_memory_usage_bytes``, 0.32.0 ``v1/kv_cache_interface.py`` L1076-1082).
* 0.32 -> 0.33: the Gated DeltaNet checkpoint on FlashInfer's 64-token grid (``gdn_attn.py`` L34 in 0.33.0 only).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.config import read_config_file
from kvpools_core.engines.vllm import runtime_memory
from kvpools_core.engines.vllm.deployment import VllmPlanResult, plan_vllm, server_defaults
from kvpools_core.engines.vllm.runtime_memory import (
    FLASHINFER_WORKSPACE_BYTES,
    PROFILE_ALIASES,
    PROFILE_VERSIONS,
    activation_peak,
    estimate_runtime_memory,
    graph_shape_of,
    load_profile,
    model_shape_from_config,
    model_shape_of,
    vision_shape_of,
)
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.pipeline.gpus import find_gpu

GiB = 1 << 30
MiB = 1 << 20
RELEASES = [f"0.{minor}" for minor in range(15, 34)]
"""The releases with a profile: every one from 0.15 to 0.33."""
CONFIGS = Path(__file__).parents[1] / "weights" / "configs"
MISTRAL_SMALL = str(CONFIGS / "mistralai--Mistral-Small-3.1-24B-Instruct-2503.json")


@pytest.fixture(autouse=True)
def _no_installed_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: None)


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_from_0_15_to_0_33_has_a_profile_that_covers_it(release: str) -> None:
    profile = load_profile(f"vllm=={release}.0")
    assert release in profile.covers and profile.version in PROFILE_VERSIONS
    assert PROFILE_ALIASES.get(release, release) == profile.version


def test_the_files_cover_disjoint_ranges_and_the_aliases_are_their_covers() -> None:
    covered = [release for version in PROFILE_VERSIONS for release in load_profile(version).covers]
    assert sorted(covered, key=lambda text: int(text.split(".")[1])) == RELEASES
    assert {
        release: version
        for version in PROFILE_VERSIONS
        for release in load_profile(version).covers
        if release != version
    } == PROFILE_ALIASES
    assert [version for version in PROFILE_VERSIONS if version not in {"0.16", "0.19", "0.24", "0.33"}] == [
        "0.17",
        "0.26",
        "0.28",
        "0.29",
        "0.32",
    ]


@pytest.mark.parametrize("version", ["0.14", "0.14.1", "0.34", "vllm==0.34.0"])
def test_a_release_outside_the_profiles_is_refused(version: str) -> None:
    with pytest.raises(ConfigError, match="no calibrated runtime-memory profile"):
        load_profile(version)


@pytest.mark.parametrize(
    ("version", "flags"),
    [
        # (cudagraph_subtracted, flashinfer scales, GDN ckpt, Mamba2 ckpt, utilization, 160 GiB tier, Pixtral mask)
        ("0.16", (False, False, False, False, 0.9, False, True)),
        ("0.17", (False, False, False, False, 0.9, False, True)),
        ("0.19", (False, False, False, False, 0.9, False, True)),
        ("0.24", (True, False, False, False, 0.92, False, True)),
        ("0.26", (True, True, False, False, 0.92, False, True)),
        ("0.28", (True, True, False, False, 0.92, True, True)),
        ("0.29", (True, True, False, False, 0.92, True, False)),
        ("0.32", (True, True, False, True, 0.92, True, False)),
        ("0.33", (True, True, True, True, 0.92, True, False)),
    ],
)
def test_each_profile_file_loads_with_its_releases_switches(version: str, flags: tuple[object, ...]) -> None:
    profile = load_profile(version)
    assert profile.fitted_on and profile.file == f"vllm-{version}.json"
    assert (
        profile.cudagraph_subtracted,
        profile.flashinfer_workspace_scales,
        profile.gdn_prefill_checkpoint,
        profile.mamba2_prefill_checkpoint,
        profile.default_gpu_memory_utilization,
        profile.batch_defaults_160gib,
        profile.pixtral_dense_block_mask,
    ) == flags
    # the calibrated constants are carried over (no log of 0.20-0.32 states them): the 0.19 / 0.33 values, each
    # CUDA-graph constant the 0.33 file has the same in every file that subtracts the estimate
    v033 = load_profile("0.33")
    assert profile.non_torch_bytes_by_tp == v033.non_torch_bytes_by_tp
    folder = Path(runtime_memory.__file__).parent / "profiles"
    data = json.loads((folder / f"vllm-{version}.json").read_text(encoding="utf-8"))
    data_033 = json.loads((folder / "vllm-0.33.json").read_text(encoding="utf-8"))
    constants = [key for key in data_033 if key.startswith("cudagraph_") and not key.endswith("_note")]
    assert constants != ["cudagraph_subtracted"]
    if profile.cudagraph_subtracted:
        assert {key: data[key] for key in constants} == {key: data_033[key] for key in constants}
    assert profile.sampler_bytes_per_logit == (36 if version == "0.16" else 12)
    # hybrids: prefix caching on by default from 0.26; Mamba1 / Mamba2 models in cache mode 'all' up to 0.27
    assert profile.hybrid_prefix_caching_default == (version not in {"0.16", "0.17", "0.19", "0.24"})
    assert profile.mamba_cache_mode_all == (version in {"0.16", "0.17", "0.19", "0.24", "0.26"})
    # 0.15-0.17 align a head-256 hybrid to 32 tokens on a data-center Blackwell
    assert profile.blackwell_head256_block_32 == (version in {"0.16", "0.17"})


def test_every_profile_field_has_a_cited_note() -> None:
    """Each switch the profiles carry names its source in the file (a note with a ``.py`` file and ``L`` lines)."""
    folder = Path(runtime_memory.__file__).parent / "profiles"
    for version in ("0.17", "0.19", "0.24", "0.26", "0.28", "0.29", "0.32"):
        data = json.loads((folder / f"vllm-{version}.json").read_text(encoding="utf-8"))
        for field in (
            "flashinfer_workspace",
            "gdn_prefill_checkpoint",
            "mamba2_prefill_checkpoint",
            "default_gpu_memory_utilization",
            "batch_defaults_160gib",
            "cudagraph",
            "pixtral",
            "hybrid_prefix_caching_default",
            "mamba_cache_mode_all",
        ):
            note = data[f"{field}_note"]
            assert ".py" in note and " L" in note, (version, field)


def _cli_plan(release: str) -> dict[str, Any]:
    """``kvpools plan llama-3.1-8b --engine-version vllm==RELEASE --gpu h100 --weights-memory 15GiB --json``."""
    args = ["plan", "llama-3.1-8b", "--engine-version", f"vllm=={release}", "--gpu", "h100"]
    result = CliRunner().invoke(main, [*args, "--weights-memory", "15GiB", "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    assert data["kv_cache_size_tokens"] > 0
    return data


@pytest.mark.parametrize("release", [f"0.{minor}" for minor in range(20, 33)])
def test_cli_engine_version_plans_every_0_2x_and_0_3x_release(release: str) -> None:
    assert _cli_plan(release)["runtime_memory"]["profile"] == f"vllm-{load_profile(release).version}"


def _llama(version: str, **options: Any) -> VllmPlanResult:
    return plan_vllm("llama-3.1-8b", gpu="h100", weights_memory="15GiB", runtime_profile=version, **options)


def test_0_19_to_0_20_the_cuda_graph_estimate_and_the_default_utilization() -> None:
    """llama-3.1-8b on an H100 (vllm serve's 8192 / 1024 defaults), 15 GiB of weights.  vLLM 0.19 neither subtracts
    the CUDA-graph estimate nor asks more than 0.9 of the device; 0.20 subtracts it and asks 0.92.  The activation
    peak and the non-torch memory are the same formulas and constants on both sides, so the KV budgets differ by
    exactly ``(ceil(T x 0.92) - ceil(T x 0.9)) - graphs``, T the torch total."""
    old, new = _llama("0.19"), _llama("0.20")
    assert (old.gpu_memory_utilization, new.gpu_memory_utilization) == (0.9, 0.92)
    assert old.runtime_memory is not None and new.runtime_memory is not None
    total = new.runtime_memory.total.bytes
    assert old.runtime_memory.total.bytes == total
    assert (old.budgets[0].requested_memory, new.budgets[0].requested_memory) == (
        math.ceil(total * 0.9),
        math.ceil(total * 0.92),
    )
    assert old.runtime_memory.term("CUDA graphs").bytes == 0
    graphs = new.runtime_memory.term("CUDA graphs").bytes
    # the 0.20 file carries 0.33's CUDA-graph fields as they are (no 0.20 log)
    assert (
        graphs
        == estimate_runtime_memory(
            gpu=find_gpu("h100"),
            vocab_size=128_256,
            engine_version="0.33",
            shape=model_shape_of("llama-3.1-8b"),
            graph=graph_shape_of("llama-3.1-8b"),
        )
        .term("CUDA graphs")
        .bytes
    )
    assert graphs > 0
    for term in ("activation peak", "non-torch"):
        assert old.runtime_memory.term(term).bytes == new.runtime_memory.term(term).bytes
    assert new.budgets[0].available_kv_cache_memory - old.budgets[0].available_kv_cache_memory == (
        math.ceil(total * 0.92) - math.ceil(total * 0.9) - graphs
    )
    # a stated utilization wins over the release's default
    assert _llama("0.19", gpu_memory_utilization=0.92).gpu_memory_utilization == 0.92


def test_0_25_to_0_26_the_flashinfer_workspace_grows_with_the_prefill_chunk() -> None:
    """llama-3.1-8b on an H100 with an fp8_e5m2 cache (FlashAttention refuses e5m2, so FlashInfer): 8192 batched
    tokens x 32 heads x 128 x 16 B = 512 MiB from 0.26.0, against the fixed 394 MiB of 0.25: the CUDA-graph estimate,
    whose FULL first capture holds the workspace, grows by 118 MiB (123,731,968 B)."""
    shape = model_shape_of("llama-3.1-8b")
    assert shape is not None
    assert (shape.num_attention_heads, shape.head_dim) == (32, 128)

    def graphs(version: str) -> int:
        return (
            estimate_runtime_memory(
                gpu=find_gpu("h100"),
                vocab_size=128_256,
                engine_version=version,
                shape=shape,
                graph=graph_shape_of("llama-3.1-8b"),
                kv_cache_dtype="fp8_e5m2",
                max_num_batched_tokens=8192,
                max_num_seqs=1024,
            )
            .term("CUDA graphs")
            .bytes
        )

    assert 394 * MiB == FLASHINFER_WORKSPACE_BYTES
    assert 512 * MiB == 8192 * 32 * 128 * 16
    assert graphs("0.26") - graphs("0.25") == 512 * MiB - 394 * MiB == 123_731_968
    assert graphs("0.27") == graphs("0.26") and graphs("0.20") == graphs("0.25")


def test_0_27_to_0_28_a_b200_takes_the_160_gib_batch_defaults() -> None:
    """A B200 (179 GiB): vLLM 0.27 has no >= 160 GiB tier, so it takes the >= 70 GiB one, 8192 tokens / 1024
    sequences; 0.28 takes 16384 / 1024.  The plan's chunk (``max_num_batched_tokens``) follows the release."""
    b200 = find_gpu("b200")
    assert server_defaults(b200.total_bytes, b200.label, tier_160gib=False) == (8192, 1024)
    assert server_defaults(b200.total_bytes, b200.label) == (16384, 1024)
    old = plan_vllm("llama-3.1-8b", gpu="b200", weights_memory="15GiB", runtime_profile="0.27")
    new = plan_vllm("llama-3.1-8b", gpu="b200", weights_memory="15GiB", runtime_profile="0.28")
    assert (old.limits.max_num_batched_tokens, new.limits.max_num_batched_tokens) == (8192, 16384)
    assert old.max_num_seqs == new.max_num_seqs == 1024
    # an H200 (140 GiB) is under the tier on every release
    h200 = plan_vllm("llama-3.1-8b", gpu="h200", weights_memory="15GiB", runtime_profile="0.28")
    assert h200.limits.max_num_batched_tokens == 8192
    # with --memory (--kv-cache-memory-bytes) the release's defaults still apply through its layout
    given = plan_vllm("llama-3.1-8b", memory="20GiB", layout_version="0.27")
    assert given.limits.max_num_batched_tokens == 2048  # no device to read: vLLM's smallest tier


def test_0_28_to_0_29_pixtral_drops_its_dense_block_mask() -> None:
    """Mistral-Small-3.1 at vllm serve's H100 defaults (8192 tokens, 1024 sequences, max_model_len 8192): two
    12,100-patch images.  Up to 0.28 the encoder pass holds the dense 24,200 x 24,200 x 2 B mask and binds,
    2,147,604,800 B (``tests/vllm/test_runtime_terms.py``: the llm-d 0.19 record's 2.031 GiB with the cuBLAS
    workspace); from 0.29 the packed pass is 976,324,800 B, under the language model's sampler peak plus the held
    pixels and projected outputs (28,459,200 + 61,952,000 B), which then binds."""
    config = dict(read_config_file(Path(MISTRAL_SMALL)))
    shape = model_shape_from_config(config)
    vision = vision_shape_of(MISTRAL_SMALL)
    options = {
        "vocab_size": int(config["text_config"]["vocab_size"]),
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 8192,
        "shape": shape,
        "max_model_len": 8192,
    }
    old = activation_peak(profile=load_profile("0.28"), vision=vision, **options).bytes  # type: ignore[arg-type]
    new = activation_peak(profile=load_profile("0.29"), vision=vision, **options).bytes  # type: ignore[arg-type]
    text = activation_peak(profile=load_profile("0.29"), **options).bytes  # type: ignore[arg-type]
    assert old == 2_147_604_800 + 32 * MiB == 2_181_159_232
    assert new == text + 28_459_200 + 61_952_000
    assert new < old


def test_0_31_to_0_32_a_mamba2_request_holds_a_checkpoint_block() -> None:
    """Nemotron-H-56B with an 8 GiB KV budget: 50 blocks of 4128 tokens in 7 groups (the attention layers' and six
    of Mamba2 layers).  A request of 8192 tokens holds cdiv(8192, 4128) = 2 attention blocks plus, per Mamba group,
    2 blocks before 0.32 (14 a request: 50 / 14 = 3.57x, 29,257 tokens) and 2 + 1 from 0.32 (20 a request: 2.50x,
    20,480 tokens).  The block size is the same (the checkpoint's alignment is 1)."""
    old = plan_vllm("nemotron-h-56b-base-8k", memory="8GiB", layout_version="0.31").plan
    new = plan_vllm("nemotron-h-56b-base-8k", memory="8GiB", layout_version="0.32").plan
    assert old.num_gpu_blocks == new.num_gpu_blocks == 50
    assert old.block_sizes == new.block_sizes == (4128,) * 7
    assert (old.blocks_per_request, new.blocks_per_request) == (2 + 6 * 2, 2 + 6 * 3)
    assert (old.kv_cache_size_tokens, new.kv_cache_size_tokens) == (int(50 / 14 * 8192), int(50 / 20 * 8192))
    assert (old.kv_cache_size_tokens, new.kv_cache_size_tokens) == (29_257, 20_480)
    assert new == plan_vllm("nemotron-h-56b-base-8k", memory="8GiB", layout_version="0.33").plan
    assert plan_vllm("nemotron-h-56b-base-8k", memory="8GiB", layout_version="0.28").plan == old
    notes = plan_vllm("nemotron-h-56b-base-8k", memory="8GiB", layout_version="0.31").notes
    assert "Mamba2 layers without 0.32's prefill-checkpoint block" in notes[-1]


@pytest.mark.parametrize("version", ["0.16", "0.19", "0.20", "0.24", "0.25", "0.26", "0.27"])
def test_up_to_0_27_a_mamba2_hybrid_is_refused_its_cache_mode_all(version: str) -> None:
    """vLLM up to 0.27 lays Nemotron-H (``supports_mamba_prefix_caching``) out in ``mamba_cache_mode`` ``"all"``
    under prefix caching (0.27.1 ``model_executor/models/config.py`` L616) and ``"none"`` without it; 0.28.0 sets
    ``"align"`` for every model (L604), the one layout kvpools models: refused before, planned from 0.28."""
    with pytest.raises(UnsupportedCombinationError, match=r"mamba_cache_mode 'all'.*does not model either layout yet"):
        plan_vllm("nemotron-h-56b-base-8k", memory="8GiB", layout_version=version)
    assert plan_vllm("nemotron-h-56b-base-8k", memory="8GiB", layout_version="0.28").plan.kv_cache_size_tokens == 29_257


def test_0_25_to_0_26_a_gdn_plan_says_it_assumes_prefix_caching() -> None:
    """Before 0.26 vLLM turns prefix caching on for a hybrid only with ``--enable-prefix-caching`` (0.25.1
    ``config/model.py`` L1885; 0.26.0 L1896 on by default): the 0.25 plan of a Gated DeltaNet hybrid is the
    ``align`` layout the flag gives (the club-3090 0.24.0 records pass it) and its note says so; 0.26's does not."""
    options = {"memory": "6.01GiB", "max_model_len": 131072}
    old = plan_vllm("qwen3.6-35b-a3b-nvfp4", layout_version="0.25", **options)  # type: ignore[arg-type]
    new = plan_vllm("qwen3.6-35b-a3b-nvfp4", layout_version="0.26", **options)  # type: ignore[arg-type]
    assert "runs with --enable-prefix-caching only" in old.notes[-1]
    assert not any("--enable-prefix-caching" in note for note in new.notes)
    assert old.plan == new.plan  # the same align layout (no checkpoint grid on either side)


def test_0_32_to_0_33_the_gdn_checkpoint_grid() -> None:
    """Qwen3.6-35B-A3B (NVFP4) with an fp8 cache and club-3090#652's logged 6.01 GiB: 2096-token blocks without the
    GDN checkpoint (0.32, as vLLM 0.24's logs; ``tests/vllm/test_flashinfer_workspace.py``), 2112 (a multiple of 64)
    with it (0.33)."""
    base = ["plan", "qwen3.6-35b-a3b-nvfp4", "--kv-cache-dtype", "fp8", "--quantization", "modelopt"]
    base += ["--max-model-len", "131072", "--max-num-seqs", "1", "--max-num-batched-tokens", "8192"]
    base += ["--memory", "6.01GiB", "--json"]
    tokens = {}
    for version in ("0.24", "0.32", "0.33"):
        result = CliRunner().invoke(main, [*base, "--engine-version", f"vllm=={version}"])
        assert result.exit_code == 0, result.output
        tokens[version] = json.loads(result.output)["kv_cache_size_tokens"]
    assert tokens["0.32"] == tokens["0.24"] == 569_878
    assert tokens["0.33"] != tokens["0.32"]


@pytest.mark.parametrize(
    ("installed", "engine", "says"),
    [
        ("0.27.1", "0.27", ""),  # vllm-0.26.json covers 0.27
        ("0.33.0", "0.27", "the profile (vLLM 0.26) is older than the installed vLLM 0.33.0"),
        ("0.24.0", "0.28", "the profile (vLLM 0.28) is newer than the installed vLLM 0.24.0"),
        ("0.30.0", "0.31", ""),  # vllm-0.29.json covers 0.29-0.31
        ("0.21.0", "0.33", "the profile (vLLM 0.33) is newer than the installed vLLM 0.21.0"),
        ("0.17.1", "0.17", ""),
        ("0.18.0", "0.18", ""),  # vllm-0.19.json covers 0.18
        ("0.18.0", "0.17", "the profile (vLLM 0.17) is older than the installed vLLM 0.18.0"),
        ("0.17.0", "0.18", "the profile (vLLM 0.19) is newer than the installed vLLM 0.17.0"),
        ("0.16.0", "0.17", "the profile (vLLM 0.17) is newer than the installed vLLM 0.16.0"),
    ],
)
def test_a_profile_other_than_the_installed_engine_still_says_so(
    monkeypatch: pytest.MonkeyPatch, installed: str, engine: str, says: str
) -> None:
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: installed)
    memory = estimate_runtime_memory(
        gpu=find_gpu("h100"), vocab_size=1000, engine_version=engine, graph=graph_shape_of("llama-3.1-8b")
    )
    assert memory.note == says


def test_0_27_to_0_28_a_blackwell_captures_up_to_1024() -> None:
    """vLLM 0.28.0 raises the default capture ceiling to 1024 on a data-center Blackwell (``config/vllm.py`` L1936-1940;
    0.27.1 L1831-1835 caps every GPU at ``min(max_num_seqs x 2, 512)``): at 1024 sequences and 8192 batched tokens a
    B200 captures 3 + 31 + 17 = 51 sizes under 0.27 (1, 2, 4, every 8 to 248, every 16 from 256 to 512) and
    3 + 31 + 49 = 83 under 0.28 (every 16 to 1024), each a PIECEWISE and a FULL graph; an H100 captures 51 under
    both."""

    def graphs(version: str, gpu: str) -> str:
        memory = estimate_runtime_memory(
            gpu=find_gpu(gpu),
            vocab_size=128_256,
            engine_version=version,
            shape=model_shape_of("llama-3.1-8b"),
            graph=graph_shape_of("llama-3.1-8b"),
            max_num_seqs=1024,
            max_num_batched_tokens=8192,
        )
        return memory.term("CUDA graphs").formula

    assert "(PIECEWISE 51 - 1)" in graphs("0.27", "b200") and "largest capture size 512" in graphs("0.27", "b200")
    assert "(PIECEWISE 83 - 1)" in graphs("0.28", "b200") and "(FULL 83 - 1)" in graphs("0.28", "b200")
    assert "(PIECEWISE 51 - 1)" in graphs("0.28", "h100")
    assert not load_profile("0.27").blackwell_capture_1024 and load_profile("0.28").blackwell_capture_1024


def test_the_0_17_and_0_18_switches_cite_their_wheels() -> None:
    """vllm-0.17.json and the 0.18 lines in vllm-0.19.json: every field's note names the file and lines read, and
    the two files (and 0.16's) say where the Blackwell head-256 alignment comes from and where it went."""
    folder = Path(runtime_memory.__file__).parent / "profiles"
    files = {
        version: json.loads((folder / f"vllm-{version}.json").read_text(encoding="utf-8"))
        for version in ("0.16", "0.17", "0.19")
    }
    for field in (
        "sampler_bytes_per_logit",
        "sampler_program_buffer",
        "moe_workspace",
        "non_torch",
        "defaults",
        "blackwell_capture_1024",
        "blackwell_head256_block_32",
    ):
        for version in ("0.17", "0.19"):
            note = files[version][f"{field}_note"]
            assert ".py" in note and " L" in note, (version, field)
    assert "0.17.0 model_executor/models/config.py L469-480" in files["0.17"]["blackwell_head256_block_32_note"]
    assert "0.18.0 model_executor/models/config.py L149" in files["0.19"]["blackwell_head256_block_32_note"]
    assert "L429-440" in files["0.16"]["blackwell_head256_block_32_note"]
    assert files["0.19"]["covers"] == ["0.18", "0.19"] and "0.18.0" in files["0.19"]["non_torch_note"]
    # the held-out rule: no constant of vllm-0.17.json is fitted, every calibrated one is vllm-0.19.json's
    assert files["0.17"]["non_torch_gib_by_tp"] == files["0.19"]["non_torch_gib_by_tp"]
    assert files["0.17"]["non_torch_pp_gib"] == files["0.19"]["non_torch_pp_gib"]
    assert "never fitted" in files["0.17"]["fitted_on"]["held_out"]


@pytest.mark.parametrize(
    ("release", "profile"), [("0.17", "vllm-0.17"), ("0.18", "vllm-0.19"), ("0.18.0", "vllm-0.19")]
)
def test_cli_engine_version_plans_0_17_and_0_18(release: str, profile: str) -> None:
    """``--engine-version vllm==0.17`` / ``vllm==0.18`` were refused before (no profile); both plan now."""
    data = _cli_plan(release)
    assert data["runtime_memory"]["profile"] == profile
    assert data["gpu_memory_utilization"] == 0.9


def test_0_16_to_0_17_the_sampler_stops_sorting() -> None:
    """llama-3.1-8b on an H100 at vllm serve's 8192 / 1024 defaults, 15 GiB of weights.  The dummy sampler run's
    1024 rows x 128,256 vocab = 131,334,144 logits hold, with the 2 B bf16 logits, 36 B each under 0.16's sort
    (4,990,697,472 B) and 12 B under 0.17's Triton kernel (1,838,678,016 B) plus its cached program buffer
    132 SMs x 128,256 x 4 B = 67,719,168 B.  Both peaks are the sampler's (the forward pass is 0.844 GiB), the held
    hidden states, cuBLAS workspace, non-torch memory and requested memory are the same: the 0.17 KV budget is
    4,990,697,472 - 1,838,678,016 - 67,719,168 = 3,084,300,288 B larger."""
    old, new = _llama("0.16"), _llama("0.17")
    assert old.runtime_memory is not None and new.runtime_memory is not None
    logits = 1024 * 128_256
    assert logits == 131_334_144
    assert old.runtime_memory.term("activation peak").bytes - new.runtime_memory.term("activation peak").bytes == (
        logits * 38 - logits * 14 - 132 * 128_256 * 4
    )
    assert logits * 38 == 4_990_697_472 and logits * 14 == 1_838_678_016 and 132 * 128_256 * 4 == 67_719_168
    for term in ("non-torch", "CUDA graphs"):
        assert old.runtime_memory.term(term).bytes == new.runtime_memory.term(term).bytes
    assert old.budgets[0].requested_memory == new.budgets[0].requested_memory
    assert new.budgets[0].available_kv_cache_memory - old.budgets[0].available_kv_cache_memory == 3_084_300_288


def test_0_17_to_0_19_a_dense_model_plans_the_same() -> None:
    """For a dense model on an H100 nothing kvpools models moves at 0.17 -> 0.18 -> 0.19: the same sampler, defaults
    and utilization, and the same non-torch constant (0.25 GiB at TP 1, vllm-0.19.json's, which vllm-0.17.json
    carries: the 0.13 GiB 0.17.0 logged is a held-out record, not fitted)."""
    plans = {version: _llama(version) for version in ("0.17", "0.18", "0.19")}
    assert plans["0.17"].runtime_memory is not None
    non_torch = plans["0.17"].runtime_memory.term("non-torch")
    assert non_torch.bytes == round(0.25 * GiB) and "vllm-0.17.json" in non_torch.formula
    budgets = {version: plan.budgets[0].available_kv_cache_memory for version, plan in plans.items()}
    assert budgets["0.17"] == budgets["0.18"] == budgets["0.19"] == 58_128_253_027
    assert plans["0.17"].plan == plans["0.18"].plan == plans["0.19"].plan


def _qwen36(version: str, gpu: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        main,
        [
            "plan",
            "qwen3.6-35b-a3b-nvfp4",
            "--engine-version",
            f"vllm=={version}",
            "--gpu",
            gpu,
            "--kv-cache-dtype",
            "fp8",
            "--quantization",
            "modelopt",
            "--max-model-len",
            "131072",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


def test_0_17_to_0_18_a_head_256_hybrid_on_a_b200_leaves_the_32_token_grid() -> None:
    """Qwen3.6-35B-A3B (NVFP4, fp8 cache, max_model_len 131,072) on a B200 (capability 10.0).  Its 10 full-attention
    layers have 2 KV heads of head_dim 256: 2 x 2 x 256 x 1 B = 1,024 B a token.  A GDN layer's state is the conv
    state (2 x 16 x 128 + 32 x 128) x (4 - 1) x 2 B = 49,152 B and the fp32 SSM state 32 x 128 x 128 x 4 B =
    2,097,152 B: 2,146,304 B = 2,096 tokens of attention page.  vLLM 0.18 aligns the block to 16 tokens
    (16 x cdiv(2,146,304, 16 x 1,024) = 2,096, no padding); 0.17 to 32 on a Blackwell at head size 256 (0.17.0
    ``models/config.py`` L469-480): 32 x cdiv(2,146,304, 32,768) = 32 x 66 = 2,112.  A block is 10 tensors (one layer
    of each group) of block x 1,024 B: 21,463,040 / 21,626,880 B.  The KV budget is the same on both sides
    (146,036,287,339 B): 6,804 / 6,752 blocks, and a request of 131,072 tokens holds cdiv(131,072, block) = 63
    attention blocks + 3 GDN groups x 2 = 69 (6,804 / 69 x 131,072 = 12,924,838 tokens; 6,752 / 69 x 131,072 =
    12,826,060).  On an H100 (9.0) the two releases agree."""
    conv = (2 * 16 * 128 + 32 * 128) * (4 - 1) * 2
    ssm = 32 * 128 * 128 * 4
    assert conv + ssm == 2_146_304 == 2_096 * 1_024
    assert 32 * math.ceil(2_146_304 / (32 * 1_024)) == 2_112
    old, new = _qwen36("0.17", "b200"), _qwen36("0.18", "b200")
    budget = 146_036_287_339
    assert old["budget"][0]["available_kv_cache_memory"] == new["budget"][0]["available_kv_cache_memory"] == budget
    assert (old["block_size"], new["block_size"]) == (2_112, 2_096)
    assert (old["bytes_per_block"], new["bytes_per_block"]) == ([2_112 * 1_024 * 10], [2_096 * 1_024 * 10])
    assert (old["num_gpu_blocks"], new["num_gpu_blocks"]) == (budget // 21_626_880, budget // 21_463_040)
    assert (old["num_gpu_blocks"], new["num_gpu_blocks"]) == (6_752, 6_804)
    assert old["blocks_per_request"] == new["blocks_per_request"] == 63 + 3 * 2
    assert (old["kv_cache_size_tokens"], new["kv_cache_size_tokens"]) == (12_826_060, 12_924_838)
    assert any("32-token grid" in note for note in old["notes"])
    assert not any("32-token grid" in note for note in new["notes"])
    # the 0.16 file carries the same alignment (0.16.0 L429-440); a Hopper keeps 16 tokens on every release
    assert _qwen36("0.16", "b200")["block_size"] == 2_112
    assert _qwen36("0.17", "h100")["block_size"] == _qwen36("0.18", "h100")["block_size"] == 2_096


def test_0_17_hybrid_layout_without_a_gpu_says_it_cannot_tell_the_grid() -> None:
    """With ``--memory`` (no device) the 0.17 layout is the 16-token grid, and the plan says a data-center Blackwell
    would align to 32; 0.18's says nothing of it."""
    old = plan_vllm("qwen3.6-35b-a3b-nvfp4", memory="6.01GiB", layout_version="0.17", max_model_len=131_072)
    new = plan_vllm("qwen3.6-35b-a3b-nvfp4", memory="6.01GiB", layout_version="0.18", max_model_len=131_072)
    assert old.plan == new.plan
    assert "a plan without --gpu cannot tell" in old.notes[-1]
    assert "cannot tell" not in new.notes[-1]
