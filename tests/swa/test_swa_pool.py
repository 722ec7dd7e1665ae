"""The SWA KV pool built from plans: presets on meta with exact bytes, real tensors on CPU, the CLI report."""

from __future__ import annotations

import json
import subprocess

import attrs
import pytest
import torch
from kvpools_plugins.swa.allocator import PureSWAAllocator, SWATokenToKVPoolAllocator
from kvpools_plugins.swa.pool import SWAKVPool

from kvpools_core.building import build
from kvpools_core.pipeline import plan
from kvpools_core.pools.kv import PoolPlanMismatchError
from kvpools_core.values import Serving

from .test_swa_config import PRESETS

GiB = 1 << 30
MiB = 1 << 20
DENSE_IN_SGLANG = ("gemma-2-9b", "gemma-3-12b-it", "gemma-3-27b-it", "mistral-7b-v0.1")


@pytest.mark.parametrize("accounting", ("exact", "sglang"))
@pytest.mark.parametrize("preset", PRESETS)
def test_presets_plan_and_build_on_meta_with_exact_bytes(preset: str, accounting: str) -> None:
    for serving in (
        Serving(accounting=accounting),
        Serving(accounting=accounting, tp_size=4, page_size=64, kv_cache_dtype="fp8_e4m3"),
        Serving(accounting=accounting, tp_size=2, page_size=16, kv_cache_dtype="mxfp8"),
        Serving(accounting=accounting, kv_cache_dtype="fp4_e2m1", pp_size=2, pp_rank=1),
        Serving(
            accounting=accounting,
            page_size=16,
            max_running_requests=32,
            disable_radix_cache=True,
            speculative_algorithm="EAGLE",
            speculative_draft_num_layers=1,
            speculative_num_steps=2,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=3,
        ),
    ):
        # Llama-4's 8192-token chunk window: the chunk-capped case (32 requests) needs 40.04 GiB of SWA pool alone,
        # which kvpools refuses in 40 GiB (InsufficientMemoryError), so it gets 80 GiB.
        memory = (80 if preset == "llama-4-maverick" else 40) * GiB
        p = plan(preset, serving, memory=memory)
        if accounting == "exact":
            assert p.planned_bytes <= memory
        pools = build(p, "meta")
        assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools}
        assert pools.allocated_bytes == p.planned_bytes
        # SGLang 0.5.23 serves Gemma-2/3 and Mistral with one dense pool (tests/swa/test_swa_oracle.py): under its
        # accounting the swa plugin builds that pool (MHATokenToKVPool) and leaves the allocator to the core
        dense = accounting == "sglang" and preset in DENSE_IN_SGLANG
        assert pools.provenance["build_pool"] == ("swa",)
        assert pools.provenance["build_allocator"] == (("core",) if dense else ("swa",))
        assert ("kv_swa" in {pool.name for pool in p.pools}) != dense


def test_hybrid_pool_on_cpu_translates_sliding_layers() -> None:
    """gpt-oss-20b at a small budget: layer 0 slides, layer 1 is full; writes through full slot ids land in the
    SWA store at the mapped rows, and read back (fp8 round trip included)."""
    for kv in ("bf16", "fp8_e4m3"):
        p = plan(
            "gpt-oss-20b",
            Serving(page_size=4, kv_cache_dtype=kv, max_running_requests=4, context_length=64),
            memory=64 * MiB,
        )
        pools = build(p, "cpu")
        pool, alloc = pools.kv_pool, pools.allocator
        assert isinstance(pool, SWAKVPool) and isinstance(alloc, SWATokenToKVPoolAllocator)
        assert alloc.full_to_swa_index_mapping is pool.full_to_swa_index_mapping
        loc = alloc.alloc_extend(torch.tensor([0]), torch.tensor([6]), torch.tensor([-1]), 6)
        assert loc is not None
        k = torch.randn(6, 8, 64).to(torch.bfloat16)
        v = torch.randn(6, 8, 64).to(torch.bfloat16)
        for layer in (0, 1):
            pool.set_kv_buffer(layer, loc, k, v)
            got_k, got_v = pool.get_kv(layer, loc)
            tol = 0.07 if kv == "fp8_e4m3" else 0
            torch.testing.assert_close(got_k.float(), k.float(), atol=tol * 8, rtol=tol)
            torch.testing.assert_close(got_v.float(), v.float(), atol=tol * 8, rtol=tol)
        swa_rows = pool.translate_loc_from_full_to_swa(loc)
        assert pool.is_swa_layer(0) and not pool.is_swa_layer(1)
        assert bool((swa_rows > 0).all()) and int(swa_rows.max()) < pool.size_swa + 4  # inside the SWA store
        stored = pool.swa_kv_pool.get_kv(0, swa_rows)[0]  # the SWA store itself, at the translated rows
        torch.testing.assert_close(stored.float(), pool.get_kv(0, loc)[0].float())
        assert int(pool.full_to_swa_index_mapping[-1]) == -1


def test_all_swa_pool_has_no_mapping_and_the_pure_allocator() -> None:
    p = plan("mistral-7b-v0.1", Serving(page_size=16, context_length=256, max_running_requests=2), memory=64 * MiB)
    pools = build(p, "cpu")
    assert isinstance(pools.allocator, PureSWAAllocator)
    assert pools.kv_pool.full_kv_pool is None and pools.kv_pool.full_to_swa_index_mapping is None
    loc = torch.tensor([16, 17])
    assert pools.kv_pool.translate_loc_from_full_to_swa(loc) is loc
    assert set(pools.allocated_by_pool()) == {"kv_swa", "req_to_token", "allocator"}


def test_pipeline_stage_holds_its_own_layers() -> None:
    """PP 2, rank 1 of gpt-oss-20b: layers 12..23 (6 full, 6 SWA); a layer of rank 0 is refused by name."""
    p = plan("gpt-oss-20b", Serving(pp_size=2, pp_rank=1), memory=20 * GiB)
    pool = build(p, "meta").kv_pool
    assert pool.full_attention_layer_ids == [13, 15, 17, 19, 21, 23]
    assert pool.swa_attention_layer_ids == [12, 14, 16, 18, 20, 22]
    with pytest.raises(IndexError, match="Layer 3 is not in this SWA pool"):
        pool.get_key_buffer(3)


def test_draft_store_and_a_tampered_plan() -> None:
    serving = Serving(page_size=16, speculative_algorithm="EAGLE3", speculative_draft_num_layers=2)
    p = plan("mimo-v2-flash", serving, memory=20 * GiB)
    pool = build(p, "meta").kv_pool
    assert pool.draft is not None and pool.draft.rows == p.max_total_num_tokens + 16
    assert pool.draft.layers[0].heads == 4 and pool.draft.layer_num == 2  # a full layer's geometry
    tampered = attrs.evolve(
        p,
        sizing=attrs.evolve(
            p.sizing, pools=[attrs.evolve(x, bytes=x.bytes - 1) if x.name == "kv_swa" else x for x in p.pools]
        ),
    )
    with pytest.raises(PoolPlanMismatchError, match="kv_swa"):
        build(tampered, "meta")


def test_cli_shows_both_pools_and_the_split(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = subprocess.run(
        [kvpools_exe, "plan", "gpt-oss-120b", "--memory", "60GiB", "--page-size", "16"],
        capture_output=True,
        text=True,
        env=cli_env,
        check=True,
    ).stdout
    for text in (
        "kv_full",
        "kv_swa",
        "full_to_swa",
        "swa_allocator",
        "full_max_total_num_tokens",
        "swa_max_total_num_tokens",
        "--swa-full-tokens-ratio 0.8 split the budget",
        "size_pools: swa",
    ):
        assert text in out, text
    summary = json.loads(
        subprocess.run(
            [
                kvpools_exe,
                "plan",
                "gpt-oss-120b",
                "--memory",
                "60GiB",
                "--page-size",
                "16",
                "--accounting",
                "sglang",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=cli_env,
            check=True,
        ).stdout
    )
    assert (summary["full_max_total_num_tokens"], summary["swa_max_total_num_tokens"]) == (970896, 776704)
    built = subprocess.run(
        [
            kvpools_exe,
            "build",
            "mimo-v2-flash",
            "--memory",
            "8GiB",
            "--tp-size",
            "4",
            "--page-size",
            "64",
            "--max-running-requests",
            "16",
            "--disable-radix-cache",
            "--device",
            "meta",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=cli_env,
        check=True,
    ).stdout
    assert json.loads(built)["matches_plan"] is True


def test_accessors_and_the_hooks_decline_other_models() -> None:
    from kvpools_plugins import swa

    p = plan("gpt-oss-20b", Serving(page_size=4, max_running_requests=2, context_length=64), memory=16 * MiB)
    pools = build(p, "cpu")
    pool, alloc = pools.kv_pool, pools.allocator
    assert pool.dtype == torch.bfloat16 and pool.layer_num == 24
    k_bytes, v_bytes = pool.get_kv_size_bytes()
    assert k_bytes + v_bytes == p.pool("kv_full").bytes + p.pool("kv_swa").bytes
    key, value = pool.get_kv_buffer(1)
    assert key.shape == value.shape == (p.max_total_num_tokens + 4, 8, 64)
    assert pool.get_value_buffer(0).shape[0] == p.sizing.sglang_config["swa_max_total_num_tokens"] + 4
    assert "SWAKVPool(" in repr(pool) and "SWATokenToKVPoolAllocator(" in repr(alloc)
    alloc.free(torch.empty(0, dtype=torch.int64))
    alloc.free_swa(torch.empty(0, dtype=torch.int64))
    slots = alloc.alloc(4)
    assert slots is not None
    alloc.free_swa(slots)
    alloc.free_full(slots)  # the SWA slots went first, as SGLang's free_full expects
    assert alloc.full_available_size() == alloc.size_full
    with pytest.raises(ValueError, match="entries"):
        SWATokenToKVPoolAllocator(8, 4, 4, mapping=torch.zeros(3, dtype=torch.int64))
    pure = PureSWAAllocator(8, 4)
    pure.free_group_begin()
    pure.free_group_end()
    pure.merge_and_sort_free()
    pure.clear()
    assert "PureSWAAllocator(" in repr(pure) and pure.size_swa == pure.size == 8

    dense = plan("llama-3.1-8b", Serving(), memory=16 * GiB)
    assert swa.validate(dense.model, dense.serving) is None
    assert swa.estimate_cell_size(dense.model, dense.serving) is None
    assert swa.size_pools(dense.model, dense.serving, dense.cell, dense.budget) is None
    assert swa.build_pool(dense, "meta") is None
    assert swa.build_allocator(dense, None, "meta", False) is None
