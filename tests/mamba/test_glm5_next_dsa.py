"""GLM5-Next-style hybrids: KDA linear-attention layers beside DSA full-attention layers (ledger row 000-107).

SGLang 0.5.23's ``is_deepseek_dsa`` names ``Glm5NextForConditionalGeneration``; ``_build_hybrid_linear_kv_pool``
(``../shared/reference/000_*`` lines 1901-1927; the installed ``mem_cache/kv_cache_configurator.py``) then builds
``HybridLinearKVPool(use_dsa=True)``, whose full pool (``memory_pool.py``, ``HybridLinearKVPool.__init__``'s
``use_dsa`` branch) is a ``DSATokenToKVPool`` of the rank's ``full_attention_layer_ids`` only: per full layer
a latent row (``kv_cache_dim`` = ``calculate_mla_kv_cache_dim``) and index-key pages of
``(size + page + 1) // page`` pages of ``page x 132 / index_kpool`` B, none where
``skip_topk_layers = [dsa_layer_skips_topk(config, i) for i in full_attention_layer_ids]`` holds.  The KDA layers
are ``Glm5NextTextConfig.is_kda_layer``'s (0-based ``kda_layers``).  No public GLM5-Next config exists (none in
``../shared/model-configs/``, none found by search), so the config is generated: 16 layers, full attention on
layers 3, 7, 11, 15, ``index_topk_pattern`` marking 7 and 15 as IndexShare layers.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import pytest

from kvpools_core import Serving, plan
from kvpools_core.building import build
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.models import parse_config
from kvpools_core.registry import get_registry

GiB = 1 << 30
LAYERS = 16
FULL = [3, 7, 11, 15]


def glm5_next(**text_changes: Any) -> dict[str, Any]:
    """A GLM5-Next config (``configs/glm5_next.py``): KDA on every layer but each fourth, DSA on the full ones."""
    text = {
        "model_type": "glm5_next_text",
        "num_hidden_layers": LAYERS,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "linear_attn_config": {
            "kda_layers": [i for i in range(LAYERS) if i not in FULL],  # 0-based (is_kda_layer)
            "full_attn_layers": FULL,
            "head_dim": 128,
            "num_heads": 64,
            "short_conv_kernel_size": 4,
        },
        "index_head_dim": 128,
        "index_topk": 2048,
        "index_topk_pattern": "FFFFFFFSFFFFFFFS",
        **text_changes,
    }
    text = {key: value for key, value in text.items() if value is not None}
    return {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next", "text_config": text}


def _spec(config: dict[str, Any]) -> Any:
    spec, plugin = parse_config(config, "glm5-next", get_registry())
    assert plugin == "mamba"
    return spec


def test_parses_as_a_kda_hybrid_with_dsa_full_layers() -> None:
    spec = _spec(glm5_next())
    full = [layer for layer in spec.layers if layer.kind == "mla_attention"]
    assert [layer.index for layer in full] == FULL  # 0-based kda_layers, unlike Kimi-Linear's 1-based ones
    assert [bool(layer.params.get("skips_topk")) for layer in full] == [False, True, False, True]
    assert {layer.params["index_head_dim"] for layer in full} == {128}
    assert spec.params["dsa"] is True and spec.params["mixer"] == "kda"


def test_without_linear_attn_config_the_layer_types_or_every_fourth_layer_is_full() -> None:
    """``Glm5NextTextConfig.__init__``: ``layer_types``' ``linear_attention`` entries are KDA, else ``i % 4 != 3``."""
    spec = _spec(glm5_next(linear_attn_config=None))
    assert [layer.index for layer in spec.layers if layer.kind == "mla_attention"] == FULL
    types = ["full_attention" if i in (0, 9) else "linear_attention" for i in range(LAYERS)]
    spec = _spec(glm5_next(linear_attn_config=None, layer_types=types))
    assert [layer.index for layer in spec.layers if layer.kind == "mla_attention"] == [0, 9]


def test_bf16_plan_hand_computed() -> None:
    """bf16, TP 1, 4 GiB, page 64 (SGLang's DSA default, ``_deepseek_family_overrides`` names GLM5-Next):
    4 full layers x (512 + 64) x 2 B = 4,608 B of latent rows + 2 keyed layers x 132 B = 4,872 B per token
    (SGLang's cell, ref-002 lines 193-220, charges 132 B on all 4: 5,136).  The pools: ``kv`` (S + 64) x 4,608,
    ``indexer`` ((S + 65) // 64) pages x 64 x 132 x 2 keyed layers."""
    got = plan(_spec(glm5_next()), Serving(), memory=4 * GiB)
    size = got.max_total_num_tokens
    assert got.serving.page_size == 64
    assert (got.cell.bytes_per_token, got.cell.sglang_bytes_per_token) == (4 * 1152 + 2 * 132, 4 * 1284)
    assert size == 462_976
    assert got.pool("kv").bytes == (size + 64) * 4 * 1152 == 2_133_688_320
    assert got.pool("indexer").bytes == (size + 65) // 64 * 64 * 132 * 2 == 122_242_560
    assert any("IndexShare: 2 of 4 layer(s)" in note for note in got.cell.notes)


def test_fp8_latent_is_the_packed_row() -> None:
    """fp8: FlashMLA's packed row, 512 + 512 / 128 x 4 + 64 x 2 = 656 B per full layer (SGLang charges 576)."""
    got = plan(_spec(glm5_next()), Serving(kv_cache_dtype="fp8_e4m3"), memory=4 * GiB)
    assert (got.cell.bytes_per_token, got.cell.sglang_bytes_per_token) == (4 * 656 + 2 * 132, 4 * (576 + 132))


def test_the_state_pool_is_the_kda_hybrids() -> None:
    """The KDA state per slot is the same with or without the DSA full side: 12 layers x (conv 3 x 3 x 64 x 128
    bf16 + SSM 64 x 128 x 128 fp32) = 12 x (147,456 + 4,194,304) B."""
    dsa = plan(_spec(glm5_next()), Serving(), memory=4 * GiB)
    plain = plan(_spec(glm5_next(index_topk=None)), Serving(page_size=64), memory=4 * GiB)
    assert "indexer" not in [pool.name for pool in plain.pools]
    assert dsa.pool("mamba_state").bytes_per_slot == plain.pool("mamba_state").bytes_per_slot
    assert dsa.pool("mamba_state").bytes_per_slot == 12 * (3 * 3 * 64 * 128 * 2 + 64 * 128 * 128 * 4)


@pytest.mark.parametrize("serving", [Serving(), Serving(kv_cache_dtype="fp8_e4m3"), Serving(accounting="sglang")])
def test_builds_on_meta_with_the_planned_bytes(serving: Serving) -> None:
    got = plan(_spec(glm5_next()), serving, memory=4 * GiB)
    pools = build(got, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}
    rows = [buffer.shape[0] for buffer in pools.kv_pool.full.index_k_with_scale_buffer]
    pages = (got.max_total_num_tokens + 64 + 1) // 64
    assert rows == [pages, 0, pages, 0]  # IndexShare layers 7 and 15: 0-row placeholders
    assert pools.kv_pool.get_index_k_with_scale_buffer(11).shape[0] == pages  # by global layer id
    assert pools.kv_pool.get_index_k_with_scale_buffer(15).shape[0] == 0


def test_index_kpool_pages() -> None:
    """``index_kpool`` 2: 66 B per token per keyed layer, SGLang's default page 128 (64 x kpool); page 64 gives
    32-token kernel pages (``page_size // index_kpool``), which CUDA's DSA kernels refuse."""
    spec = _spec(glm5_next(index_kpool=2))
    got = plan(spec, Serving(), memory=4 * GiB)
    assert got.serving.page_size == 128
    assert got.cell.bytes_per_token == 4 * 1152 + 2 * 66
    assert build(got, "meta").allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}
    with pytest.raises(UnsupportedCombinationError, match="DSA kernel pages of 32 tokens"):
        plan(spec, Serving(page_size=64), memory=4 * GiB)


def test_no_elision_under_pd() -> None:
    """``_should_elide_dsa_index_k`` is false under PD disaggregation: every full layer keeps its keys."""
    got = plan(_spec(glm5_next()), Serving(disaggregation_mode="prefill"), memory=4 * GiB)
    assert got.cell.bytes_per_token == 4 * (1152 + 132)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"page_size": 32}, "page_size 64"),
        ({"tp_size": 2, "dcp_size": 2}, "kvpools does not model dcp_size 2"),
        (
            {
                "speculative_algorithm": "NEXTN",
                "speculative_num_steps": 1,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 2,
                "max_running_requests": 8,
            },
            "kvpools does not model speculative decoding",
        ),
        ({"enable_hisparse": True}, "kvpools does not model enable_hisparse"),
        ({"platform": "ascend", "page_size": 128}, "kvpools does not model platform ascend"),
    ],
    ids=["page", "dcp", "speculative", "hisparse", "ascend"],
)
def test_refusals(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match=words):
        plan(_spec(glm5_next()), Serving(**changes), memory=4 * GiB)


def test_vllm_accounting_is_refused_by_name() -> None:
    from kvpools_core.engines.vllm import plan_vllm

    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model GLM5-Next"):
        plan_vllm(_spec(glm5_next()), Serving(accounting="vllm"), memory=4 * GiB)


def test_capacity_answers() -> None:
    """More memory, more tokens; the KV stays (S + 64) x 4,608 B whatever the budget."""
    small, large = (plan(_spec(glm5_next()), Serving(), memory=m * GiB) for m in (4, 8))
    assert large.max_total_num_tokens > small.max_total_num_tokens
    assert large.pool("kv").bytes == (large.max_total_num_tokens + 64) * 4608


def test_nextn_draft_config_stays_refused() -> None:
    config = copy.deepcopy(glm5_next())
    config["architectures"] = ["Glm5NextForConditionalGenerationNextN"]
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model GLM5-Next's NextN draft model"):
        parse_config(config, "glm5-next", get_registry())


def test_serving_options_keep_their_evidence() -> None:
    """The DSA pool's latent row follows the backend: a TRTLLM DSA backend reads (and stores) the raw fp8 row."""
    fp8 = Serving(kv_cache_dtype="fp8_e4m3")
    raw = attrs.evolve(fp8, dsa_prefill_backend="trtllm", dsa_decode_backend="trtllm")
    got = plan(_spec(glm5_next()), raw, memory=4 * GiB)
    assert got.cell.bytes_per_token == 4 * 576 + 2 * 132


def test_every_full_layer_sharing_top_k_keeps_no_indexer_pool() -> None:
    """``index_topk_freq`` 2, ``index_skip_topk_offset`` 3: layer ``i`` skips when ``max(i - 2, 0) % 2 != 0``,
    true for 3, 7, 11 and 15 (``dsa_layer_skips_topk``), so the hybrid's DSA pool holds latent rows only (4 x
    1,152 B per token) and 0-row index placeholders; it still builds exactly."""
    got = plan(_spec(glm5_next(index_topk_pattern=None, index_topk_freq=2, index_skip_topk_offset=3)), Serving(),
               memory=4 * GiB)  # fmt: skip
    assert got.cell.bytes_per_token == 4 * 1152
    assert "indexer" not in [pool.name for pool in got.pools]
    pools = build(got, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}
    assert [buffer.shape[0] for buffer in pools.kv_pool.full.index_k_with_scale_buffer] == [0, 0, 0, 0]


def test_layer_split_is_refused_by_name() -> None:
    serving = Serving(tp_size=2, attn_cp_size=2, enable_dsa_cache_layer_split=True, disaggregation_mode="prefill")
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model enable_dsa_cache_layer_split"):
        plan(_spec(glm5_next()), serving, memory=4 * GiB)


def test_kpool_compress_tails_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedCombinationError, match=r"kvpools does not model index_kpool_compress"):
        plan(_spec(glm5_next(index_kpool=2, index_kpool_compress=True)), Serving(), memory=4 * GiB)


@pytest.mark.parametrize(("kv", "per_layer"), [("auto", 512 * 2), ("fp8_e4m3", 512 + 512 // 128 * 4)])
def test_glm5_next_default_rope_less_latent_builds(kv: str, per_layer: int) -> None:
    """``Glm5NextTextConfig`` defaults ``qk_rope_head_dim`` 0: a latent of 512 values, no rope columns (bf16:
    1,024 B; fp8's packed row: 512 + 4 scales x 4 B = 528 B).  The bf16 build used to fail on a 0-wide rope
    column group."""
    got = plan(_spec(glm5_next(qk_rope_head_dim=None)), Serving(kv_cache_dtype=kv), memory=4 * GiB)
    assert got.cell.bytes_per_token == 4 * per_layer + 2 * 132
    assert build(got, "meta").allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}
