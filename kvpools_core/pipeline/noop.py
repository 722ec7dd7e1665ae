"""``--prefill-only-disable-kv-cache``: the no-op KV pool of embedding prefill servers (SGLang 0.5.23).

SGLang sizes the KV pool as usual (its configurator's ``max_total_num_tokens``, which the scheduler still admits
by: ``self.size`` is honoured) but builds ``NoOpMHATokenToKVPool`` (ref-000 ``_build_mha_kv_pool`` lines
2006-2010), whose ``_create_buffers`` allocates one placeholder page per layer, K ``(page_size, heads, head_dim)``
and V ``(page_size, heads, v_head_dim)`` (``mem_cache/memory_pool.py``), because the FA prefill backend's
``fa_skip_kv_cache`` path reads raw K/V and never touches the pool.  The request table and the token allocator
are built as usual.  Only plain MHA models get it: ``_validate_prefill_only_disable_kv_cache_pool_family``
(ref-000 lines 963-1001) refuses every other pool family, and the defensive check after the build (lines
639-652) any pool that is not the no-op one.

kvpools plans SGLang's token count in both accountings (the budget is not spent, so no exact solve applies) and
replaces the ``kv`` pool by the placeholders; the build makes :class:`~kvpools_core.pools.mha.NoOpMHATokenToKVPool`.
"""

from __future__ import annotations

import attrs

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.names import KV_POOL
from kvpools_core.values import CellSize, ModelSpec, PoolSizing, PoolSpec, Serving

__all__ = ["NOOP_REFUSAL", "check_noop_family", "noop_sizing", "sizing_serving"]

NOOP_REFUSAL = "is supported for plain MHA models only, as in SGLang 0.5.23"
"""The refusal's fixed text (SGLang: "--prefill-only-disable-kv-cache is not supported for {family}")."""

PLAIN_POOLS = frozenset({KV_POOL, "req_to_token", "allocator"})
PLAIN_PARTS = frozenset({"k", "v"})


def sizing_serving(serving: Serving) -> Serving:
    """The serving the pools are sized with: SGLang's own token count (``accounting="sglang"``) under the no-op
    pool, whose tokens cost the budget nothing."""
    if not serving.prefill_only_disable_kv_cache:
        return serving
    return attrs.evolve(serving, accounting="sglang")


def check_noop_family(spec: ModelSpec, serving: Serving, cell: CellSize, sizing: PoolSizing) -> None:
    """Refuse every pool family but plain MHA on CUDA (``_validate_prefill_only_disable_kv_cache_pool_family``)."""
    flag = option("prefill_only_disable_kv_cache")
    pools = {p.name for p in sizing.pools}
    parts = {p.name for p in cell.parts}
    if serving.platform != "cuda":
        raise UnsupportedCombinationError(
            f"{flag} {NOOP_REFUSAL}, on CUDA: SGLang requires the FA prefill backend (fa3/fa4) and refuses the "
            f"NPU/Ascend and out-of-tree KV pools; the platform is {serving.platform!r}. Drop {flag}."
        )
    if pools != PLAIN_POOLS or parts != PLAIN_PARTS:
        raise UnsupportedCombinationError(
            f"{flag} {NOOP_REFUSAL}: SGLang refuses every other pool family (MLA, DSA, SWA, hybrid linear/Mamba, "
            f"DeepSeek-V4, MiniMax sparse; ref-000 lines 963-1001 and 639-652). {spec.name} ({spec.architecture}) "
            f"plans the pools {', '.join(sorted(pools))} with cell parts {', '.join(sorted(parts))}. Drop {flag}."
        )


def noop_sizing(spec: ModelSpec, serving: Serving, cell: CellSize, sizing: PoolSizing) -> PoolSizing:
    """``sizing`` (SGLang's token count) with the ``kv`` pool replaced by the no-op pool's placeholder page."""
    check_noop_family(spec, serving, cell, sizing)
    kv = next(p for p in sizing.pools if p.name == KV_POOL)
    page = serving.page_size
    placeholder = page * cell.bytes_per_token  # one page of rows: every layer's K and V at the stored width
    noop = PoolSpec(
        name=KV_POOL,
        kind=kv.kind,
        slots=0,
        padding_slots=page,
        bytes_per_slot=cell.bytes_per_token,
        bytes=placeholder,
        sglang_charged=kv.sglang_charged,
        owner=kv.owner,
        unit="fixed",
    )
    unused = kv.bytes - placeholder
    note = (
        f"{option('prefill_only_disable_kv_cache')}: NoOpMHATokenToKVPool keeps SGLang's "
        f"{sizing.max_total_num_tokens:,} tokens for admission but allocates one page of placeholder rows per "
        f"layer ({placeholder:,} B); the {unused:,} B a real pool would hold stay free (SGLang 0.5.23, "
        "mem_cache/memory_pool.py)"
    )
    pools = tuple(noop if p.name == KV_POOL else p for p in sizing.pools)
    return attrs.evolve(sizing, pools=pools, notes=(*sizing.notes, note))
