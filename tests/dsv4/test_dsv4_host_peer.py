"""DeepSeek-V4's host tier against SGLang 0.5.23's own ``build_deepseek_v4_hicache_stack`` (issue 33).

``sglang_dsv4_host_peer.py`` runs, in the peers venv, the installed stack builder of
``srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py`` unchanged over the device pool kvpools builds on ``meta``
(its layer buffers' shapes, the layouts, the kv_source layers), with ``bytes_per_page_padded`` from SGLang's own
``KVLayout.page_bytes``; every mirror it hands a host pool class (pages, layers, item bytes) must be the host pool
kvpools plans, for the V4, V4.1, V4.1-new / fp4, uniform fp8 (trtllm) layouts and the ratio-1/2 pools.  Skips
without the peers venv (fails under ``KVPOOLS_REQUIRE_SHARED=1``), as every peer test.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import Serving, build
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan, PlatformTraits
from tests.oracle import locate

PYTHON, _BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_dsv4_host_peer.py")
V41 = str(Path(__file__).with_name("configs") / "dsv41_synthetic.json")
FLASH = "deepseek-v4-flash"
B200 = PlatformTraits(platform="cuda", compute_capability=(10, 0))
# SGLang's PoolName values -> kvpools' host pool names
NAMES = {
    "kv": "kv",
    "swa": "kv_swa",
    "deepseek_v4_c4": "kv_c4",
    "deepseek_v4_c4_indexer": "indexer_c4",
    "deepseek_v4_c4_state": "c4_state",
    "deepseek_v4_c4_indexer_state": "c4_indexer_state",
    "deepseek_v4_c128": "kv_c128",
    "deepseek_v4_c1": "kv_c1",
    "deepseek_v4_c1_indexer": "indexer_c1",
    "deepseek_v4_c2": "kv_c2",
    "deepseek_v4_c2_indexer": "indexer_c2",
}


def _rows(rows: Any) -> dict[str, Any] | None:
    if rows is None:
        return None
    return {
        "layout": rows.layout.name,
        "page_size": rows.page_size,
        "buffers": [list(rows.kv_buffer[layer].shape) for layer in sorted(rows.kv_buffer)],
    }


def _case(p: Plan) -> dict[str, Any]:
    """One rank's device pool as kvpools builds it on ``meta``, in the terms SGLang's stack builder reads."""
    pool = build(p, "meta").kv_pool
    config = p.sizing.sglang_config
    ratios = [int(layer.params.get("compress_ratio", 0)) for layer in p.model.layers]
    sources = [int(i) for i in p.model.params.get("kv_source_layer_ids", ())]
    low = {r: [i for i in sources if ratios[i] == r] for r in (1, 2)}
    ix = pool.indexer
    return {
        "page_size": p.serving.page_size,
        "hicache_ratio": p.serving.hicache_ratio_or_default,
        "full_tokens": config["full_max_total_num_tokens"],
        "swa_tokens": config["swa_max_total_num_tokens"],
        "ratios": ratios,
        "start_layer": pool.start_layer,
        "end_layer": pool.end_layer,
        "swa": _rows(pool.swa_kv_pool),
        "c4": _rows(pool.c4_kv_pool),
        "c128": _rows(pool.c128_kv_pool),
        "indexer_c4": {
            "page_size": ix.page_size,
            "buffers": [
                list(ix.index_k_with_scale_buffer[layer].shape) for layer in sorted(ix.index_k_with_scale_buffer)
            ],
        }
        if ix.index_k_with_scale_buffer
        else None,
        # an MTP draft packed into kv_swa rides in params.mtp_draft_device_pools (a sidecar is another builder's)
        "draft_swa": _rows(pool.draft_swa_kv_pool) if p.host is not None and p.host.pool("kv_swa").packed else None,
        "sources_by_ratio": {str(r): layers for r, layers in low.items() if layers},
        "low_kv": {str(r): _rows(rows) for r, rows in pool.low_ratio_kv_pools.items()},
        "low_index": {
            str(r): {"page_size": 64, "buffers": [list(buffers[layer].shape) for layer in sorted(buffers)]}
            for r, buffers in pool.low_ratio_index_pools.items()
        },
    }


def _hicache(**options: object) -> Serving:
    return Serving(enable_hierarchical_cache=True, hicache_ratio=1.5, **options)  # type: ignore[arg-type]


CASES = {
    "v4": (FLASH, _hicache(tp_size=4)),
    "v41": (FLASH, _hicache(tp_size=4, dsv4_kv_layout="v41")),
    "v41-new-fp4": (FLASH, _hicache(tp_size=4, dsv4_kv_layout="v41_new", dsv4_compressed_kv_layout="fp4")),
    "trtllm": (FLASH, _hicache(tp_size=4, dsv4_attn_backend="trtllm", platform_traits=B200)),
    "low-ratio-v41": (V41, _hicache(platform_traits=B200)),
    "low-ratio-v41-new": (V41, _hicache(platform_traits=B200, dsv4_kv_layout="v41_new")),
    "low-ratio-v4": (V41, _hicache()),
    "v41-mtp-draft": (
        FLASH,
        _hicache(
            tp_size=4,
            dsv4_kv_layout="v41",
            speculative_algorithm="EAGLE",
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            speculative_draft_num_layers=1,
        ),
    ),
    "low-ratio-trtllm": (V41, _hicache(platform_traits=B200, dsv4_attn_backend="trtllm")),
}


def test_host_pools_are_build_deepseek_v4_hicache_stacks() -> None:
    plans = {name: plan(model, serving, memory="40GiB", host_memory="4TiB") for name, (model, serving) in CASES.items()}
    done = subprocess.run(
        [str(PYTHON), str(PEER)],
        input=json.dumps([_case(p) for p in plans.values()]),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for (name, p), sglang in zip(plans.items(), json.loads(done.stdout), strict=True):
        assert "error" not in sglang, (name, sglang)
        assert p.host is not None
        ours = {pool.name: pool for pool in p.host.pools}
        entries = [(NAMES[entry], record) for entry, record in sglang["entries"]]
        assert [n for n, _ in entries] == [pool.name for pool in p.host.pools], name
        if name == "v41-mtp-draft":  # the NextN draft layer packed after the target's 43 (mtp_swa_device_buffers)
            assert dict(entries)["kv_swa"]["layers"] == 43 + 1 and ours["kv_swa"].packed == ("draft_kv_swa",)
        for pool_name, record in entries:
            host = ours[pool_name]
            if record["kind"] == "logical":  # the anchor: full pages x P slots, no bytes
                assert (host.slots, host.bytes) == (record["size"], 0), (name, pool_name)
                continue
            pages = host.slots // host.page_size
            assert pages == record["num_host_pages"], (name, pool_name)
            if record["kind"] == "paged":
                assert host.bytes == record["num_host_pages"] * record["layers"] * record["item_bytes"], (
                    name,
                    pool_name,
                    record,
                )
            else:  # a state mirror: SGLang's page count and layers (its row bytes come from the device views)
                assert host.bytes % (pages * record["layers"]) == 0, (name, pool_name)


@pytest.mark.parametrize("name", ["low-ratio-v41"])
def test_the_pair_state_is_never_mirrored(name: str) -> None:
    model, serving = CASES[name]
    p = plan(model, serving, memory="40GiB", host_memory="4TiB")
    assert p.host is not None
    assert "c2_pair_state" in {pool.name for pool in p.pools}
    assert "c2_pair_state" not in {pool.name for pool in p.host.pools}


def test_a_bundled_dspark_draft_is_packed_into_kv_swa(tmp_path: Path) -> None:
    """DSPARK with a checkpoint that bundles a DSpark head (``dspark_block_size`` in the target config): SGLang loads
    the draft as ``DeepseekV4ForCausalLMDSpark`` (``configs/model_config.py`` L1041-1060) and
    ``_can_pack_hicache_mtp`` packs its SWA layer into the target's ``kv_swa`` (``HiCacheDraftMode.PACKED``):
    43 + 1 layers, no ``draft_kv_swa`` sidecar; without the head it is a sidecar of the same pages."""
    preset = Path(__file__).parents[2] / "plugins/dsv4/presets/deepseek-v4-flash.json"
    bundled = tmp_path / "deepseek-v4-flash-dspark.json"
    bundled.write_text(json.dumps({**json.loads(preset.read_text()), "dspark_block_size": 8}))
    serving = _hicache(
        tp_size=8,
        max_running_requests=64,
        speculative_algorithm="DSPARK",
        speculative_draft_num_layers=1,
        speculative_num_draft_tokens=8,
    )
    packed = plan(str(bundled), serving, memory="40GiB", host_memory="4TiB")
    sidecar = plan(FLASH, serving, memory="40GiB", host_memory="4TiB")
    assert packed.host is not None and sidecar.host is not None
    ours = {pool.name: pool for pool in packed.host.pools}
    assert ours["kv_swa"].packed == ("draft_kv_swa",) and "draft_kv_swa" not in ours
    assert "draft_kv_swa" in {pool.name for pool in sidecar.host.pools}
    # the same bytes, in SGLang's structure
    assert sum(pool.bytes for pool in packed.host.pools) == sum(pool.bytes for pool in sidecar.host.pools)
    done = subprocess.run(
        [str(PYTHON), str(PEER)], input=json.dumps([_case(packed)]), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    [sglang] = json.loads(done.stdout)
    assert "error" not in sglang, sglang
    entries = dict((NAMES[entry], record) for entry, record in sglang["entries"])
    assert list(entries) == [pool.name for pool in packed.host.pools]
    assert entries["kv_swa"]["layers"] == 43 + 1
    swa = entries["kv_swa"]
    assert ours["kv_swa"].bytes == swa["num_host_pages"] * swa["layers"] * swa["item_bytes"]
