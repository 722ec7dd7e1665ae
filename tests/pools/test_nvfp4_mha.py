"""``--kv-cache-dtype nvfp4`` on a dense MHA model: SGLang 0.5.23's ``NVFP4KVCacheMethod`` buffers (issue 33).

Llama-3.1-8B, 32 layers x 8 KV heads x head_dim 128, per token (``fp4_kv_cache_quant_method.py``
``create_buffers`` / ``compute_cell_size``): packed K + V 32 x 8 x 64 x 2 = 32,768 B; one scale layout
32 x 8 x (128 / 16) x 2 = 4,096 B; the fp8 dequant workspace 8 x 128 x 2 = 2,048 B (shared by every layer).
SM100 (auto = native NVFP4 prefill, trtllm_mha): data + native scales = 36,864.  SM100 with
``--prefill-kv-cache-dequant-dtype fp8_e4m3`` (flashinfer prefill): data + linear + native scales + workspace =
43,008.  SM120 (auto = fp8_e4m3): data + linear scales + workspace = 38,912.  The same numbers come from SGLang's
own method in the peers venv (``sglang_nvfp4_peer.py``), byte for byte per buffer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from kvpools_core import Serving, build
from kvpools_core.errors import ConfigError, KvpoolsError, UnsupportedCombinationError
from kvpools_core.parallel import kv_heads_per_rank
from kvpools_core.pipeline import plan
from tests.oracle import locate

GiB = 1 << 30
LAYOUTS = [
    # (sm, --prefill-kv-cache-dequant-dtype, SGLang's resolved prefill dtype, bytes per token, parts)
    (100, "auto", "nvfp4", 36_864, {"k", "v", "k_native_scale", "v_native_scale"}),
    (
        100,
        "fp8_e4m3",
        "fp8_e4m3",
        43_008,
        {"k", "v", "k_scale", "v_scale", "k_native_scale", "v_native_scale", "dq_k", "dq_v"},
    ),
    (120, "auto", "fp8_e4m3", 38_912, {"k", "v", "k_scale", "v_scale", "dq_k", "dq_v"}),
    (120, "fp8_e4m3", "fp8_e4m3", 38_912, {"k", "v", "k_scale", "v_scale", "dq_k", "dq_v"}),
]


def _serving(sm: int, prefill: str, **options: object) -> Serving:
    options = {"page_size": 16, **options}
    return Serving(kv_cache_dtype="nvfp4", nvfp4_sm=sm, prefill_kv_cache_dequant_dtype=prefill, **options)


@pytest.mark.parametrize(("sm", "prefill", "resolved", "per_token", "parts"), LAYOUTS)
def test_nvfp4_layouts_hand_computed(sm: int, prefill: str, resolved: str, per_token: int, parts: set[str]) -> None:
    got = plan("llama-3.1-8b", _serving(sm, prefill), memory=40 * GiB)
    assert got.cell.bytes_per_token == per_token
    assert {p.name for p in got.cell.parts} == parts
    # SGLang's reference estimate is the fp4 formula (ref-002 lines 270-277): 65,536 // 2 + 8 x 128 x 32 x 2 // 16
    assert got.cell.sglang_bytes_per_token == 32_768 + 4_096
    assert got.pool("kv").bytes == (got.max_total_num_tokens + 16) * per_token
    assert build(got, "meta").allocated_by_pool() == {p.name: p.bytes for p in got.pools}


@pytest.mark.parametrize(("sm", "prefill"), [(100, "auto"), (120, "auto")])
def test_nvfp4_pool_round_trips_on_cpu(sm: int, prefill: str) -> None:
    """Writes quantise (packed e2m1, one e4m3 scale per 16) into every scale layout held; reads dequantise."""
    got = plan("llama-3.1-8b", _serving(sm, prefill), memory="64MiB")
    built = build(got, "cpu")
    assert built.allocated_by_pool() == {p.name: p.bytes for p in got.pools}
    pool = built.kv_pool
    heads = kv_heads_per_rank(8, 1)
    loc = torch.tensor([16, 17, 40])
    values = torch.tensor([0.5, -1.0, 2.0, 6.0] * 32, dtype=torch.bfloat16).repeat(3, heads, 1)
    pool.set_kv_buffer(0, loc, values, -values)
    k, v = pool.get_kv(0, loc)
    assert torch.equal(k, values) and torch.equal(v, -values)  # grid values with amax 6: exact
    if sm == 100:
        assert pool.native_k_scale_buffer[0][1, :, 0].any()  # slot 16: page 1, row 0
        assert pool.dq_k_buffer is None
    else:
        assert pool.dq_k_buffer is not None and tuple(pool.dq_k_buffer.shape) == (got.max_total_num_tokens + 16, 8, 128)


def test_nvfp4_is_sglangs_own_method_byte_for_byte() -> None:
    python, _ = locate.require_sglang_peer()
    cases, plans = [], []
    for model, tp, page in (("llama-3.1-8b", 1, 16), ("qwen3-8b", 2, 64), ("llama-3.1-70b", 8, 32)):
        for sm, prefill, resolved, _, _ in LAYOUTS:
            p = plan(model, _serving(sm, prefill, tp_size=tp, page_size=page), memory="2GiB")
            layer = p.model.layers[0]
            heads = kv_heads_per_rank(layer.num_kv_heads, tp)
            cases.append(
                {
                    "size": p.max_total_num_tokens + page,
                    "head_num": heads,
                    "head_dim": layer.head_dim,
                    "layer_num": len(p.model.layers),
                    "page_size": page,
                    "sm": sm,
                    "prefill": resolved,
                }
            )
            plans.append(p)
    done = subprocess.run(
        [str(python), str(Path(__file__).parents[1] / "oracle" / "sglang_nvfp4_peer.py")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for p, case, sglang in zip(plans, cases, json.loads(done.stdout), strict=True):
        assert sum(sglang["bytes"].values()) == p.pool("kv").bytes, (p.model.name, case, sglang)
        assert sglang["cell"] == p.cell.bytes_per_token, (p.model.name, case)
        assert build(p, "meta").allocated_by_pool()["kv"] == sum(sglang["bytes"].values())


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"nvfp4_sm": None}, "Pass nvfp4_sm 100 or 120"),
        (
            {"nvfp4_sm": 120, "prefill_kv_cache_dequant_dtype": "nvfp4"},
            "Native NVFP4 prefill currently requires SM100; use --prefill-kv-cache-dequant-dtype=fp8_e4m3",
        ),
        ({"page_size": 8}, "TensorRT-LLM MHA only supports page_size of 16, 32, 64 or 128, changing page_size from 8"),
        (
            {"speculative_algorithm": "DSPARK", "speculative_draft_num_layers": 1, "speculative_num_draft_tokens": 8},
            "SM100 native NVFP4 speculative decoding does not yet support DSPARK; use EAGLE/NEXTN or NGRAM.",
        ),
        (
            {"speculative_algorithm": "STANDALONE", "speculative_draft_num_layers": 1},
            "supports EAGLE, EAGLE3, NEXTN, and breadth-1 NGRAM; got STANDALONE.",
        ),
        ({"disaggregation_mode": "decode"}, "does not yet support PD disaggregation"),
        ({"enable_hierarchical_cache": True}, "does not yet support hierarchical KV cache or LMCache"),
        ({"platform": "rocm"}, "requires Blackwell SM100 or SM120"),
        (
            {"nvfp4_sm": 120, "speculative_algorithm": "EAGLE", "speculative_draft_num_layers": 1},
            "does not model the draft pool's own workspace yet",
        ),
    ],
)
def test_nvfp4_refusals(options: dict[str, object], words: str) -> None:
    base: dict[str, object] = {"kv_cache_dtype": "nvfp4", "nvfp4_sm": 100, "page_size": 16}
    with pytest.raises(KvpoolsError) as refused:
        plan("llama-3.1-8b", Serving(**{**base, **options}), memory=40 * GiB)
    assert words in str(refused.value)


def test_an_unset_page_is_trtllm_mhas_64() -> None:
    got = plan("llama-3.1-8b", Serving(kv_cache_dtype="nvfp4", nvfp4_sm=100), memory=40 * GiB)
    assert got.serving.page_size == 64
    assert got.max_total_num_tokens % 64 == 0


def test_nvfp4_with_an_eagle_draft_on_sm100() -> None:
    """SM100 native NVFP4 supports EAGLE: the draft pool keeps the same recipe (packed data + native scales), one
    layer of 1,024 + 128 B per token, and builds exactly."""
    got = plan(
        "llama-3.1-8b",
        _serving(100, "auto", speculative_algorithm="EAGLE", speculative_draft_num_layers=1),
        memory=40 * GiB,
    )
    assert got.pool("draft_kv").bytes == (got.max_total_num_tokens + 16) * (36_864 // 32)
    assert build(got, "meta").allocated_by_pool() == {p.name: p.bytes for p in got.pools}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (
            {"kv_cache_dtype": "fp8_e4m3", "prefill_kv_cache_dequant_dtype": "fp8_e4m3"},
            "'--prefill-kv-cache-dequant-dtype applies only with --kv-cache-dtype=nvfp4.'",
        ),
        ({"kv_cache_dtype": "fp4_mx_block16", "nvfp4_sm": 100}, "alone it changes nothing"),
        ({"kv_cache_dtype": "nvfp4", "nvfp4_sm": 90}, "nvfp4_sm must be one of none, 100, 120"),
    ],
)
def test_nvfp4_options_validate(options: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Serving(**options)
    assert words in str(refused.value)


def test_nvfp4_on_other_architectures_keeps_the_refusal() -> None:
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model kv_cache_dtype nvfp4 on MHA"):
        plan("gpt-oss-20b", Serving(kv_cache_dtype="nvfp4", nvfp4_sm=100, page_size=16), memory=40 * GiB)
