"""The host tier for DeepSeek-V4, speculative drafts and DCP (issue 20), against hand-computed SGLang sizes.

DeepSeek-V4: ``build_deepseek_v4_hicache_stack`` (``hybrid_cache/hybrid_pool_assembler.py``) counts host pages
from the device pages (``int(ceil(tokens / P) x ratio)``) in padded DSV4 pages; drafts:
``_build_hicache_draft_plan`` packs an MTP draft into the target's host rows and gives any other draft a
sidecar on the target's host slots; DCP: ``HostKVCache`` keeps physical rows, ``dcp_size`` logical tokens each.
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from kvpools_core import Plan, Serving
from kvpools_core.building import build
from kvpools_core.cli import main
from kvpools_core.errors import ConfigError, InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.values import HostPool

NODE = "4TiB"
V4 = "deepseek-v4-flash"
ROW = 448 + 64 * 2 + 448 // 64 + 1
"""One packed DSV4 row: fp8 nope 448 + bf16 rope 64 x 2 + one scale per 64 nope + one pad = 584 B."""


def hicache(**kwargs: object) -> Serving:
    return Serving(enable_hierarchical_cache=True, **kwargs)  # type: ignore[arg-type]


def padded(tokens: int) -> int:
    """``ceil_div(tokens x 584, 576) x 576``: one padded DSV4 page of ``tokens`` rows."""
    return -(-tokens * ROW // 576) * 576


def test_deepseek_v4_host_pools_hand_computed() -> None:
    result = plan(V4, hicache(page_size=256, hicache_ratio=1.5), memory="60GiB", host_memory=NODE)
    kinds = [layer.params.get("compress_ratio", 0) for layer in result.model.layers]
    layers, c4, c128 = len(kinds), kinds.count(4), kinds.count(128)
    assert (layers, c4, c128) == (43, 21, 20)
    config = result.sizing.sglang_config
    full, swa = config["full_max_total_num_tokens"], config["swa_max_total_num_tokens"]
    full_pages = int(-(-full // 256) * 1.5)
    swa_pages = int(-(-swa // 256) * 1.5)
    host = result.host
    assert host is not None and result.provenance["host_pools"] == ("dsv4",)
    assert [p.name for p in host.pools] == [
        "kv",
        "kv_swa",
        "kv_c4",
        "indexer_c4",
        "c4_state",
        "c4_indexer_state",
        "kv_c128",
    ]
    anchor = host.pool("kv")
    assert anchor.bytes == 0 and anchor.slots == full_pages * 256 and host.tokens == full_pages * 256
    assert padded(256) == 149760 and padded(64) == 37440 and padded(2) == 1728
    expected = {
        "kv_swa": swa_pages * layers * 149760,
        "kv_c4": full_pages * c4 * 37440,
        "indexer_c4": full_pages * c4 * 64 * (128 + 4),  # fp8 keys + one fp32 scale per 128, unpadded
        "c4_state": swa_pages * c4 * 8 * (4 * 512 * 4),  # ring 8 x (2 x (1 + overlap) x 512) fp32
        "c4_indexer_state": swa_pages * c4 * 8 * (4 * 128 * 4),
        "kv_c128": full_pages * c128 * 1728,
    }
    assert {p.name: p.bytes for p in host.pools if p.bytes} == expected
    unused = {
        "kv_swa": swa_pages * layers * (149760 - 256 * ROW),
        "kv_c4": full_pages * c4 * (37440 - 64 * ROW),
        "kv_c128": full_pages * c128 * (1728 - 2 * ROW),
    }
    assert {p.name: p.unused_bytes for p in host.pools if p.unused_bytes} == unused
    assert host.unused_bytes_per_rank == sum(unused.values())
    assert host.bytes_per_rank == sum(expected.values())


def test_deepseek_v4_mtp_draft_is_packed_into_the_swa_host_pool() -> None:
    plain = plan(V4, hicache(hicache_ratio=2.0, page_size=256), memory="60GiB", host_memory=NODE)
    drafted = plan(
        V4,
        # SGLang asserts EAGLE (or DSPARK) with top-k 1 on DeepSeek-V4, before NEXTN would alias to EAGLE
        hicache(
            hicache_ratio=2.0,
            page_size=256,
            speculative_algorithm="EAGLE",
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            speculative_draft_num_layers=1,
        ),
        memory="60GiB",
        host_memory=NODE,
    )
    assert plain.host is not None and drafted.host is not None
    swa = drafted.host.pool("kv_swa")
    pages = int(-(-drafted.sizing.sglang_config["swa_max_total_num_tokens"] // 256) * 2.0)
    assert swa.packed == ("draft_kv_swa",)
    assert swa.bytes == pages * (43 + 1) * 149760  # mtp_swa_device_buffers after the target's layers
    assert "draft_kv_swa" not in [p.name for p in drafted.host.pools]


def test_deepseek_v4_refuses_hicache_size_with_sglangs_reason() -> None:
    with pytest.raises(
        UnsupportedCombinationError,
        match=re.escape(
            "'DeepSeek V4 HiCache currently does not support --hicache-size; use --hicache-ratio instead.'"
        ),
    ):
        plan(V4, hicache(page_size=256, hicache_size=100), memory="60GiB", host_memory=NODE)


def test_deepseek_v4_meta_build_and_json_round_trip() -> None:
    result = plan(V4, hicache(hicache_ratio=2.0, page_size=256), memory="60GiB", host_memory=NODE)
    assert result.host is not None
    pools = build(result, "meta")
    assert pools.host_by_pool() == {pool.name: pool.bytes for pool in result.host.pools}
    assert Plan.from_json(result.to_json()).host == result.host


def test_deepseek_v4_cpu_build_allocates_the_paged_host_pools() -> None:
    # at DeepSeek-V4's default ratio 0.1, 2,048 full tokens leave the SWA pool under one page: give 0.8
    serving = hicache(
        hicache_ratio=2.0,
        page_size=256,
        max_total_tokens=2048,
        max_running_requests=2,
        context_length=2048,
        swa_full_tokens_ratio=0.8,
    )
    result = plan(V4, serving, memory="60GiB", host_memory=NODE)
    assert result.host is not None
    pools = build(result, "cpu")
    assert pools.host_by_pool() == {pool.name: pool.bytes for pool in result.host.pools}
    full_pages = int(2048 // 256 * 2.0)
    assert tuple(pools.host["kv"].shape) == (full_pages, 0)  # the anchor: page indices, no bytes
    assert tuple(pools.host["kv_c128"].shape) == (full_pages, 20 * 1728)


def test_deepseek_v4_node_check_suggests_a_ratio_that_fits() -> None:
    with pytest.raises(InsufficientMemoryError) as refused:
        plan(V4, hicache(page_size=256, hicache_ratio=4), memory="60GiB", host_memory="100GB")
    ratio = float(str(refused.value).rsplit("hicache_ratio ", 1)[1].split()[0])
    fits = plan(V4, hicache(page_size=256, hicache_ratio=ratio), memory="60GiB", host_memory="100GB").host
    assert fits is not None and fits.bytes_per_rank <= 100 * 10**9 - 10 * 1024**3


def test_paged_host_pool_values_are_checked() -> None:
    with pytest.raises(Exception, match="paged host pool"):
        HostPool(
            name="x",
            device_pool="x",
            unit="token",
            device_slots=1,
            page_size=4,
            slots=8,
            rows=8,
            bytes_per_slot=0,
            bytes=100,
            layout="page_first",
            page_bytes=30,
        )


def test_sidecar_draft_rides_on_the_target_host_slots() -> None:
    # llama-3.1-8b EAGLE, one draft layer: 8 KV heads x 128 x (K + V) x 2 B = 4,096 B per token.
    serving = hicache(page_size=64, speculative_algorithm="EAGLE", speculative_draft_num_layers=1)
    result = plan("llama-3.1-8b", serving, memory="40GiB", host_memory=NODE)
    host = result.host
    assert host is not None
    kv, draft = host.pool("kv"), host.pool("draft_kv")
    assert kv.bytes_per_slot == 131072 and kv.packed == ()
    assert kv.slots == (int(result.pool("kv").slots * 2.0) // 64 + 1) * 64
    # build_full_draft_pools: host_token_capacity = the target's host slots, no padding page, no size share.
    assert draft.rides_on == "kv" and draft.slots == kv.slots and draft.bytes == kv.slots * 4096
    assert result.provenance["host_mirrors"] == ("core", "speculative")


def test_nextn_draft_is_packed_into_the_latent_host_rows() -> None:
    # DeepSeek-V3 NEXTN: one MTP layer of 576 x 2 B packed after 61 target layers: 70,272 + 1,152 B per token.
    ratio = plan("deepseek-v3", hicache(speculative_algorithm="NEXTN"), memory="40GiB", host_memory=NODE)
    assert ratio.host is not None
    (kv,) = ratio.host.pools
    assert kv.packed == ("draft_kv",) and kv.bytes_per_slot == 70272 + 1152
    assert kv.slots == int(ratio.pool("kv").slots * 2.0) + 1
    sized = plan(
        "deepseek-v3", hicache(speculative_algorithm="NEXTN", hicache_size=50), memory="40GiB", host_memory=NODE
    )
    assert sized.host is not None
    # host_size: int(50e9 // size_per_token), the packed draft layer inside size_per_token.
    assert sized.host.pool("kv").slots == int(50 * 1e9 // 71424) + 1


def test_dsa_drafts_pack_and_ride_with_the_indexer() -> None:
    packed = plan(
        "deepseek-v3.2", hicache(page_size=64, speculative_algorithm="NEXTN"), memory="40GiB", host_memory=NODE
    )
    assert packed.host is not None
    assert packed.host.pool("indexer").packed == ("draft_indexer",)
    assert packed.host.pool("indexer").bytes_per_slot == 8052 + 132
    sidecar = plan(
        "deepseek-v3.2",
        hicache(page_size=64, speculative_algorithm="EAGLE3", speculative_draft_num_layers=1),
        memory="40GiB",
        host_memory=NODE,
    )
    assert sidecar.host is not None
    kv, draft_indexer = sidecar.host.pool("kv"), sidecar.host.pool("draft_indexer")
    # DSAIndexerPoolHost on the draft host pool: (size + page + 1) // page pages of 64.
    assert draft_indexer.rows == (kv.slots + 64 + 1) // 64 * 64 and draft_indexer.rides_on == "kv"
    assert sidecar.host.pool("draft_kv").slots == kv.slots


def test_meta_build_of_draft_host_pools_equals_the_plan() -> None:
    for model, serving in (
        ("llama-3.1-8b", hicache(page_size=64, speculative_algorithm="EAGLE", speculative_draft_num_layers=1)),
        ("deepseek-v3.2", hicache(page_size=64, speculative_algorithm="NEXTN")),
    ):
        result = plan(model, serving, memory="20GiB", host_memory=NODE)
        assert result.host is not None
        assert build(result, "meta").host_by_pool() == {pool.name: pool.bytes for pool in result.host.pools}


def test_dcp_keeps_physical_host_rows_and_logical_tokens() -> None:
    result = plan("deepseek-v3", hicache(tp_size=8, dcp_size=8, page_size=64), memory="40GiB", host_memory=NODE)
    host = result.host
    assert host is not None
    (kv,) = host.pools
    # HostKVCache: page_size // dcp_size of the widened page = --page-size; size from the physical device slots.
    assert kv.slots == (int(result.pool("kv").slots * 2.0) // 64 + 1) * 64
    assert host.dcp_size == 8 and host.tokens == kv.slots * 8


def test_dcp_on_an_mha_host_pool_is_refused_with_sglangs_assert() -> None:
    with pytest.raises(UnsupportedCombinationError, match="only wired for the MLA host pool"):
        plan("llama-3.1-8b", hicache(tp_size=8, dcp_size=8), memory="20GiB", host_memory=NODE)
    with pytest.raises(UnsupportedCombinationError, match="sidecar draft host pool"):
        plan(
            "deepseek-v3",
            hicache(tp_size=8, dcp_size=8, speculative_algorithm="EAGLE3", speculative_draft_num_layers=1),
            memory="40GiB",
            host_memory=NODE,
        )


def test_a_sidecar_draft_deeper_than_the_stage_is_refused() -> None:
    serving = hicache(pp_size=32, speculative_algorithm="EAGLE", speculative_draft_num_layers=2)
    with pytest.raises(UnsupportedCombinationError, match="Draft HiCache layers exceed the target transfer stages"):
        plan("llama-3.1-8b", serving, memory="40GiB", host_memory=NODE)


def test_packed_into_answers_are_checked() -> None:
    import types

    from kvpools_core import Registry, hookimpl
    from kvpools_core.errors import PluginResultError
    from kvpools_core.values import PackedInto

    def registry_answering(answer: object) -> Registry:
        @hookimpl(tryfirst=True)
        def host_mirrors(plan: Plan) -> object:
            return answer

        module = types.ModuleType("fake_packing")
        module.host_mirrors = host_mirrors  # type: ignore[attr-defined]
        return Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"fake_packing": module})

    serving = hicache(speculative_algorithm="NEXTN")
    with pytest.raises(PluginResultError, match="packed into"):
        plan(
            "deepseek-v3",
            serving,
            memory="40GiB",
            host_memory=NODE,
            registry=registry_answering({"draft_kv": PackedInto("kv")}),
        )
    with pytest.raises(ConfigError, match="packed rows must share"):
        plan(
            "deepseek-v3",
            serving,
            memory="40GiB",
            host_memory=NODE,
            registry=registry_answering({"kv": None, "req_to_token": PackedInto("kv")}),
        )


def test_cli_plan_deepseek_v4_host_tier() -> None:
    out = CliRunner().invoke(
        main,
        [
            "plan",
            V4,
            "--page-size",
            "256",
            "--memory",
            "60GiB",
            "--enable-hierarchical-cache",
            "--hicache-ratio",
            "2",
            "--host-memory",
            "4TiB",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    host = summary["host"]
    assert host["unused_bytes_per_rank"] == sum(pool["unused_bytes"] for pool in host["pools"]) > 0
    assert {pool["name"] for pool in host["pools"]} >= {"kv", "kv_swa", "kv_c4", "kv_c128"}
    text = CliRunner().invoke(
        main,
        [
            *("plan", V4, "--page-size", "256", "--memory", "60GiB", "--enable-hierarchical-cache"),
            *("--hicache-ratio", "2", "--host-memory", "4TiB"),
        ],
    )
    assert text.exit_code == 0, text.output
    assert "never hold data" in text.output
    auto = CliRunner().invoke(
        main,
        ["plan", V4, "--page-size", "256", "--memory", "60GiB", "--enable-hierarchical-cache", "--host-memory", "4TiB"],
    )
    # SGLang's auto-sizing (no --hicache-ratio, no --hicache-size) refuses DeepSeek-V4's host pools
    assert auto.exit_code == 1 and "HiCache auto-sizing does not support" in auto.output
    assert "--hicache-ratio 2" in auto.output and "Traceback" not in auto.output
    refused = CliRunner().invoke(
        main,
        ["plan", V4, "--page-size", "256", "--memory", "60GiB", "--enable-hierarchical-cache", "--hicache-size", "9"],
    )
    assert refused.exit_code == 1 and "--hicache-ratio" in refused.output and "Traceback" not in refused.output
