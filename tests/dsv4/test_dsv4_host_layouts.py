"""DeepSeek-V4's host tier (``--enable-hierarchical-cache``) beyond the V4 layout (issue 33): hand-computed bytes.

SGLang 0.5.23 ``srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py``: ``_deepseek_v4_num_host_pages`` (L647-676:
``int(ceil(device tokens / P) x ratio)``), ``build_deepseek_v4_hicache_stack`` (L946-1248: every paged mirror is a
``DeepSeekV4PagedHostPool`` whose ``item_bytes`` is the device pool's ``bytes_per_page_padded``, so the layout
carries over) and ``_dsv4_low_ratio_entries`` / ``_dsv4_low_ratio_regions`` (L805-891: the ratio-1/2 KV and fp4
indexer mirrors, ``full_host_pages`` pages each).  Page bytes: ``kernels/ops/attention/dsv4/kv_layout.py``
(``KVLayout.page_bytes``: V4.1 528 B a token padded to 512 B, interleaved 528 B; V4.1-fp4 288 B padded to 256 B,
interleaved 288 B) and ``DeepSeekV4UniformFP8KVPool.create_buffer`` (``page_size x 512`` B, unpadded).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpools_core import Serving, build
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan, PlatformTraits

NODE = "4TiB"
FLASH = "deepseek-v4-flash"
V41 = str(Path(__file__).with_name("configs") / "dsv41_synthetic.json")
"""8 layers, ratios [0, 1, 2, 1, 4, 128, 2, 0] (+ MTP 0), kv_source_layer_ids [1, 2]: one c4, one c128, one
ratio-1 source (layer 1) and one ratio-2 source (layer 2)."""
B200 = PlatformTraits(platform="cuda", compute_capability=(10, 0))
"""An SM100 GPU: ``select_dsv4_kv_layout``'s ``auto`` is V4.1 there, and ``trtllm`` is allowed."""


def _hicache(**options: object) -> Serving:
    return Serving(enable_hierarchical_cache=True, hicache_ratio=2.0, **options)  # type: ignore[arg-type]


def _pages(p: Plan) -> tuple[int, int]:
    """``(full_host_pages, swa_host_pages)``: ``int(ceil(tokens / 256) x 2.0)`` (L655-667)."""
    c = p.sizing.sglang_config
    return (
        int(-(-c["full_max_total_num_tokens"] // 256) * 2.0),
        int(-(-c["swa_max_total_num_tokens"] // 256) * 2.0),
    )


def _host(p: Plan) -> dict[str, tuple[int, int]]:
    assert p.host is not None
    return {pool.name: (pool.bytes, pool.unused_bytes) for pool in p.host.pools}


def _state_bytes(swa_pages: int, c4_layers: int, ring: int) -> dict[str, tuple[int, int]]:
    """The c4 states' mirrors: swa pages x c4 layers x ring x (4 x 512 / 4 x 128) fp32 (layout-free)."""
    return {
        "c4_state": (swa_pages * c4_layers * ring * 4 * 512 * 4, 0),
        "c4_indexer_state": (swa_pages * c4_layers * ring * 4 * 128 * 4, 0),
    }


def _built_on_meta(p: Plan) -> None:
    assert p.host is not None
    assert build(p, "meta").host_by_pool() == {pool.name: pool.bytes for pool in p.host.pools}


def test_v41_host_mirrors_take_the_v41_pages() -> None:
    """deepseek-v4-flash (43 layers, 21 c4, 20 c128) with ``--dsv4-kv-layout v41``: SWA pages 256 x 528 =
    135,168 B (264 x 512, no pad), c4 64 x 528 = 33,792 B, c128 2 x 528 = 1,056 B padded to 1,536 B."""
    p = plan(FLASH, _hicache(tp_size=4, dsv4_kv_layout="v41"), memory="60GiB", host_memory=NODE)
    full, swa = _pages(p)
    assert _host(p) == {
        "kv": (0, 0),
        "kv_swa": (swa * 43 * 135_168, 0),
        "kv_c4": (full * 21 * 33_792, 0),
        "indexer_c4": (full * 21 * 64 * 132, 0),  # the fp8 indexer page does not depend on the KV layout
        **_state_bytes(swa, 21, 8),
        "kv_c128": (full * 20 * 1_536, full * 20 * (1_536 - 2 * 528)),
    }
    _built_on_meta(p)


def test_v41_new_with_fp4_compressed_host_mirrors() -> None:
    """``v41_new`` + ``fp4``: the interleaved SWA page 256 x 528 is a multiple of 528; the fp4 c4 page
    64 x 288 = 18,432 B and the c128 page 2 x 288 = 576 B are multiples of 288: nothing padded."""
    serving = _hicache(tp_size=4, dsv4_kv_layout="v41_new", dsv4_compressed_kv_layout="fp4")
    p = plan(FLASH, serving, memory="60GiB", host_memory=NODE)
    full, swa = _pages(p)
    assert _host(p) == {
        "kv": (0, 0),
        "kv_swa": (swa * 43 * 135_168, 0),
        "kv_c4": (full * 21 * 18_432, 0),
        "indexer_c4": (full * 21 * 8_448, 0),
        **_state_bytes(swa, 21, 8),
        "kv_c128": (full * 20 * 576, 0),
    }
    _built_on_meta(p)


def test_low_ratio_host_mirrors_on_sm100() -> None:
    """DeepSeek-V4.1 on an SM100 GPU (``auto``: V4.1 main, V4.1-fp4 for ratios 1 / 2): after the c128 mirror,
    ``_dsv4_low_ratio_entries`` adds per low ratio its KV pages (ratio 1: 256 x 288 = 73,728 B; ratio 2:
    128 x 288 = 36,864 B) and its fp4 indexer keys of one full page (256 / 128 slots x (128 / 2 + 128 / 32) =
    68 B: 17,408 / 8,704 B), ``full_host_pages`` pages x the one source layer each; no pair-state mirror."""
    p = plan(V41, _hicache(platform_traits=B200), memory="40GiB", host_memory=NODE)
    full, swa = _pages(p)
    assert p.host is not None
    assert [pool.name for pool in p.host.pools][-4:] == ["kv_c1", "indexer_c1", "kv_c2", "indexer_c2"]
    assert _host(p) == {
        "kv": (0, 0),
        "kv_swa": (swa * 8 * 135_168, 0),
        "kv_c4": (full * 1 * 33_792, 0),
        "indexer_c4": (full * 1 * 8_448, 0),
        **_state_bytes(swa, 1, 8),
        "kv_c128": (full * 1 * 1_536, full * (1_536 - 1_056)),
        "kv_c1": (full * 73_728, 0),
        "indexer_c1": (full * 256 * 68, 0),
        "kv_c2": (full * 36_864, 0),
        "indexer_c2": (full * 128 * 68, 0),
    }
    assert "c2_pair_state" in {pool.name for pool in p.pools}  # built on the device, never mirrored
    _built_on_meta(p)


def test_low_ratio_host_mirrors_in_the_v4_layout() -> None:
    """Off SM100 ``auto`` is V4, and the ratio-1/2 caches follow it (``resolve_compressed_kv_layout``): a ratio-1
    page is 256 x 584 = 149,504 B padded to 149,760 B (260 x 576), a ratio-2 page 128 x 584 = 74,752 B padded to
    74,880 B; the pinned padding is the host pools' ``unused_bytes``."""
    p = plan(V41, _hicache(), memory="40GiB", host_memory=NODE)
    full, _ = _pages(p)
    host = _host(p)
    assert host["kv_c1"] == (full * 149_760, full * 256)
    assert host["kv_c2"] == (full * 74_880, full * 128)
    assert host["indexer_c1"] == (full * 17_408, 0) and host["indexer_c2"] == (full * 8_704, 0)
    _built_on_meta(p)


def test_trtllm_uniform_fp8_host_mirrors() -> None:
    """``--dsv4-attn-backend trtllm``: the mirrors copy ``DeepSeekV4UniformFP8KVPool`` pages of
    ``page_size x 512`` B (SWA 131,072 B, c4 32,768 B, c128 1,024 B), with no padding anywhere."""
    p = plan(FLASH, _hicache(tp_size=4, dsv4_attn_backend="trtllm", platform_traits=B200), memory="60GiB",
             host_memory=NODE)  # fmt: skip
    full, swa = _pages(p)
    assert _host(p) == {
        "kv": (0, 0),
        "kv_swa": (swa * 43 * 131_072, 0),
        "kv_c4": (full * 21 * 32_768, 0),
        "indexer_c4": (full * 21 * 8_448, 0),
        **_state_bytes(swa, 21, 8),
        "kv_c128": (full * 20 * 1_024, 0),
    }
    assert p.host is not None and p.host.unused_bytes_per_rank == 0
    _built_on_meta(p)


def test_dspark_with_trtllm_keeps_uniform_draft_rows() -> None:
    """DSPARK under ``trtllm`` (no encoder replay): the draft worker's pool takes the same branch of
    ``DeepSeekV4TokenToKVPool.__init__`` as the target's, so its SWA rows are uniform fp8 too (512 B, pages of
    256 x 512 B), plus DSpark's ``swa_valid_from`` (65 request slots x 8 B)."""
    serving = Serving(
        tp_size=8,
        page_size=256,
        max_running_requests=64,
        speculative_algorithm="DSPARK",
        speculative_draft_num_layers=1,
        speculative_num_draft_tokens=8,
        dsv4_attn_backend="trtllm",
        platform_traits=B200,
    )
    p = plan(FLASH, serving, memory="40GiB")
    swa = p.sizing.sglang_config["swa_max_total_num_tokens"]
    # _num_dsv4_physical_kv_pages(swa, 256, 256) = ceil((swa + 256) / 256) pages of 131,072 B, one draft layer
    assert p.pool("draft_kv_swa").bytes == -(-(swa + 256) // 256) * 131_072
    assert p.pool("draft_swa_valid_from").bytes == 65 * 8
    assert build(p, "meta").allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools}


NO_RADIX = (
    "'The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive and cannot be used at the "
    "same time. Please use only one of them.'"
)
DCP_MLA = (
    "'HiCache with --dcp-size > 1 is only supported for MLA models: the index translation lives in "
    "MLATokenToKVPoolHost, and the MHA host pool has none.'"
)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # validate_hisparse asserts --disable-radix-cache; handle_cache_compatibility (kv_cache_hook.py L393-397)
        # refuses it with HiCache
        ({"enable_hisparse": True, "disable_radix_cache": True}, NO_RADIX),
        ({"disable_radix_cache": True}, NO_RADIX),
        # resolve_hicache_dcp_compatibility (hicache_hook.py L157-162): DeepSeek-V4's ModelConfig is MHA
        ({"dcp_size": 2, "tp_size": 4}, DCP_MLA),
    ],
    ids=["hisparse", "no-radix", "dcp"],
)
def test_host_tier_refusals_are_sglangs(options: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match=re.escape(message)) as refused:
        plan(FLASH, _hicache(page_size=256, **options), memory="60GiB", host_memory=NODE)
    assert "SGLang refuses enable_hierarchical_cache" in str(refused.value)
    assert "kvpools does not model" not in str(refused.value)
