"""The option walk: every option of ``kvpools plan`` / ``build`` / ``capacity`` and every ``Serving`` field changes
the plan for some model, or is listed in ``docs/options.md`` as not affecting memory (with the reason), or is
refused with a clear error where kvpools does not model it (issue 32).

The evidence is data (:data:`EVIDENCE`), checked live: a :class:`Changes` entry plans twice through the real
CLI (``--json``) and asserts the memory the plan describes differs; a :class:`Refused` entry asserts the exit
and the message; a :class:`NoMemory` entry is rendered into ``docs/options.md`` (regenerate with
``KVPOOLS_WRITE_DOCS=1``), which this module keeps equal to the table.  A new option or ``Serving`` field fails
:func:`test_every_option_has_evidence` until it gets a row.
"""

from __future__ import annotations

import json
import os
from collections import namedtuple
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import click
import pytest
from click.testing import CliRunner

import kvpools_core.cli as cli
from kvpools_core.values import Serving

DOC = Path(__file__).resolve().parents[2] / "docs" / "options.md"
COMMANDS = ("plan", "build", "capacity")
GiB = 1 << 30


@attrs.frozen
class Changes:
    """``without`` and ``with_`` plan differently (``command``'s JSON, the memory it describes)."""

    without: tuple[str, ...]
    with_: tuple[str, ...]
    command: str = "plan"
    why: str = ""
    patch: str | None = None
    """A fixture-like name of :data:`PATCHES` that makes a measured budget deterministic."""


@attrs.frozen
class Refused:
    """``args`` is refused (exit 1, one ``Error:`` line) with ``message`` in it."""

    args: tuple[str, ...]
    message: str
    command: str = "plan"


@attrs.frozen
class NoMemory:
    """Listed in ``docs/options.md``: the option does not change the memory a plan describes, and why."""

    reason: str


Evidence = Changes | Refused | NoMemory

LLAMA = ("llama-3.1-8b", "--memory", "20GiB")
HOST = (*LLAMA, "--enable-hierarchical-cache", "--host-memory", "256GiB")
QWEN35 = ("qwen3.5-35b-a3b", "--memory", "20GiB")
GPT_OSS_CAP = ("gpt-oss-120b", "--memory", "60GiB", "--page-size", "64", "--max-running-requests", "64")
CAPPED = (*GPT_OSS_CAP, "--disable-radix-cache")
DSA_FP8 = ("deepseek-v3.2", "--memory", "40GiB", "--kv-cache-dtype", "fp8_e4m3")
DSV4 = ("deepseek-v4-flash", "--memory", "60GiB", "--tp-size", "4")
DSV41 = (
    # relative to the repository root (where pytest runs), so docs/options.md names it the same everywhere
    os.path.relpath(Path(__file__).parents[1] / "dsv4" / "configs" / "dsv41_synthetic.json"),
    "--memory",
    "20GiB",
)
EAGLE = (
    "--speculative-algorithm",
    "EAGLE",
    "--speculative-draft-num-layers",
    "1",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "4",
    "--speculative-num-draft-tokens",
    "8",
)
VLLM = (*LLAMA, "--accounting", "vllm")
QWEN36_VLLM = (
    # the club-3090 runs' launch (tests/vllm/test_multimodal_limits.py)
    "qwen3.6-35b-a3b-nvfp4", "--accounting", "vllm", "--gpu", "rtx-5090", "--runtime-profile", "0.33",
    "--kv-cache-dtype", "fp8", "--quantization", "modelopt", "--max-num-seqs", "1", "--max-num-batched-tokens", "8192",
    "--max-model-len", "131072",
)  # fmt: skip
TRTLLM = (*LLAMA, "--accounting", "trtllm")
TRTLLM_GPU = ("llama-3.1-8b", "--gpu", "h100", "--accounting", "trtllm")
GPT_OSS_TRTLLM = ("gpt-oss-20b", "--memory", "20GiB", "--accounting", "trtllm")
GPT_OSS_VSWA = (*GPT_OSS_TRTLLM, "--max_attention_window", "128,131072")
DSV3_TRTLLM = ("deepseek-v3", "--memory", "60GiB", "--accounting", "trtllm")
LLAMA70_TRTLLM = ("llama-3.1-70b", "--memory", "40GiB", "--tp-size", "4", "--accounting", "trtllm")
DRAFT_TARGET = (*LLAMA70_TRTLLM, "--decoding_type", "Draft_Target", "--speculative_model_dir", "llama-3.1-8b")
DRAFT_ON_GPU = ("llama-3.1-70b", "--gpu", "h100", "--tp-size", "4", "--accounting", "trtllm", "--decoding_type",
                "Draft_Target", "--speculative_model_dir", "llama-3.1-8b", "--max_draft_len", "4")  # fmt: skip
EAGLE3_TRTLLM = (*LLAMA70_TRTLLM, "--decoding_type", "Eagle3", "--speculative_model_dir", "llama-3.1-8b")
DECODE = (*LLAMA, "--max-running-requests", "16", "--disaggregation-mode", "decode")
PP2 = (*LLAMA, "--pp-size", "2", "--pp-layer-partition", "10,22")
OUTPUT = "output only: the same plan, printed another way"

EVIDENCE: dict[str, Evidence] = {
    # -- the budget
    "memory": Changes(LLAMA, ("llama-3.1-8b", "--memory", "30GiB")),
    "device": Changes(("llama-3.1-8b", "--memory", "40GiB"), ("llama-3.1-8b", "--device", "cpu"), patch="host"),
    "free_memory": Changes(LLAMA, ("llama-3.1-8b", "--free-memory", "40GiB")),
    "weights_memory": Changes(
        ("llama-3.1-8b", "--free-memory", "40GiB"),
        ("llama-3.1-8b", "--free-memory", "40GiB", "--weights-memory", "16GiB"),
    ),
    "reserved_memory": Changes(
        ("llama-3.1-8b", "--free-memory", "40GiB"),
        ("llama-3.1-8b", "--free-memory", "40GiB", "--reserved-memory", "1GiB"),
    ),
    "gpu": Changes(LLAMA, ("llama-3.1-8b", "--gpu", "h100")),
    "gpu_memory": Changes(("llama-3.1-8b", "--gpu-memory", "80GiB"), ("llama-3.1-8b", "--gpu-memory", "100GiB")),
    "runtime_memory": Changes(
        ("llama-3.1-8b", "--gpu", "h100"), ("llama-3.1-8b", "--gpu", "h100", "--runtime-memory", "5GiB")
    ),
    "mem_fraction_static": Changes(
        ("llama-3.1-8b", "--gpu", "h100"), ("llama-3.1-8b", "--gpu", "h100", "--mem-fraction-static", "0.8")
    ),
    "host_memory": Changes(
        (*LLAMA, "--enable-hierarchical-cache", "--host-memory", "64GiB"), (*HOST,), why="auto-sized host tier"
    ),
    "host_reserve": Changes(
        (*LLAMA, "--enable-hierarchical-cache", "--host-memory", "64GiB"),
        (*LLAMA, "--enable-hierarchical-cache", "--host-memory", "64GiB", "--host-reserve", "30GiB"),
    ),
    # -- platform and plugins
    "platform": Changes(LLAMA, (*LLAMA, "--platform", "ascend"), why="Ascend's page 128"),
    "plugin_options": Changes(
        ("deepseek-v3", "--memory", "40GiB", "--tp-size", "8", "--platform", "rocm"),
        (
            *("deepseek-v3", "--memory", "40GiB", "--tp-size", "8", "--platform", "rocm"),
            *("--plugin-option", "rocm.attention_backend=triton"),
        ),
        why="AITER's MLA page-index workspace",
    ),
    "draft_model": Changes(
        (*LLAMA, *EAGLE),
        (*LLAMA, *EAGLE[:2], *EAGLE[4:], "--speculative-draft-model-path", "qwen3-8b"),
        why="the draft model's own KV geometry",
    ),
    # -- the KV cache and parallelism
    "kv_cache_dtype": Changes(LLAMA, (*LLAMA, "--kv-cache-dtype", "fp8_e4m3")),
    "dtype": Changes(LLAMA, (*LLAMA, "--dtype", "float32"), why="kv_cache_dtype auto follows it: fp32 KV"),
    "quantization": Changes(
        ("llama-3.1-8b", "--gpu", "h100"),
        ("llama-3.1-8b", "--gpu", "h100", "--quantization", "fp8"),
        why="fp8 weights leave a larger KV budget; a quantised checkpoint's own method (modelopt, awq, ...) is checked "
        "against its quantization_config with the engine's rules and plans its storage as stored",
    ),
    "page_size": Changes(LLAMA, (*LLAMA, "--page-size", "64")),
    "tp_size": Changes(LLAMA, (*LLAMA, "--tp-size", "2")),
    "pp_size": Changes(LLAMA, (*LLAMA, "--pp-size", "2")),
    "pp_layer_partition": Changes((*LLAMA, "--pp-size", "2"), PP2),
    "pp_rank": Changes(PP2, (*PP2, "--pp-rank", "1")),
    "dp_size": Changes(
        (*LLAMA, "--tp-size", "4", "--enable-dp-attention"),
        (*LLAMA, "--tp-size", "4", "--enable-dp-attention", "--dp-size", "4"),
    ),
    "enable_dp_attention": Changes(
        (*LLAMA, "--tp-size", "4", "--dp-size", "4"),
        (*LLAMA, "--tp-size", "4", "--dp-size", "4", "--enable-dp-attention"),
    ),
    "attn_cp_size": Changes((*LLAMA, "--tp-size", "4"), (*LLAMA, "--tp-size", "4", "--attn-cp-size", "2")),
    "dcp_size": Changes((*DSA_FP8, "--tp-size", "8"), (*DSA_FP8, "--tp-size", "8", "--dcp-size", "8")),
    # -- scheduling limits
    "context_length": Changes(LLAMA, (*LLAMA, "--context-length", "4096")),
    "max_running_requests": Changes(LLAMA, (*LLAMA, "--max-running-requests", "16")),
    "max_total_tokens": Changes(LLAMA, (*LLAMA, "--max-total-tokens", "10000")),
    "chunked_prefill_size": Changes(CAPPED, (*CAPPED, "--chunked-prefill-size", "2048"), why="the SWA chunk cap"),
    "disable_radix_cache": Changes(GPT_OSS_CAP, CAPPED, why="the SWA chunk cap"),
    "disable_overlap_schedule": Changes(CAPPED, (*CAPPED, "--disable-overlap-schedule"), why="the SWA chunk cap"),
    "prefill_only_disable_kv_cache": Changes(
        (*LLAMA, "--disable-radix-cache"),
        (*LLAMA, "--disable-radix-cache", "--prefill-only-disable-kv-cache"),
        why="the no-op KV pool's single placeholder page",
    ),
    "vlm_cache_size_mb": Changes(
        ("gemma-3-12b-it", "--free-memory", "40GiB"),
        ("gemma-3-12b-it", "--free-memory", "40GiB", "--vlm-cache-size-mb", "4096"),
    ),
    "mm_feature_transport": Changes(
        ("gemma-3-12b-it", "--free-memory", "40GiB"),
        ("gemma-3-12b-it", "--free-memory", "40GiB", "--mm-feature-transport", "cuda_ipc"),
        why="the GPU feature pool (SGLANG_MM_FEATURE_CACHE_MB) reserved from the profiled budget",
    ),
    "mm_feature_cache_mb": Changes(
        ("gemma-3-12b-it", "--free-memory", "40GiB", "--mm-feature-transport", "cuda_vmm"),
        (
            "gemma-3-12b-it",
            "--free-memory",
            "40GiB",
            "--mm-feature-transport",
            "cuda_vmm",
            "--mm-feature-cache-mb",
            "4096",
        ),
    ),
    # -- speculative decoding
    "speculative_algorithm": Changes(LLAMA, (*LLAMA, *EAGLE)),
    "speculative_num_steps": Changes(
        (*CAPPED, *EAGLE, "--page-size", "1"),
        (*CAPPED, *EAGLE, "--page-size", "1", "--speculative-num-steps", "5"),
        why="the SWA chunk cap's decode term",
    ),
    "speculative_eagle_topk": Changes(
        (*CAPPED, *EAGLE),
        (*CAPPED, *EAGLE, "--speculative-eagle-topk", "2"),  # not 1: SGLang would rewrite 8 draft tokens to 4
        why="the SWA chunk cap's decode term",
    ),
    "speculative_num_draft_tokens": Changes((*LLAMA, *EAGLE), (*LLAMA, *EAGLE, "--speculative-num-draft-tokens", "16")),
    "speculative_adaptive": Changes(
        (*LLAMA, *EAGLE[:4], "--speculative-eagle-topk", "1", "--speculative-num-steps", "3"),
        (*LLAMA, *EAGLE[:4], "--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-adaptive"),
        why="request rows for the adaptive maximum, max(candidate_steps) + 1 draft tokens",
    ),
    "speculative_adaptive_config": Refused(
        (*LLAMA, *EAGLE[:4], "--speculative-adaptive-config", "/nonexistent/adaptive.json"),
        "configures adaptive speculative decoding, which is off",
    ),
    "enable_multi_layer_eagle": Refused(
        (*LLAMA, *EAGLE, "--enable-multi-layer-eagle"), "does not model --enable-multi-layer-eagle for"
    ),
    "speculative_draft_num_layers": Changes((*LLAMA, *EAGLE), (*LLAMA, *EAGLE, "--speculative-draft-num-layers", "2")),
    # -- disaggregation
    "disaggregation_mode": Changes((*LLAMA, "--max-running-requests", "16"), DECODE),
    "disaggregation_decode_extra_slots": Changes(DECODE, (*DECODE, "--disaggregation-decode-extra-slots", "100")),
    "enable_pd_role_switch": Changes(
        (*LLAMA, "--disaggregation-mode", "prefill", "--disaggregation-decode-extra-slots", "100"),
        (
            *LLAMA,
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-decode-extra-slots",
            "100",
            "--enable-pd-role-switch",
        ),
        why="the decode request table's pre-allocated rows on a flip-capable prefill node",
    ),
    "disaggregation_decode_retraction_backup": Changes(
        DECODE,
        (*DECODE, "--host-memory", "256GiB", "--disaggregation-decode-retraction-backup", "host_pool"),
        why="the host pool it backs retractions up in",
    ),
    # -- hybrid sliding window, mamba, DSA, DeepSeek-V4
    "swa_full_tokens_ratio": Changes(
        ("gpt-oss-20b", "--memory", "20GiB"), ("gpt-oss-20b", "--memory", "20GiB", "--swa-full-tokens-ratio", "0.5")
    ),
    "swa_eviction_interval": Changes(CAPPED, (*CAPPED, "--swa-eviction-interval", "16")),
    "mamba_full_memory_ratio": Changes(QWEN35, (*QWEN35, "--mamba-full-memory-ratio", "0.5")),
    "max_mamba_cache_size": Changes(QWEN35, (*QWEN35, "--max-mamba-cache-size", "100")),
    "mamba_ssm_dtype": Changes(QWEN35, (*QWEN35, "--mamba-ssm-dtype", "bfloat16")),
    "enable_mamba_extra_buffer": Changes(QWEN35, (*QWEN35, "--enable-mamba-extra-buffer")),
    "enable_mamba_extra_buffer_lazy": Changes(
        (*QWEN35, "--enable-mamba-extra-buffer"),
        (*QWEN35, "--enable-mamba-extra-buffer", "--enable-mamba-extra-buffer-lazy"),
    ),
    "post_capture_kv_sizing": Changes(
        ("llama-3.1-8b", "--gpu", "h100", "--weights-memory", "15GiB"),
        ("llama-3.1-8b", "--gpu", "h100", "--weights-memory", "15GiB", "--post-capture-kv-sizing"),
        why="the default fraction without the graph reserve (tests/core/test_post_capture.py)",
    ),
    "disable_cuda_graph": Changes(
        ("llama-3.1-8b", "--gpu", "h100", "--weights-memory", "15GiB"),
        ("llama-3.1-8b", "--gpu", "h100", "--weights-memory", "15GiB", "--disable-cuda-graph"),
        why="the default fraction without the decode and prefill graph reserves (tests/gpus/test_gpu_budget.py)",
    ),
    "mamba_skip_decode_lock": Changes(
        (*QWEN35, "--enable-mamba-extra-buffer"), (*QWEN35, "--enable-mamba-extra-buffer", "--mamba-skip-decode-lock")
    ),
    # ReplaySSM (issue 33; tests/mamba/test_replayssm.py checks the numbers against SGLang's)
    "enable_linear_replayssm": Changes(QWEN35, (*QWEN35, "--enable-linear-replayssm"), why="the decode ring"),
    "linear_replayssm_cache_len": Changes(
        (*QWEN35, "--enable-linear-replayssm"),
        (*QWEN35, "--enable-linear-replayssm", "--linear-replayssm-cache-len", "8"),
    ),
    "enable_linear_replayssm_spec": Changes(
        # top-k 1: SGLang makes the draft tokens steps + 1 = 4 (issue 32)
        (
            *QWEN35,
            *EAGLE,
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
            "--max-running-requests",
            "64",
        ),
        (
            *QWEN35,
            *EAGLE,
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
            "--max-running-requests",
            "64",
            "--enable-linear-replayssm-spec",
        ),
        why="the spec-verify ring instead of the intermediate SSM state",
    ),
    "dsa_prefill_backend": Changes(DSA_FP8, (*DSA_FP8, "--dsa-prefill-backend", "trtllm"), why="the raw latent row"),
    "dsa_decode_backend": Changes(DSA_FP8, (*DSA_FP8, "--dsa-decode-backend", "trtllm"), why="the raw latent row"),
    "enable_dsa_cache_layer_split": Changes(
        (
            "deepseek-v3.2",
            "--memory",
            "40GiB",
            "--tp-size",
            "8",
            "--attn-cp-size",
            "2",
            "--disaggregation-mode",
            "prefill",
        ),
        (
            *("deepseek-v3.2", "--memory", "40GiB", "--tp-size", "8", "--attn-cp-size", "2"),
            *("--disaggregation-mode", "prefill", "--enable-dsa-cache-layer-split"),
        ),
    ),
    "m3_fp8_attn_gemm": Changes(
        ("minimax-m3", "--memory", "40GiB", "--tp-size", "8", "--kv-cache-dtype", "fp8_e4m3"),
        ("minimax-m3", "--memory", "40GiB", "--tp-size", "8", "--kv-cache-dtype", "fp8_e4m3", "--m3-fp8-attn-gemm"),
        why="the fp8 lightning-indexer cache",
    ),
    "qsa_indexer_dtype": Refused(
        (*LLAMA, "--qsa-indexer-dtype", "fp8_e4m3"), "needs a model with a compressed QSA indexer"
    ),
    "nvfp4_sm": Changes(
        (*LLAMA, "--kv-cache-dtype", "nvfp4", "--nvfp4-sm", "100"),
        (*LLAMA, "--kv-cache-dtype", "nvfp4", "--nvfp4-sm", "120"),
        why="SM100's native scales vs SM120's linear scales and fp8 dequant workspace",
    ),
    "prefill_kv_cache_dequant_dtype": Changes(
        (*LLAMA, "--kv-cache-dtype", "nvfp4", "--nvfp4-sm", "100"),
        (*LLAMA, "--kv-cache-dtype", "nvfp4", "--nvfp4-sm", "100", "--prefill-kv-cache-dequant-dtype", "fp8_e4m3"),
        why="the fp8 dequant workspace and the token-linear scales",
    ),
    "enable_hisparse": Refused((*LLAMA, "--enable-hisparse", "--disable-radix-cache"), "Drop --enable-hisparse"),
    "hisparse_config": Refused(
        (*LLAMA, "--hisparse-config", '{"host_to_device_ratio": 4}'),
        "--hisparse-config configures HiSparse, which is off",
    ),
    "dsv4_compress_state_dtype": Changes(DSV4, (*DSV4, "--dsv4-compress-state-dtype", "bfloat16")),
    "enable_online_compress": Changes(DSV4, (*DSV4, "--enable-online-compress")),
    "dsv4_kv_layout": Changes(DSV4, (*DSV4, "--dsv4-kv-layout", "v41"), why="the V4.1 pages (528 B a token)"),
    "enable_encoder_swa_bounded_replay": Changes(
        DSV41,
        (*DSV41, "--enable-encoder-swa-bounded-replay"),
        why="the per-request SWA window and its replay workspace instead of the paged SWA pool",
    ),
    "dsv4_attn_backend": Changes(
        DSV4,
        (*DSV4, "--dsv4-attn-backend", "trtllm"),
        why="the trtllm uniform fp8 rows (512 B a token per layer, DeepSeekV4UniformFP8KVPool)",
    ),
    "dsv4_compressed_kv_layout": Changes(
        (*DSV4, "--dsv4-kv-layout", "v41"),
        (*DSV4, "--dsv4-kv-layout", "v41", "--dsv4-compressed-kv-layout", "fp4"),
        why="the fp4 compressed pages (288 B a token)",
    ),
    "enable_online_c128_mtp": Changes(
        (*DSV4, "--enable-online-compress"),
        (*DSV4, "--enable-online-compress", "--enable-online-c128-mtp"),
        why="the MTP pending lengths of the c128 state slots",
    ),
    # -- the host tier
    "enable_hierarchical_cache": Changes(LLAMA, HOST),
    "hicache_ratio": Changes(HOST, (*HOST, "--hicache-ratio", "3")),
    "hicache_size": Changes(HOST, (*HOST, "--hicache-size", "10")),
    "hicache_host_memory_fraction": Changes(
        (*LLAMA, "--enable-hierarchical-cache", "--host-memory", "64GiB"),
        (*LLAMA, "--enable-hierarchical-cache", "--host-memory", "64GiB", "--hicache-host-memory-fraction", "0.5"),
        why="the auto-sized host tier",
    ),
    "hicache_mamba_ratio": Changes(
        (*QWEN35, "--enable-hierarchical-cache", "--host-memory", "256GiB", "--hicache-ratio", "2"),
        (
            *QWEN35,
            "--enable-hierarchical-cache",
            "--host-memory",
            "256GiB",
            "--hicache-ratio",
            "2",
            "--hicache-mamba-ratio",
            "1",
        ),
    ),
    "hicache_mem_layout": NoMemory(
        "How the host tier lays out the same bytes (layer-first or page-first rows, as SGLang's "
        "`--hicache-mem-layout`); the host pools hold the same slots either way."
    ),
    "hicache_write_policy": NoMemory(
        "When device KV is copied to the host tier (SGLang's `--hicache-write-policy`), not how big either tier is."
    ),
    # -- the unified memory pool (issue 31)
    "enable_unified_memory": Changes(
        ("gpt-oss-20b", "--memory", "60GiB", "--page-size", "16"),
        ("gpt-oss-20b", "--memory", "60GiB", "--page-size", "16", "--enable-unified-memory"),
        why="one arena instead of the full and SWA pools",
    ),
    "disable_lazy_compaction": NoMemory(
        "The unified allocators' run-time policy (SGLang's `SGLANG_DISABLE_LAZY_COMPACTION`): frees compact the "
        "band at once instead of leaving holes. The arena, its sub-pools and their tables are the same; "
        "`plan.sizing.arenas[].lazy_compaction` records it. Alone (without `--enable-unified-memory`) it is refused."
    ),
    "enable_page_major_kv_layout": NoMemory(
        "SGLang 0.5.23 implies it under `--enable-unified-memory`, whose arena (every layer of one slot in one "
        "token-major entry) is that layout, so the plan is the same with or without it; alone SGLang refuses it "
        "(its static page-major pool is non-constructible) and so does kvpools (tests/unified/test_page_major.py)."
    ),
    "nnodes": Changes((*HOST, "--tp-size", "8"), (*HOST, "--tp-size", "8", "--nnodes", "2")),
    "accounting": Changes(LLAMA, (*LLAMA, "--accounting", "sglang")),
    # -- vLLM's accounting (refused without it: tests/cli)
    "gpu_memory_utilization": Changes(
        ("llama-3.1-8b", "--gpu", "h100", "--accounting", "vllm"),
        ("llama-3.1-8b", "--gpu", "h100", "--accounting", "vllm", "--gpu-memory-utilization", "0.8"),
    ),
    "max_model_len": Changes(VLLM, (*VLLM, "--max-model-len", "4096")),
    "max_num_seqs": Changes(VLLM, (*VLLM, "--max-num-seqs", "16")),
    "max_num_batched_tokens": Changes(
        ("gpt-oss-20b", "--memory", "20GiB", "--accounting", "vllm"),
        ("gpt-oss-20b", "--memory", "20GiB", "--accounting", "vllm", "--max-num-batched-tokens", "16384"),
    ),
    "block_size": Changes(VLLM, (*VLLM, "--block-size", "32")),
    "num_gpu_blocks_override": Changes(VLLM, (*VLLM, "--num-gpu-blocks-override", "20000")),
    "kv_offloading_size": Changes(VLLM, (*VLLM, "--kv-offloading-size", "10", "--host-memory", "256GiB")),
    "kv_offloading_backend": Refused(
        (*VLLM, "--kv-offloading-size", "10", "--host-memory", "256GiB", "--kv-offloading-backend", "lmcache"),
        "Plan with --kv-offloading-backend native",
    ),
    "runtime_profile": Changes(
        ("llama-3.1-8b", "--gpu", "h100", "--accounting", "vllm"),
        ("llama-3.1-8b", "--gpu", "h100", "--accounting", "vllm", "--runtime-profile", "0.19"),
    ),
    # vLLM's multimodal limits (issue 34): the encoder's profile pass and, all of a tower's modalities at 0, its weights
    "limit_mm_per_prompt": Changes(
        QWEN36_VLLM,
        (*QWEN36_VLLM, "--limit-mm-per-prompt", '{"image": 0, "video": 0}'),
        why="no encoder profile pass and no vision tower weights (tests/vllm/test_multimodal_limits.py)",
    ),
    "language_model_only": Changes(
        QWEN36_VLLM,
        (*QWEN36_VLLM, "--language-model-only"),
        why="every limit 0: no encoder profile pass and no vision tower weights",
    ),
    "engine_version": Changes(
        ("llama-3.1-8b", "--gpu", "h100", "--accounting", "vllm", "--runtime-profile", "0.19"),
        ("llama-3.1-8b", "--gpu", "h100", "--engine-version", "vllm==0.16"),
        why="vLLM 0.16's sampler sorts: 36 B per logit at the profile run's peak, not 0.19's 12",
    ),
    # -- TensorRT-LLM's accounting (refused without it: tests/trtllm)
    "kv_cache_free_gpu_memory_fraction": Changes(TRTLLM, (*TRTLLM, "--kv_cache_free_gpu_memory_fraction", "0.5")),
    "tokens_per_block": Changes(TRTLLM, (*TRTLLM, "--tokens_per_block", "64")),
    "max_seq_len": Changes(TRTLLM, (*TRTLLM, "--max_seq_len", "4096")),
    "max_tokens": Changes(TRTLLM, (*TRTLLM, "--max_tokens", "8192")),
    "max_gpu_total_bytes": Changes(GPT_OSS_VSWA, (*GPT_OSS_VSWA, "--max_gpu_total_bytes", "1073741824")),
    "max_attention_window": Changes(GPT_OSS_TRTLLM, GPT_OSS_VSWA),
    "window_size_shares": Changes(GPT_OSS_VSWA, (*GPT_OSS_VSWA, "--window_size_shares", "0.25,0.75")),
    "host_cache_size": Changes(TRTLLM, (*TRTLLM, "--host_cache_size", "1073741824")),
    "enable_attention_dp": Changes((*TRTLLM, "--tp-size", "4"), (*TRTLLM, "--tp-size", "4", "--enable_attention_dp")),
    "num_nextn_predict_layers": Changes(DSV3_TRTLLM, (*DSV3_TRTLLM, "--num_nextn_predict_layers", "1")),
    # helix context parallelism (tests/trtllm/test_trtllm_context_parallel.py hand-computes each)
    "context_parallel_size": Changes(
        (*DSV3_TRTLLM, "--context", "131072"),
        (*DSV3_TRTLLM, "--context", "131072", "--context_parallel_size", "2"),
        command="capacity",
        why="a 128k request's 4,096 blocks split over the CP ranks: 2,048 on rank 0 of its 25,784, 12 requests for 6",
    ),
    "cp_type": Refused(
        (*DSV3_TRTLLM, "--context_parallel_size", "2", "--cp_type", "STAR"),
        "kvpools does not model TensorRT-LLM's star attention",
    ),
    # a separate draft model's KV cache (tests/trtllm/test_trtllm_drafting.py hand-computes each)
    "decoding_type": Changes(
        LLAMA70_TRTLLM,
        (*DRAFT_TARGET, "--max_draft_len", "4"),
        why="a draft manager beside the target's: 32,768 B a token joins the target's 81,920 before the budget divides",
    ),
    "speculative_model_dir": Changes(
        (*DRAFT_TARGET, "--max_draft_len", "4"),
        (
            *LLAMA70_TRTLLM,
            "--decoding_type",
            "Draft_Target",
            "--speculative_model_dir",
            "qwen3-8b",
            "--max_draft_len",
            "4",
        ),
        why="the draft engine's manager sizes the draft checkpoint's layers: 32 of Llama-3.1-8B, 36 of Qwen3-8B",
    ),
    "max_draft_len": Changes(
        (*EAGLE3_TRTLLM, "--max_draft_len", "1"),
        (*EAGLE3_TRTLLM, "--max_draft_len", "3"),
        why="Eagle3 one-model's draft manager holds max_draft_len layers in TensorRT-LLM 1.2 (num_eagle_layers)",
    ),
    "eagle3_one_model": Changes(
        (*EAGLE3_TRTLLM, "--max_draft_len", "3"),
        (*EAGLE3_TRTLLM, "--max_draft_len", "3", "--eagle3_one_model", "false"),
        why="two-model: the draft engine's manager holds the draft checkpoint's layers, not max_draft_len of them",
    ),
    "draft_weights_memory": Changes(
        (*DRAFT_ON_GPU, "--draft_weights_memory", "1GiB"),
        (*DRAFT_ON_GPU, "--draft_weights_memory", "4GiB"),
        why="the draft's weights leave less of the GPU free after warm-up (test_trtllm_record_fit_drafts.py)",
    ),
    "max_batch_size": NoMemory(
        "TensorRT-LLM sizes its KV cache from the memory left free after its warm-up run (`--memory` under "
        "`--accounting trtllm`), so the warm-up's batch does not change it; it caps the requests scheduled at once "
        "and is carried into the `trtllm-serve` line. (Under `--gpu` kvpools subtracts the warm-up's MLP "
        "activation, which `--max_num_tokens` sizes, not `--max_batch_size`; the memory outside torch, CUDA graphs "
        "included, is not derived, so a `--gpu` plan says it is an upper bound: docs/trtllm.md, Whole-GPU terms.)"
    ),
    # the estimation forward's MLP activation (engines/trtllm/runtime_memory.py) under a --gpu budget
    "max_num_tokens": Changes(TRTLLM_GPU, (*TRTLLM_GPU, "--max_num_tokens", "4096")),
    # -- the capacity question
    "contexts": Changes(("llama-3.1-8b", "--memory", "20GiB"), (*LLAMA, "--context", "1024"), command="capacity"),
    "requests": Changes(("llama-3.1-8b", "--memory", "20GiB"), (*LLAMA, "--requests", "64"), command="capacity"),
    "headroom": Changes(  # the recommended SGLang flags leave this much of the binding pool free
        (*LLAMA, "--context", "8192"), (*LLAMA, "--context", "8192", "--headroom", "0.5"), command="capacity"
    ),
    "workload": Changes(
        ("llama-3.1-8b", "--memory", "20GiB"), (*LLAMA, "--workload", "uniform:1k..32k"), command="capacity"
    ),
    # -- not memory
    "output_format": NoMemory(f"{OUTPUT} (a table, markdown or CSV)."),
    "as_json": NoMemory(f"{OUTPUT} (JSON)."),
    "context": NoMemory(
        "`plan` only: adds the requests that fit at these context lengths to the output, from the same pools."
    ),
    "compare_platform": NoMemory(
        "Adds a second plan for another platform beside this one; this one is unchanged (that plan is walked "
        "through `--platform`)."
    ),
    "all_ranks": NoMemory(
        "`plan` only: prints every rank's plan (the ranks differ through `--pp-size` / `--pp-rank`, walked above)."
    ),
    "checked_allocators": Changes(
        ("llama-3.1-8b", "--memory", "1GiB", "--device", "meta"),
        ("llama-3.1-8b", "--memory", "1GiB", "--device", "meta", "--checked-allocators"),
        command="build",
        why="the checked allocators' own bookkeeping (checking_bytes) beside the planned pools",
    ),
}
"""The evidence for each click option (parameter name) of ``plan`` / ``build`` / ``capacity``."""

SERVING_ONLY: dict[str, NoMemory] = {
    "platform_traits": NoMemory(
        "Resolved by the pipeline from the platform's plugin (`platform_traits` hook), never given: it follows "
        "`--platform` (walked above)."
    ),
    "workspaces": NoMemory(
        "Resolved by the pipeline (`workspaces` hook), never given: it follows `--platform` and "
        "`--plugin-option` (walked above)."
    ),
    "speculative_draft": NoMemory(
        "Resolved by the pipeline from `--speculative-draft-model-path` (walked above as `draft_model`)."
    ),
}
"""``Serving`` fields no option names directly (the others share their option's name and evidence)."""

OPTION_FOR_FIELD = {"plugin_options": "plugin_options"}

_Memory = namedtuple("_Memory", "available total")


def _patch_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: _Memory(available=64 * GiB, total=128 * GiB))


PATCHES: dict[str, Callable[[pytest.MonkeyPatch], None]] = {"host": _patch_host}

MEMORY_KEYS = (
    "max_total_num_tokens",
    "max_running_requests",
    "bytes_per_token",
    "cell_size_bytes",
    "budget_bytes",
    "planned_bytes",
    "pools",
    "host",
    "windows",
    "draft",
    "cost_counts",
)
"""What a ``plan --json`` says about memory (not the notes, provenance or the echoed options)."""


def _options(command: str) -> list[str]:
    group = cli.main
    assert isinstance(group, click.Group)
    return [param.name for param in group.commands[command].params if isinstance(param, click.Option) and param.name]


def _run(command: str, args: tuple[str, ...]) -> click.testing.Result:
    return CliRunner().invoke(cli.main, [command, *args, "--json"])


def _numbers(data: Any) -> Any:
    """Only the numbers of a JSON answer (a name or a note echoed back is no change of memory)."""
    if isinstance(data, dict):
        return {key: _numbers(value) for key, value in data.items() if key != "notes" and not isinstance(value, str)}
    if isinstance(data, list):
        return [_numbers(value) for value in data if not isinstance(value, str)]
    return data


def _memory(command: str, args: tuple[str, ...]) -> Any:
    result = _run(command, args)
    assert result.exit_code == 0, (command, args, result.stdout, result.stderr)
    data = json.loads(result.stdout)
    if command == "build":
        return {key: value for key, value in data.items() if key.endswith("_bytes")}
    if command == "capacity":
        return {key: value for key, value in data.items() if key not in ("model", "notes")}  # flags: the advice
    if "vllm" in data:
        data = data["vllm"]
    if data.get("accounting") == "trtllm":  # its echoed options are not memory: the pools and what they publish
        return {key: data[key] for key in ("pools", "kv_cache_capacity", "max_kv_tokens", "ranks")}
    return {key: data.get(key) for key in MEMORY_KEYS} if "max_total_num_tokens" in data else data


# -- the walk ---------------------------------------------------------------------------------------------------


def test_every_option_has_evidence() -> None:
    """(a) a named plan change, (b) docs/options.md with a reason, or (c) a refusal: no option without one."""
    missing = sorted({name for command in COMMANDS for name in _options(command)} - set(EVIDENCE))
    assert not missing, f"options with no evidence in EVIDENCE: {missing}"
    fields = {field.name for field in attrs.fields(Serving)}
    unaccounted = sorted(fields - set(EVIDENCE) - set(SERVING_ONLY))
    assert not unaccounted, f"Serving fields with no evidence: {unaccounted}"
    stale = sorted(set(EVIDENCE) - {name for command in COMMANDS for name in _options(command)})
    assert not stale, f"EVIDENCE names options no command has: {stale}"


CHANGES = sorted(name for name, evidence in EVIDENCE.items() if isinstance(evidence, Changes))


@pytest.mark.parametrize("name", CHANGES)
def test_the_option_changes_the_plan(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    evidence = EVIDENCE[name]
    assert isinstance(evidence, Changes)
    if evidence.patch:
        PATCHES[evidence.patch](monkeypatch)
    spelled = _flag(name)
    assert spelled in evidence.with_, f"{name}: the 'with' arguments do not give {spelled}"
    without = _numbers(_memory(evidence.command, evidence.without))
    with_ = _numbers(_memory(evidence.command, evidence.with_))
    assert without != with_, f"{spelled} changed nothing: {evidence}"


REFUSED = sorted(name for name, evidence in EVIDENCE.items() if isinstance(evidence, Refused))


@pytest.mark.parametrize("name", REFUSED)
def test_the_option_is_refused_where_not_modelled(name: str) -> None:
    evidence = EVIDENCE[name]
    assert isinstance(evidence, Refused)
    result = _run(evidence.command, evidence.args)
    message = result.stderr
    assert result.exit_code == 1 and message.startswith("Error: "), (result.exit_code, result.stdout, message)
    assert "Traceback" not in message and evidence.message in message, message


# -- docs/options.md ----------------------------------------------------------------------------------------------

HEADER = """# Options and what they change

Every option of `kvpools plan`, `kvpools build` and `kvpools capacity`, and every `Serving` field, is in one
of three places (issue 32): it changes the plan for some model (the evidence below is checked live by
`tests/cli/test_option_walk.py`, which plans with and without it through the real CLI), it is refused with a
clear error where kvpools does not model it, or it does not change the memory a plan describes, for the reason
given.  A combination the engine refuses is refused with the engine's reason; one the engine accepts and
kvpools does not model is refused with "kvpools does not model X yet", never planned as something else.

This page is generated from the test's table (`KVPOOLS_WRITE_DOCS=1 pytest tests/cli/test_option_walk.py`).
"""


def _flag(name: str) -> str:
    """The option's own spelling, from the command that has it."""
    group = cli.main
    assert isinstance(group, click.Group)
    for command in COMMANDS:
        for param in group.commands[command].params:
            if isinstance(param, click.Option) and param.name == name:
                return max(param.opts, key=len)
    raise AssertionError(f"no command has an option {name}")


def _args(args: tuple[str, ...]) -> str:
    return " ".join(f"'{a}'" if " " in a or "{" in a else a for a in args)


def render() -> str:
    lines = [HEADER, "## Not memory-relevant\n", "| option | why it does not change the plan |", "|---|---|"]
    lines += [f"| `{_flag(n)}` | {e.reason} |" for n, e in EVIDENCE.items() if isinstance(e, NoMemory)]
    lines += ["", "`Serving` fields no option names:", "", "| field | why |", "|---|---|"]
    lines += [f"| `{n}` | {e.reason} |" for n, e in SERVING_ONLY.items()]
    lines += ["", "## Refused where not modelled\n", "| option | refused as | error says |", "|---|---|---|"]
    lines += [
        f"| `{_flag(n)}` | `kvpools {e.command} {_args(e.args)}` | {e.message} |"
        for n, e in EVIDENCE.items()
        if isinstance(e, Refused)
    ]
    lines += ["", "## Changes the plan\n", "| option | without | with | |", "|---|---|---|---|"]
    lines += [
        f"| `{_flag(n)}` | `kvpools {e.command} {_args(e.without)}` | `{_args(e.with_)}` | {e.why} |"
        for n, e in EVIDENCE.items()
        if isinstance(e, Changes)
    ]
    return "\n".join(lines) + "\n"


def test_the_options_page_is_the_table() -> None:
    text = render()
    if os.environ.get("KVPOOLS_WRITE_DOCS"):
        DOC.write_text(text)
    assert DOC.read_text() == text, "docs/options.md drifted: KVPOOLS_WRITE_DOCS=1 pytest tests/cli/test_option_walk.py"


# -- options that changed nothing alone, now refused (issue 32) ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # mamba_extra_buffer_of (SGLang 0.5.23 arg_groups/model_override_base.py lines 260-265): extra_buffer_lazy
        # is a strategy of the extra buffer; kvpools read the lazy flag only with --enable-mamba-extra-buffer
        ((*QWEN35, "--enable-mamba-extra-buffer-lazy"), "add --enable-mamba-extra-buffer"),
        # HiSparse reads its config only when on (arg_groups/hisparse_hook.py)
        ((*LLAMA, "--hisparse-config", '{"host_to_device_ratio": 4}'), "add --enable-hisparse"),
        # deepseek_v4_memory_pool.py lines 50, 72-73, 1078: the C128 MTP buffer exists only under ONLINE_C128
        ((*DSV4, "--enable-online-c128-mtp"), "add --enable-online-compress"),
        # SGLANG_DISABLE_LAZY_COMPACTION is read by the unified allocators only (_should_enable_lazy_compaction)
        ((*LLAMA, "--disable-lazy-compaction"), "add --enable-unified-memory"),
    ],
)
def test_an_option_that_would_change_nothing_alone_is_refused(args: tuple[str, ...], message: str) -> None:
    result = _run("plan", args)
    assert result.exit_code == 1 and result.stderr.startswith("Error: "), (result.stdout, result.stderr)
    assert message in result.stderr and "changes nothing" in result.stderr.replace("change nothing", "changes nothing")


@pytest.mark.parametrize(
    "args",
    [
        # the SWA chunk cap eats the budget (plugins/swa/sizing.py, SGLang's accounting)
        (
            *("gpt-oss-120b", "--memory", "2GiB", "--page-size", "64", "--max-running-requests", "6400"),
            *("--disable-radix-cache", "--accounting", "sglang"),
        ),
        # no mamba state slot fits (plugins/mamba/sizing.py split_budget)
        ("qwen3.5-35b-a3b", "--memory", "200MiB"),
        # the state pools take the whole budget (plugins/mamba/sizing.py)
        ("qwen3.5-35b-a3b", "--memory", "1GiB", "--max-mamba-cache-size", "2000"),
    ],
)
def test_not_enough_memory_under_memory_never_advises_the_fraction_it_ignores(args: tuple[str, ...]) -> None:
    """``--memory`` is the KV budget itself (``--mem-fraction-static`` beside it is refused), so the advice to raise
    the fraction changed nothing; the plugins' errors name the options of the budget given."""
    result = _run("plan", args)
    assert result.exit_code == 1 and "Raise --memory" in result.stderr.replace("raise --memory", "Raise --memory")
    assert "--mem-fraction-static" not in result.stderr, result.stderr


# -- --quantization with the checkpoint's own method (issue 34) ---------------------------------------------------

NVFP4_VLLM = ("qwen3.6-35b-a3b-nvfp4", "--gpu", "h100", "--accounting", "vllm")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # vLLM / SGLang: no override answers for awq on an fp8 checkpoint (vllm/config/model.py L1452-1461,
        # sglang/srt/configs/model_config.py L2142-2148)
        (("deepseek-v3", "--gpu", "h200", "--tp-size", "8", "--quantization", "awq"), "SGLang refuses it"),
        (
            ("deepseek-v3", "--gpu", "h200", "--tp-size", "8", "--quantization", "awq", "--accounting", "vllm"),
            "vLLM refuses it ('Quantization method specified in the model config (fp8) does not match",
        ),
        # gpt-oss's mxfp4 under SGLang: fp8 is not its method (vLLM's gpt_oss_mxfp4 override would accept it)
        (("gpt-oss-20b", "--gpu", "h100", "--quantization", "fp8"), "pass --quantization mxfp4"),
        (("llama-3.1-8b", "--gpu", "h100", "--quantization", "modelopt"), "no quantization_config"),
        (("llama-3.1-8b", "--gpu", "h100", "--quantization", "bitsandbytes"), "kvpools does not model bitsandbytes"),
        ((*NVFP4_VLLM, "--quantization", "modelopt_fp8"), "not one of vLLM's --quantization methods"),
    ],
)
def test_checkpoint_quantization_mismatches_are_refused_as_the_engine_refuses(
    args: tuple[str, ...], message: str
) -> None:
    result = _run("plan", args)
    assert result.exit_code == 1 and result.stderr.startswith("Error: "), (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and message in result.stderr, result.stderr
    # the engine would not start: --weights-memory is no way around it, so the error does not advise it
    assert "--weights-memory (one rank" not in result.stderr, result.stderr


def test_checkpoint_quantization_plans_the_checkpoint_as_stored() -> None:
    """``--quantization modelopt`` on the Qwen3.6 NVFP4 checkpoint (club-3090#612/#652's flag): the same plan as
    without it (vLLM resolves it to the checkpoint's modelopt_mixed; nothing is quantised again), and the ``vllm
    serve`` line carries it."""
    without = _numbers(_memory("plan", NVFP4_VLLM))
    with_ = _numbers(_memory("plan", (*NVFP4_VLLM, "--quantization", "modelopt")))
    assert without == with_
    result = CliRunner().invoke(cli.main, ["plan", *NVFP4_VLLM, "--quantization", "modelopt"])
    assert result.exit_code == 0 and "--quantization modelopt" in result.stdout, result.stdout
