"""Hybrid MLA-SWA: full layers MLA or DSA, sliding layers MLA with their own latent dims.

No real config with ``swa_kv_lora_rank`` ships in ``../shared/model-configs/``
and no public ``config.json`` of one was found, so the configs here are
synthetic.  Their latent dims are those public code states for dots3-note
(``Dots3NoteForCausalLM``, the architecture SGLang's ``configs/dots3.py``
serves with a hybrid MLA-SWA pool): ``kv_lora_rank`` 512 / ``qk_rope_head_dim``
64 on full layers, ``swa_kv_lora_rank`` 1024 / ``swa_qk_rope_head_dim`` 64 on
sliding ones, a 128-dim DSA indexer.  The layer count is small so that the CPU
builds stay cheap.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from kvpools_plugins.swa.allocator import SWATokenToKVPoolAllocator
from kvpools_plugins.swa.mla_pool import SWAMLAKVPool

from kvpools_core.building import build
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.options import cli_surface
from kvpools_core.pipeline import plan
from kvpools_core.pools.dsa import DSATokenToKVPool
from kvpools_core.pools.mla import MLATokenToKVPool
from kvpools_core.pools.quant import fp8_quantize
from kvpools_core.registry import get_registry
from kvpools_core.values import ModelSpec, Serving

from .support import parse

GiB = 1 << 30
MiB = 1 << 20
FULL_LAYERS = (0, 4)
NUM_LAYERS = 8


def hybrid_config(dsa: bool = False, **changes: Any) -> dict[str, Any]:
    """8 layers, 0 and 4 full, the others sliding; DSA full layers with a DSA architecture and ``index_topk``."""
    config: dict[str, Any] = {
        "architectures": ["DeepseekV32ForCausalLM" if dsa else "DeepseekV3ForCausalLM"],
        "model_type": "synthetic_mla_swa",
        "torch_dtype": "bfloat16",
        "num_hidden_layers": NUM_LAYERS,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "layer_types": ["full_attention" if i in FULL_LAYERS else "sliding_attention" for i in range(NUM_LAYERS)],
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "swa_kv_lora_rank": 1024,
        "swa_qk_rope_head_dim": 64,
        "swa_qk_nope_head_dim": 192,
        "swa_v_head_dim": 128,
        "swa_num_key_value_heads": 8,
        "sliding_window_size": 512,
        "max_position_embeddings": 4096,
    }
    if dsa:
        config |= {"index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64}
    return config | changes


def hybrid(dsa: bool = False, **changes: Any) -> ModelSpec:
    return parse(hybrid_config(dsa, **changes), "synthetic-mla-swa")


# -- claim -------------------------------------------------------------------


@pytest.mark.parametrize("dsa", (False, True))
def test_claimed_by_the_swa_plugin_alone(dsa: bool) -> None:
    """Every installed plugin is asked; only swa answers (mla and dsa decline via ``has_mla_latent``)."""
    answers = get_registry().call_collect("parse_model_config", config=hybrid_config(dsa), source="synthetic")
    assert [plugin for plugin, _ in answers] == ["swa"]
    model = answers[0][1]
    assert model.architecture == "swa" and model.params["latent"] == ("dsa" if dsa else "mla")
    full = [layer for layer in model.layers if layer.kind == "attention"]
    swa = [layer for layer in model.layers if layer.kind == "sliding_attention"]
    assert [layer.index for layer in full] == list(FULL_LAYERS) and len(swa) == 6
    assert full[0].params["kv_lora_rank"] == 512 and swa[0].params["kv_lora_rank"] == 1024
    assert swa[0].sliding_window == 512 and ("index_head_dim" in full[0].params) == dsa


def test_plain_mla_and_dsa_configs_stay_with_their_plugins() -> None:
    for config, owner in ((hybrid_config(), "mla"), (hybrid_config(dsa=True), "dsa")):
        plain = {k: v for k, v in config.items() if not k.startswith("swa_") and k != "layer_types"}
        answers = get_registry().call_collect("parse_model_config", config=plain, source="plain")
        assert [plugin for plugin, _ in answers] == [owner]


def test_sliding_latent_dims_without_a_layer_list_are_refused() -> None:
    config = {k: v for k, v in hybrid_config().items() if k != "layer_types"}
    with pytest.raises(ConfigError, match=r"swa_kv_lora_rank.*no layer_types or hybrid_layer_pattern"):
        parse(config)


def test_absent_sliding_latent_dims_follow_the_full_layers() -> None:
    config = {k: v for k, v in hybrid_config().items() if k not in ("swa_kv_lora_rank", "swa_qk_rope_head_dim")}
    model = parse(config)
    assert {(layer.params["kv_lora_rank"], layer.params["qk_rope_head_dim"]) for layer in model.layers} == {(512, 64)}


# -- bytes per token -----------------------------------------------------------


@pytest.mark.parametrize(
    ("dsa", "kv", "full_per_layer", "swa_per_layer"),
    (
        # MLA rows: (512 + 64) x 2 B; sliding: (1024 + 64) x 2 B.
        (False, "bf16", (512 + 64) * 2, (1024 + 64) * 2),
        # raw fp8 rows: one byte per element, either kind.
        (False, "fp8_e4m3", 512 + 64, 1024 + 64),
        # DSA bf16: the MLA row + the indexer key (128 fp8 + one fp32 scale = 132 B).
        (True, "bf16", (512 + 64) * 2 + 132, (1024 + 64) * 2),
        # DSA fp8: FlashMLA's packed row 512 + 512 / 128 x 4 + 64 x 2 = 656 B + 132; sliding rows stay raw.
        (True, "fp8_e4m3", 512 + 4 * 4 + 64 * 2 + 132, 1024 + 64),
    ),
)
def test_bytes_per_token_of_each_pool(dsa: bool, kv: str, full_per_layer: int, swa_per_layer: int) -> None:
    """Two full and six sliding layers; TP 4 shards nothing (one latent row per layer, shared by all heads)."""
    serving = Serving(kv_cache_dtype=kv, page_size=64, tp_size=4)
    p = plan(hybrid(dsa), serving, memory=4 * GiB)
    per_pool = p.cell.pool_bytes_per_token()
    full_pools = per_pool["kv_full"] + per_pool.get("indexer", 0)
    assert full_pools == 2 * full_per_layer
    assert per_pool["kv_swa"] == 6 * swa_per_layer
    assert ("indexer" in per_pool) == dsa
    if dsa:
        assert per_pool["indexer"] == 2 * 132


@pytest.mark.parametrize("dsa", (False, True))
def test_exact_plan_splits_by_the_ratio_and_fits(dsa: bool) -> None:
    page = 64
    p = plan(hybrid(dsa), Serving(page_size=page), memory=8 * GiB)
    full, swa = (p.sizing.sglang_config[k] for k in ("full_max_total_num_tokens", "swa_max_total_num_tokens"))
    assert p.max_total_num_tokens == full and full % page == 0
    assert swa == int(full * 0.8) // page * page
    pools = {pool.name: pool for pool in p.pools}
    assert pools["kv_full"].bytes == (full + page) * 2 * 1152
    assert pools["kv_swa"].bytes == (swa + page) * 6 * 2176
    if dsa:  # (tokens + page + 1) // page whole pages of 64 x 132 B per full layer
        assert pools["indexer"].bytes == (full + page + 1) // page * page * 2 * 132
    assert pools["full_to_swa"].bytes == (full + page + 1) * 8
    assert 8 * GiB * 0.999 < p.planned_bytes <= 8 * GiB  # the exact plan fills the budget


def test_chunk_cap_keeps_the_latent_swa_pool_within_the_full_pool() -> None:
    serving = Serving(page_size=64, max_running_requests=4, disable_radix_cache=True)
    p = plan(hybrid(), serving, memory=2 * GiB)
    full, swa = (p.sizing.sglang_config[k] for k in ("full_max_total_num_tokens", "swa_max_total_num_tokens"))
    # 4 x (window 512 + interval 128 x 1 + page 64 + decode page 64) + 2 chunks x 8192 + page 64, page aligned
    assert swa == -(-(4 * (512 + 128 + 64 + 64) + 2 * 8192 + 64) // 64) * 64 <= full
    assert p.planned_bytes <= 2 * GiB


# -- SGLang accounting and the other refusals ----------------------------------


@pytest.mark.parametrize("dsa", (False, True))
def test_sglang_accounting_is_refused_with_the_reason(dsa: bool) -> None:
    """SGLang's HybridSWAPoolConfigurator charges MHA geometry for these layers, from ModelConfig fields whose
    values for a hybrid MLA-SWA architecture are not established (docs/sizing.md): no oracle comparison is
    possible, so the plan is refused before anything is sized."""
    serving = Serving(accounting="sglang", page_size=64)
    with pytest.raises(UnsupportedCombinationError) as caught:
        plan(hybrid(dsa), serving, memory=8 * GiB)
    message = str(caught.value)
    for text in (
        "--accounting sglang is not supported for hybrid MLA-SWA",
        "HybridSWAPoolConfigurator",
        "get_num_kv_heads(tp) x (head_dim + v_head_dim)",
        "ModelConfig",
        "Use --accounting exact",
    ):
        assert text in message


@pytest.mark.parametrize(
    ("dsa", "serving", "text"),
    (
        (False, Serving(kv_cache_dtype="fp4_e2m1"), "MLATokenToKVPoolFP4"),
        (False, Serving(kv_cache_dtype="mxfp8"), "mxfp8 is not supported for MLA"),
        (False, Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=1), "draft KV pool"),
        (False, Serving(dcp_size=2, tp_size=2), "--dcp-size 2"),
        (True, Serving(page_size=1, platform="cuda"), "--page-size 64"),
        (True, Serving(page_size=64, attn_cp_size=2, tp_size=2, enable_dsa_cache_layer_split=True), "layer-split"),
    ),
)
def test_unsupported_combinations_are_refused(dsa: bool, serving: Serving, text: str) -> None:
    with cli_surface(), pytest.raises(UnsupportedCombinationError, match=re.escape(text)):
        plan(hybrid(dsa), serving, memory=8 * GiB)


# -- build ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsa", "serving"),
    (
        (False, Serving()),
        (False, Serving(kv_cache_dtype="fp8_e4m3", page_size=16, tp_size=4)),
        (True, Serving(page_size=64)),
        (True, Serving(page_size=64, kv_cache_dtype="fp8_e4m3")),
        (True, Serving(page_size=64, pp_size=2, pp_rank=1)),
    ),
)
def test_build_on_meta_equals_the_plan_pool_by_pool(dsa: bool, serving: Serving) -> None:
    p = plan(hybrid(dsa), serving, memory=20 * GiB)
    pools = build(p, "meta")
    assert isinstance(pools.kv_pool, SWAMLAKVPool)
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools}
    assert pools.allocated_bytes == p.planned_bytes
    full_store = pools.kv_pool.full_kv_pool
    assert isinstance(full_store, DSATokenToKVPool if dsa else MLATokenToKVPool)
    assert type(pools.kv_pool.swa_kv_pool) is MLATokenToKVPool


def test_pipeline_stage_maps_global_layer_ids() -> None:
    pool = build(plan(hybrid(), Serving(pp_size=2, pp_rank=1), memory=GiB), "meta").kv_pool
    assert pool.full_attention_layer_ids == [4] and pool.swa_attention_layer_ids == [5, 6, 7]
    assert pool.layers_mapping[4] == (0, False) and pool.layers_mapping[6] == (1, True)
    with pytest.raises(IndexError, match="Layer 1 is not in this SWA pool"):
        pool.get_key_buffer(1)


def _small(dsa: bool, kv: str, page: int, platform: str = "cpu") -> tuple[SWAMLAKVPool, SWATokenToKVPoolAllocator]:
    """A small plan built on the CPU (fp8 MLA KV is planned for CUDA: SGLang refuses it on the CPU platform)."""
    serving = Serving(kv_cache_dtype=kv, page_size=page, max_running_requests=4, context_length=256, platform=platform)
    pools = build(plan(hybrid(dsa), serving, memory=48 * MiB), "cpu")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in pools.plan.pools}
    pool, alloc = pools.kv_pool, pools.allocator
    assert isinstance(pool, SWAMLAKVPool) and isinstance(alloc, SWATokenToKVPoolAllocator)
    assert alloc.full_to_swa_index_mapping is pool.full_to_swa_index_mapping
    return pool, alloc


def _latent(n: int, dim: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 1, dim, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("dsa", (False, True))
def test_latent_rows_round_trip_through_full_slot_ids(dsa: bool) -> None:
    """bf16 rows written to a full and a sliding layer read back exactly; the sliding layer's row sits in the
    SWA store at the translated slot, with the sliding dims (1024 + 64)."""
    pool, alloc = _small(dsa, "bf16", 1)
    loc = alloc.alloc_extend(torch.tensor([0]), torch.tensor([5]), torch.tensor([-1]), 5)
    assert loc is not None
    for layer, rank in ((0, 512), (1, 1024)):
        nope, rope = _latent(5, rank, layer).bfloat16(), _latent(5, 64, layer + 10).bfloat16()
        pool.set_mla_kv_buffer(layer, loc, nope, rope)
        got_nope, got_rope = pool.get_mla_kv(layer, loc)
        assert torch.equal(got_nope, nope) and torch.equal(got_rope, rope)
    assert pool.is_swa_layer(1) and not pool.is_swa_layer(0)
    swa_rows = pool.translate_loc_from_full_to_swa(loc)
    assert bool((swa_rows > 0).all())
    stored = pool.swa_kv_pool.get_key_buffer(0)[swa_rows]  # layer 1 is the SWA store's first layer
    assert stored.shape == (5, 1, 1024 + 64) and torch.equal(stored, pool.get_key_buffer(1)[swa_rows])
    assert pool.full_to_swa_index_mapping is not None and int(pool.full_to_swa_index_mapping[-1]) == -1
    assert not pool.get_key_buffer(4)[loc].any()  # the other full layer is untouched


def test_dsa_fp8_packed_rows_and_indexer_keys_round_trip() -> None:
    """DSA full layers keep FlashMLA's packed fp8 row (656 B) and the indexer keys; sliding rows are raw fp8."""
    pool, alloc = _small(True, "fp8_e4m3", 64, platform="cuda")
    assert pool.full_kv_pool is not None and pool.full_kv_pool.kv_buffer[0].shape[-1] == 656
    assert pool.swa_kv_pool.kv_buffer[0].shape[-1] == 1024 + 64
    loc = alloc.alloc_extend(torch.tensor([0]), torch.tensor([3]), torch.tensor([-1]), 3)
    assert loc is not None
    nope, rope = _latent(3, 512, 1), _latent(3, 64, 2)
    pool.set_mla_kv_buffer(4, loc, nope, rope)
    got_nope, got_rope = pool.get_mla_kv(4, loc, torch.float32)
    torch.testing.assert_close(got_nope, nope, rtol=0.07, atol=0.1)
    torch.testing.assert_close(got_rope, rope.bfloat16().float())  # the rope stays bf16
    keys = _latent(3, 128, 3).reshape(3, 128)
    pool.set_index_k(4, loc, keys)
    torch.testing.assert_close(pool.get_index_k_dequant(4, loc, torch.float32), keys, rtol=0.07, atol=0.1)
    snope, srope = _latent(3, 1024, 4), _latent(3, 64, 5)
    pool.set_mla_kv_buffer(2, loc, snope, srope)
    got = torch.cat(pool.get_mla_kv(2, loc, torch.float32), -1)
    assert torch.equal(got, fp8_quantize(torch.cat((snope, srope), -1), torch.float8_e4m3fn).float())
    with pytest.raises(ValueError, match="only DSA full layers keep indexer keys"):
        pool.set_index_k(2, loc, keys)
