"""The Ascend NPU buffer layout (``kvpools_ascend.layouts``): SGLang's NPU pool memory, built on meta and cpu.

Reference: ``/work/shared/reference/sglang-pools.md`` §3.3 (``NPUMHATokenToKVPool._create_buffers``:
``k_buffer = zeros((layer_num, size // page_size + 1, page_size, head_num, head_dim))``, ``v_buffer``
the same with ``v_head_dim``; ``_init_npu_conv_state``: ``(Lm, pool, K - 1 [+ D - 1 with speculative
decoding], channels)``), §1.6 (the SWA composite builds both sub-pools with the MHA class; on the NPU
``_build_ascend_swa_kv_pool``, ``000_*.txt`` ~1487-1640), §1.8 (MiniMax's main, index-KV and K-only
index pools, ``NPUMiniMaxSparseKVPool`` backs all three with the NPU MHA / K-only classes), §1.7
(``MambaPool``: conv ``(Lm, size + 1, conv_dim / tp, K - 1)``, temporal ``(Lm, size + 1, heads / tp,
head_dim, state)``) and §1.9 (the NPU allocates ``(S // P + 1) x P`` rows, ``S + P`` when aligned).
Head counts and dims are read by hand from the presets' configs (``plugins/*/presets``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from kvpools_ascend.layout_hooks import buffer_layout, validate_layouts
from kvpools_ascend.layouts import ASCEND_LAYOUT, CONV_ROLE, SSM_ROLE, WINDOW_FIRST_CONV_ROLE, npu_tensor
from kvpools_plugins.mamba import pool as mamba_pool
from torch import Tensor

from kvpools_core import Plan, Serving, build, plan
from kvpools_core.errors import InvalidValueError, PoolPlanMismatchError, UnsupportedCombinationError
from kvpools_core.pools.layout import PER_LAYER, BufferRequest, allocate_buffers, check_layout_bytes

from ...mamba.support import parse
from ...mamba.test_mamba_pool import TINY
from ...pools.conftest import build_mha_model

ROOT = Path(__file__).parents[3]
P = 128
ASCEND = Serving(platform="ascend", page_size=P)
MEMORY = "60GiB"
EAGLE: dict[str, Any] = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
    "max_running_requests": 64,
}


def ascend_build(preset: str, device: str = "meta", serving: Serving = ASCEND, memory: str = MEMORY) -> Any:
    """Plan ``preset`` for ascend, build it through the installed plugins; per-pool bytes must be the plan's."""
    result = plan(preset, serving, memory=memory)
    pools = build(result, device)
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    assert pools.allocated_bytes == result.planned_bytes
    assert pools.provenance["buffer_layout"] == ("ascend",)
    assert pools.layout is ASCEND_LAYOUT and pools.layout.name == "ascend"
    return pools


def whole(views: list[Tensor]) -> Tensor:
    """The one NPU tensor a store's per-layer views were carved from."""
    tensors = {id(npu_tensor(v)): npu_tensor(v) for v in views}
    assert len(tensors) == 1, "every layer of one role is a view of one tensor"
    return next(iter(tensors.values()))


def pages(tokens: int) -> int:
    """SGLang NPU's page count for a pool of ``tokens`` slots: ``size // page_size + 1`` (§3.3)."""
    return tokens // P + 1


def text_config(path: str) -> dict[str, Any]:
    config = json.loads((ROOT / path).read_text())
    return dict(config.get("text_config", config))


# -- the presets, on meta ---------------------------------------------------------


def test_llama_k_and_v_are_one_page_major_tensor_each() -> None:
    """Llama-3.1-70B: 80 layers, 8 KV heads of 128 (config) -> K and V ``(80, S // 128 + 1, 128, 8, 128)``."""
    pools = ascend_build("llama-3.1-70b")
    s = pools.plan.max_total_num_tokens
    kv = pools.kv_pool.kv
    assert tuple(whole(kv.k_buffer).shape) == (80, pages(s), P, 8, 128)
    assert tuple(whole(kv.v_buffer).shape) == (80, pages(s), P, 8, 128)
    assert tuple(kv.k_buffer[0].shape) == (s + P, 8, 128)  # the store's canonical view: S + P rows
    assert whole(kv.k_buffer).dtype == torch.bfloat16


def test_gpt_oss_swa_sub_pools_are_two_npu_mha_pools() -> None:
    """gpt-oss-120b: 18 full + 18 sliding layers (layer_types), 8 KV heads of 64; each sub-pool its own tensors.

    ``_build_ascend_swa_kv_pool`` (§1.6, ``000_*.txt`` ~1487-1640): ``SWAKVPool`` over
    ``NPUMHATokenToKVPool``, full pool ``size`` = full tokens, SWA pool ``size_swa`` = SWA tokens.
    """
    config = text_config("plugins/swa/presets/gpt-oss-120b.json")
    assert config["layer_types"].count("full_attention") == config["layer_types"].count("sliding_attention") == 18
    pools = ascend_build("gpt-oss-120b")
    sizes = pools.plan.sizing.sglang_config
    full, swa = sizes["full_max_total_num_tokens"], sizes["swa_max_total_num_tokens"]
    kv = pools.kv_pool
    for store, tokens in ((kv.full_kv_pool, full), (kv.swa_kv_pool, swa)):
        assert tuple(whole(store.k_buffer).shape) == (18, pages(tokens), P, 8, 64)
        assert tuple(whole(store.v_buffer).shape) == (18, pages(tokens), P, 8, 64)
    assert npu_tensor(kv.full_kv_pool.k_buffer[0]) is not npu_tensor(kv.swa_kv_pool.k_buffer[0])


def test_minimax_main_and_index_pools_are_page_major() -> None:
    """MiniMax-M3: 60 layers of 4 KV heads x 128; per sparse layer a 1 x 128 index key, a value where enabled.

    ``NPUMiniMaxSparseKVPool`` (§1.8): main ``NPUMHATokenToKVPool`` over every layer, the index
    pools ``head_num=1, head_dim=sparse_index_dim`` in the model dtype, each ``size // P + 1`` pages.
    """
    config = text_config("plugins/minimax_sparse/presets/minimax-m3.json")
    sparse = config["sparse_attention_config"]
    sparse_layers = [i for i, on in enumerate(sparse["sparse_attention_freq"]) if on]
    value_layers = [i for i in sparse_layers if not sparse["sparse_disable_index_value"][i]]
    assert (len(sparse_layers), sparse["sparse_index_dim"]) == (57, 128)
    pools = ascend_build("minimax-m3")
    s = pools.plan.max_total_num_tokens
    kv = pools.kv_pool
    assert tuple(whole(kv.main.k_buffer).shape) == (60, pages(s), P, 4, 128)
    assert tuple(whole(kv.main.v_buffer).shape) == (60, pages(s), P, 4, 128)
    assert tuple(whole(list(kv.index_k_buffer.values())).shape) == (57, pages(s), P, 1, 128)
    if value_layers:
        assert tuple(whole(list(kv.index_v_buffer.values())).shape) == (len(value_layers), pages(s), P, 1, 128)
    assert sorted(kv.index_k_buffer) == sparse_layers and sorted(kv.index_v_buffer) == value_layers


def test_qwen3_next_kv_and_conv_state_in_npu_layout() -> None:
    """Qwen3-Next-80B: 12 full-attention layers (every 4th of 48) of 2 KV heads x 256; 36 Gated-DeltaNet layers.

    Conv width ``2 x 16 x 128 + 32 x 128 = 8192`` over a ``K - 1 = 3`` window; ``_init_npu_conv_state``
    (§3.3) stores it ``(36, K + 1, 3, 8192)``, window first, where CUDA keeps ``(36, K + 1, 8192, 3)``
    (§1.7); SSM ``(32, 128, 128)`` float32 is the same on both.
    """
    config = text_config("plugins/mamba/presets/qwen3-next-80b-a3b-thinking.json")
    conv_dim = (
        2 * config["linear_num_key_heads"] * config["linear_key_head_dim"]
        + config["linear_num_value_heads"] * config["linear_value_head_dim"]
    )
    assert (conv_dim, config["linear_conv_kernel_dim"] - 1) == (8192, 3)
    pools = ascend_build("qwen3-next-80b-a3b-thinking")
    s = pools.plan.max_total_num_tokens
    slots = pools.plan.sizing.sglang_config["max_mamba_cache_size"] + 1
    full = pools.kv_pool.full.kv
    assert tuple(whole(full.k_buffer).shape) == (12, pages(s), P, 2, 256)
    assert tuple(whole(full.v_buffer).shape) == (12, pages(s), P, 2, 256)
    state = pools.req_to_token_pool.mamba_pool
    conv_views = [state.layer_cache(i)[0][0] for i in state.layer_ids]
    assert tuple(whole(conv_views).shape) == (36, slots, 3, 8192)
    assert tuple(state.conv[0].shape) == (36, slots, 8192, 3)  # SGLang's MambaPool.conv[0], canonical
    ssm_views = [state.layer_cache(i)[1] for i in state.layer_ids]
    assert tuple(whole(ssm_views).shape) == tuple(state.ssm.shape) == (36, slots, 32, 128, 128)
    assert state.ssm.dtype == torch.float32 and state.conv[0].dtype == torch.bfloat16


def test_deepseek_latent_rows_are_split_into_page_major_latent_and_rope() -> None:
    """DeepSeek-R1: 61 layers, ``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64 (config).

    ``NPUMLATokenToKVPool`` (§3.3): ``k_buffer (L, S // P + 1, P, 1, kv_lora_rank)`` and
    ``v_buffer (…, 1, qk_rope_head_dim)``: the core's page-major carving splits the row's column groups.
    """
    pools = ascend_build("deepseek-r1")
    s = pools.plan.max_total_num_tokens
    kv = pools.kv_pool
    assert tuple(whole(kv.nope_buffer).shape) == (61, pages(s), P, 1, 512)
    assert tuple(whole(kv.rope_buffer).shape) == (61, pages(s), P, 1, 64)


def test_kda_conv_is_already_window_first_so_the_npu_keeps_it() -> None:
    """Kimi-Linear's KDA conv rows are ``(K - 1, 3 x heads x dim)`` on every platform (§1.7): one layer-major tensor."""
    pools = ascend_build("kimi-linear-48b-a3b-instruct-nvfp4")
    state = pools.req_to_token_pool.mamba_pool
    conv = whole([state.layer_cache(i)[0][0] for i in state.layer_ids])
    assert tuple(conv.shape) == tuple(state.conv[0].shape) and conv.shape[2] == 3
    assert state.conv[0].is_contiguous()


@pytest.mark.parametrize(("memory", "tp_size"), [("17GiB", 1), ("23.3GiB", 2), ("71GiB", 8)])
@pytest.mark.parametrize(
    "preset", ["llama-3.1-70b", "gpt-oss-120b", "minimax-m3", "qwen3-next-80b-a3b-thinking", "deepseek-r1"]
)
def test_plans_are_page_aligned_so_every_budget_builds(preset: str, memory: str, tp_size: int) -> None:
    """Real plans hold whole pages (S + P rows), so the NPU's ``(S // P + 1) x P`` rows are the planned ones."""
    ascend_build(preset, serving=Serving(platform="ascend", page_size=P, tp_size=tp_size), memory=memory)


# -- only for ascend --------------------------------------------------------------


def test_cuda_plans_keep_the_core_layout_and_state_memory() -> None:
    """A plan for cuda is built as before: per-layer K / V, one contiguous ``(L, K + 1, C, K - 1)`` conv tensor."""
    result = plan("qwen3-next-80b-a3b-thinking", Serving(page_size=P), memory=MEMORY)
    pools = build(result, "meta")
    assert "buffer_layout" not in pools.provenance and pools.layout is PER_LAYER
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    state = pools.req_to_token_pool.mamba_pool
    assert state.conv[0].is_contiguous() and state.ssm.is_contiguous()
    assert tuple(state.conv[0].shape[2:]) == (8192, 3)


def test_the_hook_answers_for_ascend_plans_and_npu_devices_only() -> None:
    cuda = plan("llama-3.1-8b", Serving(page_size=P), memory="20GiB")
    ascend = plan("llama-3.1-8b", ASCEND, memory="20GiB")
    assert buffer_layout(cuda, "meta") is None and buffer_layout(cuda, "cuda:0") is None
    assert buffer_layout(ascend, "meta") is ASCEND_LAYOUT and buffer_layout(ascend, "cpu") is ASCEND_LAYOUT
    assert buffer_layout(cuda, "npu:0") is ASCEND_LAYOUT


# -- on the CPU: where a write lands ------------------------------------------------


def small_ascend_plan() -> Plan:
    return plan(build_mha_model(), ASCEND, memory=8 << 20)


def test_a_row_written_through_the_store_lands_at_layer_page_offset() -> None:
    """``k_buffer[layer][loc // P, loc % P]`` of the NPU tensor is what ``set_kv_buffer`` wrote at ``loc``."""
    pools = build(small_ascend_plan(), "cpu")
    pool = pools.kv_pool
    k_whole, v_whole = whole(pool.kv.k_buffer), whole(pool.kv.v_buffer)
    assert tuple(k_whole.shape) == (4, pool.size // P + 1, P, 4, 64)
    loc = torch.tensor([P, 300, pool.size + P - 1])
    k = torch.randn(3, 4, 64, dtype=torch.bfloat16)
    v = torch.randn(3, 4, 64, dtype=torch.bfloat16)
    pool.set_kv_buffer(2, loc, k, v)
    for i, slot in enumerate(loc.tolist()):
        assert torch.equal(k_whole[2, slot // P, slot % P], k[i])
        assert torch.equal(v_whole[2, slot // P, slot % P], v[i])
    assert int(k_whole[[0, 1, 3]].count_nonzero()) == 0  # other layers untouched
    assert torch.equal(pool.get_kv(2, loc)[0], k)


def test_a_conv_state_written_through_the_pool_lands_window_first() -> None:
    """The canonical ``(channels, window)`` row of slot ``s`` is ``(window, channels)`` in the NPU tensor (§3.3)."""
    serving = Serving(
        platform="ascend", page_size=P, accounting="sglang", max_mamba_cache_size=12, max_running_requests=8
    )
    pools = build(plan(parse(TINY, "tiny"), serving, memory=8 << 20), "cpu")
    assert pools.provenance["buffer_layout"] == ("ascend",)
    state = pools.req_to_token_pool.mamba_pool
    conv, ssm = state.layer_cache(2)
    channels = 2 * 2 * 8 + 4 * 8
    assert tuple(conv[0].shape) == (13, channels, 3)
    row = torch.randn(channels, 3, dtype=torch.bfloat16)
    conv[0][5] = row
    npu = npu_tensor(conv[0])
    assert tuple(npu.shape) == (2, 13, 3, channels) and npu.is_contiguous()
    assert torch.equal(npu[1, 5], row.T)  # layer 2 is the second state layer
    assert torch.equal(state.conv[0][1, 5], row)  # the stacked (layers, slots, C, W) view agrees
    ssm[5] = 1.0
    state.clear_slots(torch.tensor([5]))
    assert int(npu.count_nonzero()) == 0 and float(ssm[5].abs().sum()) == 0.0
    state.conv[0][0, 3] = row
    state.copy_from(torch.tensor([3]), torch.tensor([7]))
    assert torch.equal(npu[0, 7], row.T)


# -- refusals ------------------------------------------------------------------------


def request(rows: int, role: str = "k", row_shape: tuple[int, ...] = (8, 128), page_size: int = P) -> BufferRequest:
    return BufferRequest(
        pool="kv",
        role=role,
        rows=rows,
        page_size=page_size,
        layers=range(4),
        row_shape=row_shape,
        dtype=torch.bfloat16,
        device="meta",
    )


def test_rows_that_are_not_whole_pages_are_refused_before_allocating() -> None:
    """The NPU allocates ``(S // P + 1) x P`` rows: for ``S + P`` canonical rows with ``S`` unaligned, fewer bytes."""
    aligned, ragged = request(10 * P), request(10 * P + 3)
    assert ASCEND_LAYOUT.nbytes(aligned) == aligned.nbytes
    assert ASCEND_LAYOUT.nbytes(ragged) == 10 * P * 8 * 128 * 2 * 4 != ragged.nbytes
    with pytest.raises(PoolPlanMismatchError, match=r"under buffer layout 'ascend' \(kvpools_ascend"):
        check_layout_bytes(ASCEND_LAYOUT, [aligned, ragged])
    with pytest.raises(PoolPlanMismatchError, match=r"whole pages of 128 rows.*would allocate 1280, bytes the plan"):
        ASCEND_LAYOUT.allocate(ragged)


def test_state_roles_are_not_paged_and_conv_rows_must_be_channels_by_window() -> None:
    slots = 13  # not whole pages: state is indexed by slot
    for role in (CONV_ROLE, WINDOW_FIRST_CONV_ROLE, SSM_ROLE):
        state = request(slots, role, (40, 3), page_size=1)
        assert ASCEND_LAYOUT.nbytes(state) == state.nbytes
        views = allocate_buffers(ASCEND_LAYOUT, state)
        assert [tuple(v.shape) for v in views] == [(slots, 40, 3)] * 4
    assert (CONV_ROLE, WINDOW_FIRST_CONV_ROLE, SSM_ROLE) == (
        mamba_pool.CONV_ROLE,
        mamba_pool.WINDOW_FIRST_CONV_ROLE,
        mamba_pool.SSM_ROLE,
    )
    with pytest.raises(InvalidValueError, match=r"2-D \(channels, window\) rows"):
        ASCEND_LAYOUT.allocate(request(slots, CONV_ROLE, (4, 40, 3), page_size=1))


def test_npu_tensor_refuses_a_tensor_the_layout_did_not_carve() -> None:
    with pytest.raises(InvalidValueError, match=r"did not carve"):
        npu_tensor(torch.zeros(4, 2))


def test_speculative_decoding_on_a_hybrid_is_refused_for_ascend_only() -> None:
    """``_init_npu_conv_state`` widens the window by ``D - 1`` with speculative decoding: not planned, refused."""
    with pytest.raises(UnsupportedCombinationError, match=r"speculative_algorithm EAGLE on platform 'ascend'.*not"):
        plan("qwen3-next-80b-a3b-thinking", Serving(platform="ascend", page_size=P, **EAGLE), memory=MEMORY)
    plan("qwen3-next-80b-a3b-thinking", Serving(page_size=P, **EAGLE), memory=MEMORY)  # cuda: planned as before
    llama = plan("llama-3.1-8b", ASCEND, memory="20GiB").model
    assert validate_layouts(llama, Serving(platform="ascend", page_size=P, **EAGLE)) is None
