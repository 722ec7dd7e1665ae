"""A PD decode node's retraction backup host pool (SGLang 0.5.23 ``resolve_decode_retraction_backup``).

Hand-computed against ``mem_cache/kv_cache_builder.py``: the backup-only ratio
is ``max(0.2, ceil_align(min(max_context_len - 1, size), page) / size)``, then
``auto_size_hicache`` lowers it to the node; the pools are HiCache's.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from kvpools_core import Serving
from kvpools_core.building import build
from kvpools_core.cli import main
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.pipeline import plan

GiB = 1 << 30


def decode(**kwargs: object) -> Serving:
    return Serving(disaggregation_mode="decode", **kwargs)  # type: ignore[arg-type]


def test_host_pool_backup_ratio_is_one_fifth_of_the_device_pool() -> None:
    result = plan(
        "llama-3.1-8b",
        decode(tp_size=4, disaggregation_decode_retraction_backup="host_pool"),
        memory="40GiB",
        host_memory="100GiB",
    )
    host = result.host
    assert host is not None and host.retraction_backup and host.auto_sized
    size = result.max_total_num_tokens
    max_context_len = 131072 + 4  # the request table's row: context + 4
    assert max(0.2, min(max_context_len - 1, size) / size) == 0.2
    assert host.hicache_ratio == 0.2  # the node (18 GiB a rank at fraction 0.8) holds it
    (kv,) = host.pools
    per_rank_token = 2 * 32 * 2 * 128 * 2  # 2 KV heads per rank at TP 4
    assert kv.bytes_per_slot == per_rank_token
    assert kv.slots == int(size * 0.2) + 1
    assert host.bytes_per_node == 4 * kv.slots * per_rank_token
    # no HiCache: the write-through note is about HiCache's per-page copies, not a retraction pool's
    assert not any("write_through" in note for note in host.notes)
    pools = build(result, "meta")
    assert pools.host_by_pool() == {"kv": kv.bytes}


def test_small_device_pool_takes_one_whole_request() -> None:
    """With fewer device tokens than one request at the context length, the host pool holds one request:
    ratio = ceil_align(size, page) / size = 1 at a page-aligned size."""
    serving = decode(page_size=64, context_length=32768, disaggregation_decode_retraction_backup="host_pool")
    result = plan("llama-3.1-8b", serving, memory="2GiB", host_memory="1TiB")
    size = result.max_total_num_tokens
    assert size < 32768 and size % 64 == 0
    host = result.host
    assert host is not None
    assert host.hicache_ratio == math.ceil(min(32768 + 4 - 1, size) / 64) * 64 / size == 1.0
    (kv,) = host.pools
    assert kv.slots == (int(size * 1.0) // 64 + 1) * 64


def test_sliding_window_hybrid_mirrors_both_pools() -> None:
    result = plan(
        "gpt-oss-20b",
        decode(page_size=16, disaggregation_decode_retraction_backup="host_pool"),
        memory="20GiB",
        host_memory="1TiB",
    )
    host = result.host
    full = result.sizing.sglang_config["full_max_total_num_tokens"]
    # the full pool is SGLang's kv_cache.size; one 131,072-token request (row 131,076) fills 28% of it
    ratio = max(0.2, math.ceil(min(131072 + 4 - 1, full) / 16) * 16 / full)
    assert host is not None and host.hicache_ratio == ratio and 0.28 < ratio < 0.29
    assert {pool.name for pool in host.pools} == {pool.name for pool in result.pools if pool.kind == "kv"}
    for pool in host.pools:
        assert pool.slots == (int(pool.device_slots * ratio) // 16 + 1) * 16


def test_explicit_ratio_turns_auto_sizing_off() -> None:
    serving = decode(disaggregation_decode_retraction_backup="host_pool", hicache_ratio=0.5)
    host = plan("llama-3.1-8b", serving, memory="40GiB", host_memory="1TiB").host
    assert host is not None and (host.hicache_ratio, host.auto_sized) == (0.5, False)


@pytest.mark.parametrize("model", ["deepseek-v3", "qwen3-next-80b-a3b-thinking"])
def test_host_pool_refused_where_sglang_refuses_it(model: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match="requires an MHA or hybrid-SWA HiCache host stack"):
        plan(model, decode(tp_size=8, disaggregation_decode_retraction_backup="host_pool"), memory="40GiB")


def test_unset_backup_is_stated_not_planned() -> None:
    dense = plan("llama-3.1-8b", decode(tp_size=4), memory="40GiB")
    assert dense.host is None
    (note,) = [n for n in dense.sizing.notes if n.startswith("decode retraction backup")]
    assert "picks host_pool" in note and "ratio 0.2 " in note
    latent = plan("deepseek-v3", decode(tp_size=8), memory="40GiB")
    (note,) = [n for n in latent.sizing.notes if n.startswith("decode retraction backup")]
    assert "picks cpu_tensor" in note and "not an MHA or hybrid-SWA pool" in note
    cpu_tensor = plan("llama-3.1-8b", decode(disaggregation_decode_retraction_backup="cpu_tensor"), memory="40GiB")
    assert cpu_tensor.host is None and not any(n.startswith("decode retraction") for n in cpu_tensor.sizing.notes)
    shared = plan("llama-3.1-8b", decode(enable_hierarchical_cache=True), memory="40GiB", host_memory="1TiB")
    assert shared.host is not None and not shared.host.retraction_backup
    assert any("sharing the HiCache host pools" in n for n in shared.sizing.notes)
    prefill = plan("llama-3.1-8b", Serving(disaggregation_mode="prefill"), memory="40GiB")
    assert not any(n.startswith("decode retraction") for n in prefill.sizing.notes)


def test_rocm_keeps_host_pool_opt_in() -> None:
    pytest.importorskip("kvpools_rocm")
    result = plan("llama-3.1-8b", decode(platform="rocm"), memory="40GiB")
    (note,) = [n for n in result.sizing.notes if n.startswith("decode retraction backup")]
    assert "picks cpu_tensor" in note and "rocm platform keeps host_pool opt-in" in note


def test_flag_belongs_to_a_decode_node() -> None:
    with pytest.raises(ConfigError, match="applies to a decode node only"):
        Serving(disaggregation_decode_retraction_backup="host_pool")
    with pytest.raises(ConfigError, match="must be one of"):
        decode(disaggregation_decode_retraction_backup="disk")
    with pytest.raises(ConfigError, match="enable_hierarchical_cache"):
        decode(hicache_ratio=0.5)  # no host tier to size without host_pool


def test_cli_plans_and_reports_the_backup_pool() -> None:
    args = ["plan", "llama-3.1-8b", "--disaggregation-mode", "decode", "--tp-size", "4", "--memory", "40GiB"]
    args += ["--disaggregation-decode-retraction-backup", "host_pool", "--host-memory", "100GiB"]
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert "Host tier (decode retraction backup, a HiCache pool)" in text.output
    data = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)["host"]
    assert data["retraction_backup"] is True and data["hicache_ratio"] == 0.2
    refused = CliRunner().invoke(main, ["plan", "deepseek-v3", *args[2:]])
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert "requires an MHA or hybrid-SWA HiCache host stack" in refused.output
