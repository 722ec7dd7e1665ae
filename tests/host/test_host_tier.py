"""The host KV tier against hand-computed SGLang HiCache sizes (``pool_host/base.py`` ``HostKVCache.__init__``).

Every expected number below is SGLang's arithmetic written out: requested
slots ``int(device_slots x ratio)`` or ``int(share x 1e9 // bytes_per_slot)``,
allocated ``(requested // page + 1) x page``, bytes ``slots x bytes_per_slot``,
with ``bytes_per_slot`` computed from the model's config by hand.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvpools_core import Plan, Serving
from kvpools_core.building import build
from kvpools_core.cli import main
from kvpools_core.errors import ConfigError, InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.pipeline.host import HICACHE_HOST_MEMORY_RESERVE_BYTES, measure_host_available

NODE = "4TiB"


def hicache(**kwargs: object) -> Serving:
    return Serving(enable_hierarchical_cache=True, **kwargs)  # type: ignore[arg-type]


def test_mha_ratio_and_size_hand_computed() -> None:
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 (K and V) x 2 B = 131,072 B per token.
    per_token = 2 * 32 * 8 * 128 * 2
    by_ratio = plan("llama-3.1-8b", hicache(page_size=64, max_total_tokens=64000), memory="40GiB", host_memory=NODE)
    assert by_ratio.pool("kv").slots == 64000
    host = by_ratio.host
    assert host is not None
    (kv,) = host.pools
    assert kv.bytes_per_slot == per_token
    assert kv.slots == (int(64000 * 2.0) // 64 + 1) * 64 == 128064
    assert kv.bytes == 128064 * per_token
    assert host.bytes_per_rank == kv.bytes and host.tokens == 128064

    by_size = plan(
        "llama-3.1-8b",
        hicache(page_size=64, max_total_tokens=64000, hicache_size=20, tp_size=2),
        memory="40GiB",
        host_memory=NODE,
    )
    assert by_size.host is not None
    (kv,) = by_size.host.pools
    per_rank_token = per_token // 2  # 4 KV heads per rank
    assert kv.slots == (int(20 * 1e9 // per_rank_token) // 64 + 1) * 64 == 305216
    assert kv.bytes == 305216 * per_rank_token
    assert by_size.host.ranks_per_node == 2
    assert by_size.host.bytes_per_node == 2 * kv.bytes


def test_mla_host_pool_mirrors_latent_rows() -> None:
    # DeepSeek-V3: 61 layers x (512 latent + 64 rope) x 2 B = 70,272 B per token.
    result = plan("deepseek-v3", hicache(max_total_tokens=64000, hicache_ratio=1.5), memory="40GiB", host_memory=NODE)
    assert result.host is not None
    (kv,) = result.host.pools
    assert kv.bytes_per_slot == 61 * 576 * 2 == 70272
    assert kv.slots == int(64000 * 1.5) + 1 == 96001
    assert kv.bytes == 96001 * 70272
    assert result.host_kv_bytes == kv.bytes and result.host_tokens == 96001


def test_sliding_window_pools_each_get_a_host_pool_and_split_the_size() -> None:
    # gpt-oss-20b: 12 full and 12 sliding layers, 8 KV heads x 64 x 2 (K, V) x 2 B = 2,048 B per layer.
    per_token = 12 * 2 * 8 * 64 * 2
    result = plan("gpt-oss-20b", hicache(page_size=16), memory="20GiB", host_memory=NODE)
    assert result.host is not None
    full, swa = result.pool("kv_full"), result.pool("kv_swa")
    host_full, host_swa = result.host.pool("kv_full"), result.host.pool("kv_swa")
    assert host_full.bytes_per_slot == host_swa.bytes_per_slot == per_token
    assert host_full.slots == (int(full.slots * 2.0) // 16 + 1) * 16
    assert host_swa.slots == (int(swa.slots * 2.0) // 16 + 1) * 16
    assert host_swa.token_space == "swa" and host_swa.device_slots == swa.slots

    sized = plan("gpt-oss-20b", hicache(page_size=16, hicache_size=30), memory="20GiB", host_memory=NODE)
    assert sized.host is not None
    total = full.bytes + swa.bytes  # SGLang's _split_hicache_size: shares by device bytes
    for pool, device in ((sized.host.pool("kv_full"), full), (sized.host.pool("kv_swa"), swa)):
        share = 30 * device.bytes / total
        assert pool.slots == (int(share * 1e9 // per_token) // 16 + 1) * 16
    assert sized.host.bytes_per_rank <= 30 * 10**9 + 2 * 16 * per_token


def test_mamba_host_pool_is_sized_apart_from_the_kv_host_pool() -> None:
    base = plan("qwen3.5-35b-a3b", Serving(), memory="20GiB")
    kv, state = base.pool("kv"), base.pool("mamba_state")
    # --hicache-size 40: one 40 GB budget split by device bytes (SGLang PR #32915), not 40 GB twice (#29034).
    sized = plan("qwen3.5-35b-a3b", hicache(hicache_size=40), memory="20GiB", host_memory=NODE)
    assert sized.host is not None
    host_kv, host_state = sized.host.pool("kv"), sized.host.pool("mamba_state")
    kv_share = 40 * kv.bytes / (kv.bytes + state.bytes)
    state_share = 40 * state.bytes / (kv.bytes + state.bytes)
    assert host_kv.slots == int(kv_share * 1e9 // kv.bytes_per_slot) + 1
    assert host_state.unit == "state_slot" and host_state.page_size == 1
    assert host_state.slots == int(state_share * 1e9 // state.bytes_per_slot) + 1
    assert sized.host.bytes_per_rank <= 40 * 10**9 + kv.bytes_per_slot + state.bytes_per_slot
    assert sized.host.bytes_per_rank > 39 * 10**9

    # --hicache-mamba-ratio: the state pool by its own ratio, the KV pool takes all of --hicache-size.
    ratio = plan("qwen3.5-35b-a3b", hicache(hicache_size=40, hicache_mamba_ratio=0.5), memory="20GiB", host_memory=NODE)
    assert ratio.host is not None
    assert ratio.host.pool("mamba_state").slots == int(state.slots * 0.5) + 1
    assert ratio.host.pool("kv").slots == int(40 * 1e9 // kv.bytes_per_slot) + 1


def test_mamba_host_pool_refuses_layer_first() -> None:
    with pytest.raises(ConfigError, match="page_first_direct only"):
        plan("qwen3.5-35b-a3b", hicache(hicache_mem_layout="layer_first"), memory="20GiB", host_memory=NODE)


def test_dsa_indexer_rides_on_the_latent_host_slots() -> None:
    result = plan("deepseek-v3.2", hicache(page_size=64), memory="20GiB", host_memory=NODE)
    assert result.host is not None
    kv, indexer = result.host.pool("kv"), result.host.pool("indexer")
    assert indexer.rides_on == "kv" and indexer.slots == kv.slots
    # DSAIndexerPoolHost: indexer_page_num = (size + page + 1) // page
    assert indexer.rows == (kv.slots + 64 + 1) // 64 * 64
    assert indexer.bytes == indexer.rows * result.pool("indexer").bytes_per_slot
    assert result.provenance["host_mirrors"] == ("dsa",)


def test_a_tier_beyond_the_node_is_refused_with_both_numbers_and_what_fits() -> None:
    serving = hicache(tp_size=8, hicache_ratio=2.5)
    with pytest.raises(InsufficientMemoryError) as refused:
        plan("llama-3.1-70b", serving, memory="100GiB", host_memory="1TB")
    text = str(refused.value)
    needed = plan("llama-3.1-70b", attrs_evolve(serving), memory="100GiB", host_memory="100TiB").host
    assert needed is not None
    assert f"{needed.bytes_per_node:,} B" in text and "1,000,000,000,000 B" in text
    usable = 10**12 - HICACHE_HOST_MEMORY_RESERVE_BYTES
    assert f"{usable:,} B" in text
    suggested = float(text.rsplit("hicache_ratio ", 1)[1].split()[0])
    fits = plan(
        "llama-3.1-70b", attrs_evolve(serving, hicache_ratio=suggested), memory="100GiB", host_memory="1TB"
    ).host
    assert fits is not None and fits.bytes_per_node <= usable
    with pytest.raises(InsufficientMemoryError):
        plan(
            "llama-3.1-70b",
            attrs_evolve(serving, hicache_ratio=round(suggested + 0.01, 2)),
            memory="100GiB",
            host_memory="1TB",
        )


def attrs_evolve(serving: Serving, **changes: object) -> Serving:
    import attrs

    return attrs.evolve(serving, **changes)  # type: ignore[arg-type]


def test_meta_build_of_the_host_pools_equals_the_plan() -> None:
    for model, serving in (
        ("llama-3.1-8b", hicache(page_size=64)),
        ("deepseek-v3.2", hicache(page_size=64)),
        ("gpt-oss-20b", hicache(page_size=16, hicache_size=30)),
        ("qwen3.5-35b-a3b", hicache(hicache_mamba_ratio=1.0)),
    ):
        result = plan(model, serving, memory="20GiB", host_memory=NODE)
        assert result.host is not None
        pools = build(result, "meta")
        assert pools.host_by_pool() == {pool.name: pool.bytes for pool in result.host.pools}
        assert pools.host_bytes == result.host.bytes_per_rank
        assert all(tensor.device.type == "meta" for tensor in pools.host.values())


def test_cpu_build_allocates_the_host_pools() -> None:
    result = plan("qwen3-8b", hicache(max_total_tokens=256), memory="1GiB", host_memory=NODE)
    pools = build(result, "cpu")
    assert result.host is not None
    assert pools.host_bytes == result.host.bytes_per_rank == 513 * result.pool("kv").bytes_per_slot
    assert all(tensor.device.type == "cpu" for tensor in pools.host.values())


def test_plan_json_round_trips_the_host_tier() -> None:
    result = plan("qwen3.5-35b-a3b", hicache(hicache_size=10), memory="20GiB", host_memory=NODE)
    loaded = Plan.from_json(result.to_json())
    assert loaded == result and loaded.host == result.host
    assert Plan.from_json(plan("llama-3.1-8b", Serving(), memory="1GiB").to_json()).host is None


def test_host_flags_need_the_hierarchical_cache() -> None:
    with pytest.raises(ConfigError, match="hicache_size"):
        Serving(hicache_size=10)
    with pytest.raises(ConfigError, match="host_memory"):
        plan("llama-3.1-8b", Serving(), memory="1GiB", host_memory="1TiB")
    with pytest.raises(ConfigError, match="nnodes"):
        Serving(tp_size=4, nnodes=3)


def test_nodes_share_the_ranks() -> None:
    one = plan("llama-3.1-8b", hicache(tp_size=8), memory="20GiB", host_memory=NODE).host
    two = plan("llama-3.1-8b", hicache(tp_size=8, nnodes=2), memory="20GiB", host_memory=NODE).host
    assert one is not None and two is not None
    assert one.ranks_per_node == 8 and two.ranks_per_node == 4
    assert two.bytes_per_node * 2 == one.bytes_per_node


def test_measured_host_memory_reads_meminfo_and_the_cgroup(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    cgroup.mkdir()
    (proc / "meminfo").write_text("MemTotal:       1000000 kB\nMemAvailable:    800000 kB\n")
    assert measure_host_available(proc, cgroup) == (800000 * 1024, "measured: /proc/meminfo MemAvailable")
    (cgroup / "memory.max").write_text(f"{600 * 1024**2}\n")
    (cgroup / "memory.current").write_text(f"{100 * 1024**2}\n")
    assert measure_host_available(proc, cgroup)[0] == 500 * 1024**2
    (cgroup / "memory.max").write_text("max\n")
    assert measure_host_available(proc, cgroup)[0] == 800000 * 1024
    with pytest.raises(ConfigError, match="host_memory"):
        measure_host_available(tmp_path / "missing", cgroup)


def test_cli_plan_json_and_refusal() -> None:
    runner = CliRunner()
    shown = runner.invoke(
        main,
        ["plan", "llama-3.1-8b", "--memory", "20GiB", "--enable-hierarchical-cache", "--host-memory", "1TiB", "--json"],
    )
    assert shown.exit_code == 0, shown.output
    summary = json.loads(shown.output)
    assert summary["host"]["bytes_per_rank"] == summary["plan"]["host"]["pools"][0]["bytes"]
    assert Plan.from_dict(summary).host is not None
    text = runner.invoke(
        main, ["plan", "llama-3.1-8b", "--memory", "20GiB", "--enable-hierarchical-cache", "--host-memory", "1TiB"]
    )
    assert "Host tier" in text.output and "per node" in text.output
    refused = runner.invoke(
        main,
        [
            "plan",
            "llama-3.1-70b",
            "--memory",
            "100GiB",
            "--tp-size",
            "8",
            "--enable-hierarchical-cache",
            "--hicache-ratio",
            "2.5",
            "--host-memory",
            "1TB",
        ],
    )
    assert refused.exit_code == 1
    assert "Traceback" not in refused.output and "--hicache-ratio" in refused.output


def test_a_host_mirrors_answer_is_checked_and_an_architecture_answer_wins() -> None:
    import types

    from kvpools_core import Registry, hookimpl
    from kvpools_core.errors import PluginResultError

    def registry_answering(answer: object) -> Registry:
        @hookimpl(tryfirst=True)
        def host_mirrors(plan: Plan) -> object:
            return answer

        module = types.ModuleType("fake_mirrors")
        module.host_mirrors = host_mirrors  # type: ignore[attr-defined]
        return Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"fake_mirrors": module})

    serving = hicache(page_size=64)
    with pytest.raises(PluginResultError, match="host_mirrors"):
        plan("llama-3.1-8b", serving, memory="20GiB", host_memory=NODE, registry=registry_answering({"kv": "nope"}))
    with pytest.raises(PluginResultError, match="host_mirrors"):
        plan("llama-3.1-8b", serving, memory="20GiB", host_memory=NODE, registry=registry_answering(["kv"]))
    with pytest.raises(ConfigError, match="does not have"):
        plan("llama-3.1-8b", serving, memory="20GiB", host_memory=NODE, registry=registry_answering({"kvv": None}))
    # Only the KV pool, mirrored: the same host pool the core's default makes, answered by the plugin.
    mirrored = plan(
        "llama-3.1-8b", serving, memory="20GiB", host_memory=NODE, registry=registry_answering({"kv": None})
    )
    assert mirrored.provenance["host_mirrors"] == ("fake_mirrors",)
    default = plan("llama-3.1-8b", serving, memory="20GiB", host_memory=NODE)
    assert mirrored.host == default.host and default.provenance["host_mirrors"] == ("core",)


def test_dp_replicas_without_dp_attention_share_the_node() -> None:
    replicas = plan("llama-3.1-8b", hicache(tp_size=2, dp_size=2), memory="20GiB", host_memory=NODE).host
    attention = plan(
        "llama-3.1-8b", hicache(tp_size=2, dp_size=2, enable_dp_attention=True), memory="20GiB", host_memory=NODE
    ).host
    assert replicas is not None and attention is not None
    assert replicas.ranks_per_node == 4 and attention.ranks_per_node == 2


def test_v_rows_narrower_than_k_rows_are_refused() -> None:
    # MiMo-V2-Flash: K 192, V 128; SGLang's MHA host pool allocates V at the K width.
    with pytest.raises(UnsupportedCombinationError, match="K 192 / V 128"):
        plan("mimo-v2-flash", hicache(), memory="20GiB", host_memory=NODE)


def test_cpu_build_refuses_a_host_tier_beyond_this_machine() -> None:
    result = plan("qwen3-8b", hicache(max_total_tokens=256, hicache_size=10**6), memory="1GiB", host_memory="100000TB")
    with pytest.raises(InsufficientMemoryError, match="Building the host tier"):
        build(result, "cpu")


def test_cli_build_meta_reports_the_host_pools() -> None:
    out = CliRunner().invoke(
        main,
        [
            "build",
            "qwen3.5-35b-a3b",
            "--device",
            "meta",
            "--memory",
            "20GiB",
            "--enable-hierarchical-cache",
            "--hicache-size",
            "40",
            "--host-memory",
            "1TiB",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    host = json.loads(out.output)["host"]
    assert host["matches_plan"] and host["allocated_bytes"] == host["planned_bytes"]
    assert set(host["allocated_by_pool"]) == {"kv", "mamba_state"}


GiB = 1 << 30


def test_auto_sizing_lowers_the_default_ratio_to_the_node_hand_computed() -> None:
    """SGLang 0.5.23 with --enable-hierarchical-cache alone (``auto_size_hicache``): ratio = min(2.0, budget x 0.95
    / device bytes), budget = int((available - 10 GiB) // ranks_per_host x 0.8)."""
    serving = hicache(page_size=64, max_total_tokens=64000, tp_size=8)
    result = plan("llama-3.1-8b", serving, memory="40GiB", host_memory="25GiB")
    host = result.host
    assert host is not None and host.auto_sized
    per_rank_token = 2 * 32 * 1 * 128 * 2  # one KV head per rank at TP 8
    device_bytes = (64000 + 64) * per_rank_token
    assert result.pool("kv").bytes == device_bytes
    budget = int((25 * GiB - 10 * GiB) // 8 * 0.8)
    ratio = min(2.0, budget * (1 - 0.05) / device_bytes)
    assert 1 < ratio < 2  # the node, not the default, decides
    assert host.hicache_ratio == ratio
    (kv,) = host.pools
    assert kv.slots == (int(64000 * ratio) // 64 + 1) * 64
    assert host.bytes_per_node <= 25 * GiB - 10 * GiB
    assert host.notes[0].startswith(f"HiCache auto-sizing: ratio 2.000 -> {ratio:.3f}; ")
    # the same node refuses SGLang's default ratio when it is asked for explicitly
    with pytest.raises(InsufficientMemoryError, match=r"hicache_ratio 1\.91 fits"):
        plan("llama-3.1-8b", hicache(page_size=64, max_total_tokens=64000, tp_size=8, hicache_ratio=2.0),
             memory="40GiB", host_memory="25GiB")  # fmt: skip
    # a roomy node keeps 2.0; a lower fraction lowers the ratio in proportion
    roomy = plan("llama-3.1-8b", serving, memory="40GiB", host_memory=NODE).host
    assert roomy is not None and roomy.hicache_ratio == 2.0 and roomy.auto_sized
    half = plan(
        "llama-3.1-8b",
        hicache(page_size=64, max_total_tokens=64000, tp_size=8, hicache_host_memory_fraction=0.4),
        memory="40GiB",
        host_memory="25GiB",
    ).host
    assert half is not None and half.hicache_ratio == int((25 * GiB - 10 * GiB) // 8 * 0.4) * 0.95 / device_bytes


def test_auto_sizing_counts_every_mirrored_device_pool() -> None:
    """``_estimate_hicache_bytes``: the SWA hybrid's full and SWA pools both scale with the ratio."""
    result = plan("gpt-oss-20b", hicache(page_size=64), memory="20GiB", host_memory="30GiB")
    host = result.host
    assert host is not None and host.auto_sized
    device_bytes = sum(result.pool(pool.device_pool).bytes for pool in host.pools)
    assert len(host.pools) == 2
    assert host.hicache_ratio == min(2.0, int((30 * GiB - 10 * GiB) * 0.8) * 0.95 / device_bytes)


def test_auto_sizing_without_host_memory_is_sglangs_error() -> None:
    with pytest.raises(InsufficientMemoryError, match="No host memory is left for HiCache"):
        plan("llama-3.1-8b", hicache(), memory="40GiB", host_memory="8GiB")


def test_explicit_ratio_or_size_turns_auto_sizing_off() -> None:
    by_ratio = plan("llama-3.1-8b", hicache(hicache_ratio=1.5), memory="40GiB", host_memory=NODE).host
    by_size = plan("llama-3.1-8b", hicache(hicache_size=10), memory="40GiB", host_memory=NODE).host
    assert by_ratio is not None and (by_ratio.hicache_ratio, by_ratio.auto_sized) == (1.5, False)
    assert by_size is not None and (by_size.hicache_ratio, by_size.auto_sized) == (None, False)
    with pytest.raises(ConfigError, match="hicache_host_memory_fraction"):
        Serving(hicache_host_memory_fraction=0.5)


def test_auto_sized_ratio_in_the_report_and_json() -> None:
    args = ["plan", "llama-3.1-8b", "--tp-size", "8", "--enable-hierarchical-cache", "--memory", "40GiB"]
    args += ["--host-memory", "25GiB"]
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    words = " ".join(text.output.split())  # rich wraps at the test console's width
    assert "HiCache auto-sizing: ratio 2.000 -> " in words and "auto-sized to the node" in words
    data = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)["host"]
    assert data["auto_sized"] is True and 0 < data["hicache_ratio"] < 2
    (pool,) = data["pools"]
    assert pool["slots"] == int(pool["device_slots"] * data["hicache_ratio"]) + 1
