"""Issue 33's smaller modes, hand-computed from SGLang 0.5.23's code (the lines are cited per test).

The multimodal feature transport and the fp4 recipe names also run against SGLang's own sizing code
(``tests/oracle/test_dense_mha.py``, ``tests/mla/test_mla_oracle.py``).
"""

from __future__ import annotations

import pytest

from kvpools_core import Serving, build
from kvpools_core.dtypes import KV_DTYPE_CHOICES, resolve_kv_dtype
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.pools import DecodeReqToTokenPool

GiB = 1 << 30
MiB = 1 << 20


# -- the multimodal feature transport (ref-000 mm_runtime_reservation_gb, lines 156-173) ----------------------


@pytest.mark.parametrize(
    ("transport", "cache_mb", "reserved_mib"),
    [
        (None, 1024, 100),  # unset reads cpu: SGLANG_VLM_CACHE_SIZE_MB (100) only
        ("cpu", 1024, 100),
        ("cuda_ipc", 1024, 100 + 1024),  # + SGLANG_MM_FEATURE_CACHE_MB (1,024, environ.py line 1622)
        ("cuda_vmm", 1024, 100 + 1024),
        ("cuda_vmm", 3000, 100 + 3000),
    ],
)
def test_feature_transport_reserves_its_gpu_pool(transport: str | None, cache_mb: int, reserved_mib: int) -> None:
    serving = Serving(mm_feature_transport=transport, mm_feature_cache_mb=cache_mb)
    p = plan("gemma-3-12b-it", serving, free_memory="40GiB", weights_memory="20GiB")
    assert p.budget.reserved_bytes == reserved_mib * MiB
    # available 20 GiB - slack 40 GiB x (1 - 0.9) - reserved (ref-000 lines 2225-2247)
    assert p.budget.budget_bytes == 20 * GiB - 4 * GiB - reserved_mib * MiB


def test_feature_transport_reserves_nothing_for_a_text_model() -> None:
    """``if not is_multimodal: return 0.0`` (ref-000 line 163)."""
    p = plan("llama-3.1-8b", Serving(mm_feature_transport="cuda_ipc"), free_memory="40GiB", weights_memory="16GiB")
    assert p.budget.reserved_bytes == 0


def test_feature_cache_without_a_gpu_transport_is_refused() -> None:
    with pytest.raises(ConfigError, match="sizes the GPU feature pool of mm_feature_transport cuda_ipc or cuda_vmm"):
        Serving(mm_feature_cache_mb=2048)
    with pytest.raises(ConfigError, match="must be one of"):
        Serving(mm_feature_transport="nvlink")


# -- --enable-pd-role-switch (ref-000 _build_req_to_token_pool, lines 1003-1022) ------------------------------


def test_role_switch_builds_the_decode_request_table_on_a_prefill_node() -> None:
    """A flip-capable prefill takes ``DecodeReqToTokenPool`` with ``pre_alloc_size = extra_slots or 0``."""
    base = Serving(disaggregation_mode="prefill", disaggregation_decode_extra_slots=100, context_length=1000)
    plain = plan("llama-3.1-8b", base, memory="20GiB")
    switch = plan("llama-3.1-8b", Serving(**{**_fields(base), "enable_pd_role_switch": True}), memory="20GiB")
    requests = plain.max_running_requests
    assert switch.max_running_requests == requests  # the sizing files never read the flag
    row = (1000 + 4) * 4  # context + get_req_to_token_extra_context_len (4), int32
    assert plain.pool("req_to_token").bytes == (requests + 1) * row  # a prefill node ignores the extra slots
    assert switch.pool("req_to_token").bytes == (requests + 100 + 1) * row
    pools = build(switch, "meta")
    assert isinstance(pools.req_to_token_pool, DecodeReqToTokenPool)
    assert pools.req_to_token_pool.req_to_token.shape == (requests + 100 + 1, 1004)


def test_role_switch_without_extra_slots_pre_allocates_none() -> None:
    """``pre_alloc_size or 0``: SGLang's default extra slots are computed for a decode launch only."""
    serving = Serving(disaggregation_mode="prefill", enable_pd_role_switch=True, max_running_requests=16)
    assert serving.decode_extra_slots == 0 and serving.decode_request_pools
    decode = Serving(disaggregation_mode="decode", enable_pd_role_switch=True, max_running_requests=16)
    assert decode.decode_extra_slots == 32  # the decode launch's default, 2 x 16 (pd_disaggregation_hook.py)


def test_role_switch_raises_the_mamba_state_pool_like_a_decode_node() -> None:
    """``HybridMambaDecodeReqToTokenPool`` (``disaggregation/decode.py``) holds ``max(K, (requests + pre_alloc) x
    (1 + tracking slots))`` state slots, where the plain ``HybridReqToTokenPool`` of a prefill node holds K."""
    base = {"disaggregation_mode": "prefill", "max_running_requests": 8, "max_mamba_cache_size": 10}
    plain = plan("qwen3.5-35b-a3b", Serving(**base, disaggregation_decode_extra_slots=20), memory="20GiB")
    switch = plan(
        "qwen3.5-35b-a3b",
        Serving(**base, disaggregation_decode_extra_slots=20, enable_pd_role_switch=True),
        memory="20GiB",
    )
    requests = plain.max_running_requests
    assert switch.max_running_requests == requests == 3  # the state cache admits 10 // 3 (radix cache on)
    assert plain.pool("mamba_state").slots == 10
    assert switch.pool("mamba_state").slots == max(10, (3 + 20) * 1) == 23
    assert switch.pool("req_to_token").slots == 3 + 20
    assert any("PD role switch (the decode pool shape): 3 running + 20 pre-allocated" in n for n in switch.sizing.notes)
    pools = build(switch, "meta")
    assert pools.allocated_bytes == switch.planned_bytes


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"pp_size": 2}, "pp_size 2"),
        ({"tp_size": 8, "dcp_size": 8}, "dcp_size 8"),
        ({"speculative_algorithm": "EAGLE"}, "speculative_algorithm EAGLE"),
    ],
)
def test_role_switch_refuses_what_a_flip_does_not_rebuild(extra: dict[str, object], message: str) -> None:
    """``handle_pd_disaggregation`` (arg_groups/pd_disaggregation_hook.py lines 164-194)."""
    with pytest.raises(ConfigError, match=f"enable_pd_role_switch does not rebuild role-specific state for {message}"):
        Serving(disaggregation_mode="prefill", enable_pd_role_switch=True, **extra)


# -- the fp4 recipe names (kv_cache_dtype.py lines 76-88; fp4_kv_cache_quant_method.py) ------------------------


def test_fp4_recipe_names_are_choices() -> None:
    assert {"nvfp4", "fp4_mx_block16"} <= set(KV_DTYPE_CHOICES)
    for name in ("nvfp4", "fp4_mx_block16"):
        kv = resolve_kv_dtype(name, "bfloat16")
        assert kv.is_fp4 and kv.torch_dtype == "float4_e2m1fn_x2" and kv.scale_block == 16


def test_fp4_mx_block16_bytes_per_token() -> None:
    """``FP4MXBlock16KVCacheMethod.create_buffers``: K and V ``(m, H, D/2)`` uint8 plus ``(m, H x D / 16)`` uint8
    scales each, no dequant workspace (its accesses are PLAIN only).  Llama-3.1-8B, 32 layers x 8 KV heads x 128:
    data 2 x 32 x 8 x 64 = 32,768 B, scales 2 x 32 x 8 x 8 = 4,096 B."""
    p = plan("llama-3.1-8b", Serving(kv_cache_dtype="fp4_mx_block16"), memory="20GiB")
    assert p.cell.bytes_per_token == 36_864
    assert (
        p.cell.bytes_per_token
        == plan("llama-3.1-8b", Serving(kv_cache_dtype="fp4_e2m1"), memory="20GiB").cell.bytes_per_token
    )
    pools = build(p, "meta")
    assert pools.allocated_bytes == p.planned_bytes


def test_nvfp4_is_refused_for_mha_layers_with_the_reason() -> None:
    """A dense MHA model needs the GPU (tests/pools/test_nvfp4_mha.py plans it); other architectures' MHA-cell layers
    keep the refusal."""
    with pytest.raises(UnsupportedCombinationError, match="Pass nvfp4_sm 100 or 120"):
        plan("llama-3.1-8b", Serving(kv_cache_dtype="nvfp4"), memory="20GiB")
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model kv_cache_dtype nvfp4 on MHA layers"):
        plan("gpt-oss-20b", Serving(kv_cache_dtype="nvfp4"), memory="20GiB")


def test_nvfp4_on_an_mla_model_is_the_fp4_latent_pool() -> None:
    """MLA takes ``MLATokenToKVPoolFP4`` for any ``float4_e2m1fn_x2`` dtype (ref-000 lines 1290-1294): no quant
    method, so nvfp4 and fp4_mx_block16 are the same bytes."""
    serving = {"tp_size": 8}
    nv = plan("deepseek-v3", Serving(kv_cache_dtype="nvfp4", **serving), memory="40GiB")
    mx = plan("deepseek-v3", Serving(kv_cache_dtype="fp4_mx_block16", **serving), memory="40GiB")
    assert nv.cell.bytes_per_token == mx.cell.bytes_per_token
    # (512 + 64) / 2 + (512 + 64) / 16 = 324 B per layer, 61 layers
    assert nv.cell.bytes_per_token == 324 * 61


def _fields(serving: Serving) -> dict[str, object]:
    import attrs

    return {f.name: getattr(serving, f.name) for f in attrs.fields(Serving) if f.init}


# -- --prefill-only-disable-kv-cache (ref-000 lines 639-652, 963-1001, 2006-2010; NoOpMHATokenToKVPool) -------


PREFILL_ONLY = {"prefill_only_disable_kv_cache": True, "disable_radix_cache": True}


@pytest.mark.parametrize("accounting", ["exact", "sglang"])
def test_prefill_only_keeps_sglangs_tokens_and_builds_one_placeholder_page(accounting: str) -> None:
    """SGLang sizes the pool as usual (20 GiB / 131,072 B per token = 163,840 tokens for Llama-3.1-8B: 32 layers x
    8 KV heads x (128 + 128) x 2 B) and builds ``NoOpMHATokenToKVPool``: ``size`` kept for admission, K and V
    ``(page_size, heads, head_dim)`` placeholders per layer."""
    serving = Serving(**PREFILL_ONLY, accounting=accounting, page_size=16)
    p = plan("llama-3.1-8b", serving, memory="20GiB")
    assert p.max_total_num_tokens == 20 * GiB // 131_072 // 16 * 16 == 163_840
    assert p.pool("kv").bytes == 16 * 131_072  # one page of rows, every layer's K and V
    assert any("NoOpMHATokenToKVPool keeps SGLang's 163,840 tokens" in n for n in p.sizing.notes)
    pools = build(p, "meta")
    assert type(pools.kv_pool).__name__ == "NoOpMHATokenToKVPool"
    assert pools.kv_pool.size == 163_840
    assert tuple(pools.kv_pool.get_key_buffer(0).shape) == (16, 8, 128)
    assert pools.allocated_bytes == p.planned_bytes
    assert pools.allocator.available_size() == 163_840  # the allocator is real: admission by the token count
    with pytest.raises(RuntimeError, match="holds no KV"):
        pools.kv_pool.set_kv_buffer(0, None, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "model", ["deepseek-v3", "gpt-oss-20b", "qwen3.5-35b-a3b", "minimax-m3", "deepseek-v3.2", "deepseek-v4-flash"]
)
def test_prefill_only_refuses_every_other_pool_family(model: str) -> None:
    """``_validate_prefill_only_disable_kv_cache_pool_family``: MLA, DSA, SWA, hybrid linear, DeepSeek-V4; a
    MiniMax sparse pool fails SGLang's defensive check (not a NoOpMHATokenToKVPool)."""
    extra = {"tp_size": 8} if model.startswith("deepseek") else {}
    with pytest.raises(UnsupportedCombinationError, match="is supported for plain MHA models only"):
        plan(model, Serving(**PREFILL_ONLY, **extra), memory="60GiB")


def test_prefill_only_refuses_ascend_and_the_options_sglang_rejects() -> None:
    with pytest.raises(UnsupportedCombinationError, match="on CUDA"):
        plan("llama-3.1-8b", Serving(**PREFILL_ONLY, platform="ascend"), memory="20GiB")
    with pytest.raises(ConfigError, match="it needs disable_radix_cache"):
        Serving(prefill_only_disable_kv_cache=True)
    with pytest.raises(ConfigError, match="kv_cache_dtype fp4_mx_block16: the FP4 pool"):
        Serving(**PREFILL_ONLY, kv_cache_dtype="fp4_mx_block16")
    with pytest.raises(ConfigError, match="kv_cache_dtype mxfp8"):
        Serving(**PREFILL_ONLY, kv_cache_dtype="mxfp8")
    with pytest.raises(ConfigError, match="attn_cp_size 2"):
        Serving(**PREFILL_ONLY, tp_size=2, attn_cp_size=2)


# -- MiniMax-M3's fp8 indexer (ref-000 _build_minimax_sparse_kv_pool lines 1857-1861) ---------------------------


M3 = {"kv_cache_dtype": "fp8_e4m3", "tp_size": 8}


def test_m3_fp8_attn_gemm_stores_the_indexer_in_fp8() -> None:
    """``index_dtype = kv_cache_dtype if m3_fp8_attn_gemm_enabled else model_dtype``: MiniMax-M3's 57 sparse layers
    keep one 128-wide index key each (index values off), 57 x 128 x 2 B = 14,592 B per token in bf16, half in fp8."""
    bf16 = plan("minimax-m3", Serving(**M3), memory="40GiB")
    fp8 = plan("minimax-m3", Serving(**M3, m3_fp8_attn_gemm=True), memory="40GiB")
    assert bf16.pool("indexer").bytes_per_slot == 57 * 128 * 2 == 14_592
    assert fp8.pool("indexer").bytes_per_slot == 57 * 128 * 1 == 7_296
    assert fp8.max_total_num_tokens > bf16.max_total_num_tokens
    pools = build(fp8, "meta")
    assert pools.allocated_bytes == fp8.planned_bytes
    assert {t.dtype for t in pools.kv_pool.index_k_buffer.values()} == {__import__("torch").uint8}


def test_m3_fp8_attn_gemm_keeps_sglangs_estimate() -> None:
    """The configurator's MiniMax cell (ref-002 lines 224-261) charges the indexer in the model dtype either way, so
    ``--accounting sglang`` gives the same tokens (the pool it builds is then smaller than it charged)."""
    a = plan("minimax-m3", Serving(**M3, accounting="sglang"), memory="40GiB")
    b = plan("minimax-m3", Serving(**M3, accounting="sglang", m3_fp8_attn_gemm=True), memory="40GiB")
    assert a.max_total_num_tokens == b.max_total_num_tokens
    assert a.cell.sglang_bytes_per_token == b.cell.sglang_bytes_per_token == 29_952


def test_m3_fp8_attn_gemm_is_refused_off_fp8_e4m3_and_off_minimax() -> None:
    with pytest.raises(ConfigError, match="needs kv_cache_dtype fp8_e4m3"):
        Serving(m3_fp8_attn_gemm=True, kv_cache_dtype="fp8_e5m2")
    with pytest.raises(UnsupportedCombinationError, match="fp8 attention-GEMM mode of the sparse models"):
        plan("llama-3.1-8b", Serving(m3_fp8_attn_gemm=True, kv_cache_dtype="fp8_e4m3"), memory="20GiB")


# -- adaptive speculative decoding's draft-token maximum (max_speculative_num_draft_tokens) ---------------------


EAGLE_ONE = {"speculative_algorithm": "EAGLE", "speculative_draft_num_layers": 1, "context_length": 1000}


def test_adaptive_speculation_sizes_the_request_rows_for_the_largest_step() -> None:
    """Default adaptive config (``DEFAULT_ADAPTIVE_CONFIG``, candidate steps 0, 1, 3, 5, 7): SGLang resolves top-k 1,
    steps = the middle candidate 3 and draft tokens 3 + 1 = 4 (``_init_adaptive_speculative_params``), and sizes
    by ``max_speculative_num_draft_tokens()`` = 7 + 1 = 8 (``spec_info.py`` lines 268-289): the request row is
    context + 4 + 8 columns (``get_req_to_token_extra_context_len``, ``allocation_sizing.py`` line 105)."""
    p = plan("llama-3.1-8b", Serving(**EAGLE_ONE, speculative_adaptive=True), memory="20GiB")
    s = p.serving
    assert (s.speculative_eagle_topk, s.speculative_num_steps, s.speculative_num_draft_tokens) == (1, 3, 4)
    assert s.max_speculative_num_draft_tokens == 8
    assert p.pool("req_to_token").bytes_per_slot == (1000 + 4 + 8) * 4
    static = plan(
        "llama-3.1-8b",
        Serving(**EAGLE_ONE, speculative_eagle_topk=1, speculative_num_steps=3, speculative_num_draft_tokens=4),
        memory="20GiB",
    )
    assert static.pool("req_to_token").bytes_per_slot == (1000 + 4 + 4) * 4
    assert build(p, "meta").allocated_bytes == p.planned_bytes


def test_adaptive_config_file_and_its_refusals(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "adaptive.json"
    path.write_text('{"1": {"candidate_steps": [1, 4]}, "8": {"candidate_steps": [2]}, "ema_alpha": 0.2}')
    p = plan(
        "llama-3.1-8b",
        Serving(**EAGLE_ONE, speculative_adaptive=True, speculative_adaptive_config=str(path)),
        memory="20GiB",
    )
    # candidates 1, 2, 4: steps the middle one, 2; draft tokens 3; the maximum 4 + 1 = 5
    assert (p.serving.speculative_num_steps, p.serving.max_speculative_num_draft_tokens) == (2, 5)
    assert p.pool("req_to_token").bytes_per_slot == (1000 + 4 + 5) * 4
    with pytest.raises(ConfigError, match="is not in the adaptive config's candidate_steps"):
        plan(
            "llama-3.1-8b",
            Serving(
                **EAGLE_ONE, speculative_adaptive=True, speculative_num_steps=6, speculative_adaptive_config=str(path)
            ),
            memory="20GiB",
        )
    bad = tmp_path / "bad.json"
    bad.write_text('{"1": {"candidate_steps": [-1]}}')
    with pytest.raises(ConfigError, match="candidate_steps, a list of non-negative ints"):
        Serving(**EAGLE_ONE, speculative_adaptive=True, speculative_adaptive_config=str(bad))
    with pytest.raises(ConfigError, match="configures adaptive speculative decoding, which is off"):
        Serving(**EAGLE_ONE, speculative_adaptive_config=str(path))


def test_adaptive_falls_back_where_sglang_cannot_run_it() -> None:
    """``adaptive_unsupported_reason``: top-k above 1 (or NEXTN, or DP attention) keeps the static parameters."""
    s = Serving(**EAGLE_ONE, speculative_adaptive=True, speculative_eagle_topk=4, speculative_num_draft_tokens=8)
    assert not s.adaptive_speculation and s.max_speculative_num_draft_tokens == 8
    with pytest.raises(UnsupportedCombinationError, match="speculative_adaptive on hybrid linear-attention models"):
        plan("qwen3.5-35b-a3b", Serving(**EAGLE_ONE, speculative_adaptive=True), memory="20GiB")
