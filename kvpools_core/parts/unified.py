"""SGLang 0.5.23's unified memory pool (``--enable-unified-memory``): the sizing arithmetic, from plain values.

Under unified memory a hybrid model's full-attention KV, its sliding-window KV
and its Mamba / linear-attention state live in one ``uint8`` arena; the
sub-pools grow towards each other from its two ends (a third, the SWA band of
a Mamba+SWA model, floats between them), so the split between KV tokens and
state slots is decided at run time.  What is fixed at start-up, and what this
module computes, is (``mem_cache/unified_memory_pool.py`` and
``model_executor/pool_configurator.py`` of SGLang 0.5.23 unless said):

* the arena: the profiled budget floored to 4,096 B (``config_from_budget``'s
  ``unified_total_bytes``), plus, for the Mamba factories, the state pool's
  ``max_mamba_cache_size × state entry`` riding on top;
* each sub-pool's *entry*: all layers of one slot contiguous (token-major,
  ``layout/token_major.py``); KV entries round up to 32 B, state entries stay
  raw; every per-rank KV row must be a multiple of 16 B;
* the sink at the bottom of the arena (``_reserved_floor_bytes``), each
  sub-pool's ``max_slots = arena // entry`` and first allocatable slot
  ``ceil(sink / entry)``;
* the labels SGLang prints at boot (``size_full``, ``size_mamba``,
  ``hybrid_swa_token_capacity``, ``mamba_slot_full_token_cost``) and the
  batch-size-1 feasibility floor;
* the combinations SGLang refuses under unified memory
  (:func:`unified_memory_problems`), each with SGLang's reason and the fix.

:mod:`kvpools_core.parts.unified_plan` turns it into plan values (the arena
of ``--enable-unified-memory``); ``docs/unified-memory.md`` says what exists.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import attrs

from kvpools_core.errors import InvalidValueError

__all__ = [
    "ARENA_ALIGN_BYTES",
    "ENTRY_ALIGN_BYTES",
    "ROW_ALIGN_BYTES",
    "STATE_SLOTS_PER_REQUEST_FLOOR",
    "SubPoolEntry",
    "SubPoolGeometry",
    "UnifiedProblem",
    "UnifiedRequest",
    "arena_bytes",
    "bs1_floor_problem",
    "bs1_floor_terms",
    "empty_end_available_tokens",
    "hybrid_swa_token_capacity",
    "mamba_arena_bytes",
    "mamba_size_full",
    "mamba_slot_full_token_cost",
    "max_unified_full_tokens",
    "mha_entry",
    "mla_entry",
    "row_alignment_problems",
    "sink_bytes",
    "state_alignment_problems",
    "state_entry",
    "state_parts",
    "sub_pool_geometry",
    "swa_size_full",
    "unified_memory_problems",
]

ARENA_ALIGN_BYTES = 4096
"""``config_from_budget`` floors the profiled budget to this (the arena is viewed as the KV / state dtypes)."""
ENTRY_ALIGN_BYTES = 32
"""``token_major.ENTRY_ALIGN_BYTES``: a KV entry (one slot, all layers) rounds up to this."""
ROW_ALIGN_BYTES = 16
"""``token_major.ROW_ALIGN_BYTES``: every per-rank KV row must be a multiple of this (vector stores)."""
STATE_SLOTS_PER_REQUEST_FLOOR = 3
"""State slots one running request locks in the bs=1 floor: 1 active + 2 radix checkpoints."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidValueError(f"{name} must be a positive integer, got {value!r}.")


@attrs.frozen
class SubPoolEntry:
    """One sub-pool's slot in the arena: its name, kind and the bytes of one entry (all its layers).

    ``kind`` is ``"kv"`` (MHA or MLA rows, page-aware) or ``"state"`` (Mamba /
    linear-attention state, one slot per request, always page size 1).
    ``rows`` are the per-rank row bytes the 16 B rule is checked on.
    """

    name: str
    kind: str = attrs.field(validator=attrs.validators.in_(("kv", "state")))
    layer_num: int
    entry_bytes: int
    rows: tuple[tuple[str, int], ...] = ()
    parts: tuple[tuple[str, int], ...] = ()
    """A state entry's per-layer parts (conv tensors, then the temporal state), laid out part-major
    (``build_mamba_entry_views``: ``[conv[0] x L | ... | temporal x L]``); empty when not known."""


def mha_entry(
    name: str, *, layer_num: int, head_num: int, head_dim: int, v_head_dim: int | None = None, itemsize: int
) -> SubPoolEntry:
    """An MHA KV entry: ``[K_0 | V_0 | K_1 | V_1 | ...]``, rounded up to 32 B (``MHASubPoolSpec.entry_bytes``).

    ``itemsize`` is the stored element's bytes (fp8 KV is stored as ``uint8``: 1).
    """
    for key, value in (
        ("layer_num", layer_num),
        ("head_num", head_num),
        ("head_dim", head_dim),
        ("itemsize", itemsize),
    ):
        _positive(key, value)
    v_dim = head_dim if v_head_dim is None else v_head_dim
    _positive("v_head_dim", v_dim)
    k_row, v_row = head_num * head_dim * itemsize, head_num * v_dim * itemsize
    entry = _ceil_div(layer_num * (k_row + v_row), ENTRY_ALIGN_BYTES) * ENTRY_ALIGN_BYTES
    return SubPoolEntry(name, "kv", layer_num, entry, (("K", k_row), ("V", v_row)))


def mla_entry(name: str, *, layer_num: int, kv_lora_rank: int, qk_rope_head_dim: int, itemsize: int) -> SubPoolEntry:
    """An MLA KV entry: one latent row per layer, rounded up to 32 B (``MLASubPoolSpec.entry_bytes``)."""
    for key, value in (
        ("layer_num", layer_num),
        ("kv_lora_rank", kv_lora_rank),
        ("qk_rope_head_dim", qk_rope_head_dim),
        ("itemsize", itemsize),
    ):
        _positive(key, value)
    row = (kv_lora_rank + qk_rope_head_dim) * itemsize
    entry = _ceil_div(layer_num * row, ENTRY_ALIGN_BYTES) * ENTRY_ALIGN_BYTES
    return SubPoolEntry(name, "kv", layer_num, entry, (("latent", row),))


def state_entry(name: str, *, layer_num: int, conv_row_bytes: Sequence[int], temporal_row_bytes: int) -> SubPoolEntry:
    """A Mamba / linear-attention state entry: every conv tensor and the temporal state of every layer, raw.

    ``MambaSubPoolSpec.entry_bytes`` (unfused): no 32 B rounding.  ``conv_row_bytes``
    holds one per-layer byte count per conv tensor.
    """
    _positive("layer_num", layer_num)
    if not conv_row_bytes:
        raise InvalidValueError("conv_row_bytes must name at least one conv tensor, got none.")
    entry = sum(layer_num * int(b) for b in conv_row_bytes) + layer_num * int(temporal_row_bytes)
    return SubPoolEntry(name, "state", layer_num, entry, parts=state_parts(conv_row_bytes, temporal_row_bytes))


def state_parts(conv_row_bytes: Sequence[int], temporal_row_bytes: int) -> tuple[tuple[str, int], ...]:
    """One layer's state parts in SGLang's entry order: ``conv_0``, ``conv_1``, ..., then ``temporal`` (left out
    when it holds no bytes, as a short-conv-only state's)."""
    parts = [(f"conv_{i}", int(b)) for i, b in enumerate(conv_row_bytes)]
    if temporal_row_bytes:
        parts.append(("temporal", int(temporal_row_bytes)))
    return tuple(parts)


def arena_bytes(budget_bytes: int) -> int:
    """``unified_total_bytes``: the profiled KV budget floored to 4,096 B (never overcommits)."""
    if budget_bytes < 0:
        raise InvalidValueError(f"the unified memory budget must be >= 0 bytes, got {budget_bytes}.")
    return budget_bytes - budget_bytes % ARENA_ALIGN_BYTES


def mamba_arena_bytes(unified_total_bytes: int, max_mamba_cache_size: int, state: SubPoolEntry) -> int:
    """The Mamba factories' arena: the token side's ``unified_total_bytes`` plus the state pool on top.

    ``init_unified_mamba_pools`` / ``init_unified_mamba_swa_pools`` with a profiled budget.
    """
    return unified_total_bytes + max_mamba_cache_size * state.entry_bytes


def sink_bytes(entries: Sequence[SubPoolEntry], page_size: int) -> int:
    """The slot-0 padding sink at the bottom of the arena (``_reserved_floor_bytes``).

    The largest entry, or a whole page of any KV sub-pool (a page-aware pool
    allocates whole pages, so its first page starts past all of page 0); a
    state sub-pool is page size 1, so its entry is charged once.
    """
    _positive("page_size", page_size)
    return max([max(e.entry_bytes for e in entries)] + [page_size * e.entry_bytes for e in entries if e.kind == "kv"])


@attrs.frozen
class SubPoolGeometry:
    """One sub-pool's index space over the arena (``UnifiedKVPool`` + ``MultiEndedAllocator.__init__``)."""

    name: str
    entry_bytes: int
    page_size: int
    """Pages of this sub-pool: the serving page size for KV, 1 for state."""
    max_slots: int
    """``arena // entry``: every sub-pool's views span the whole arena."""
    min_slot_index: int
    """``ceil(sink / entry)``: the first slot past the sink."""
    num_pages: int
    min_page_index: int

    @property
    def entry_bytes_per_page(self) -> int:
        return self.entry_bytes * self.page_size

    @property
    def allocatable_pages(self) -> int:
        return self.num_pages - self.min_page_index


def sub_pool_geometry(total_bytes: int, entry: SubPoolEntry, sink: int, page_size: int) -> SubPoolGeometry:
    """``max_slots``, ``min_slot_index`` and the page counts of ``entry`` in an arena of ``total_bytes``.

    Raises ``InvalidValueError`` where SGLang's ``UnifiedKVPool`` raises: the
    sub-pool has no slot past the sink.
    """
    pool_page = page_size if entry.kind == "kv" else 1
    max_slots = total_bytes // entry.entry_bytes
    min_slot = _ceil_div(sink, entry.entry_bytes)
    if max_slots <= min_slot:
        raise InvalidValueError(
            f"the unified arena of {total_bytes} B fits only {max_slots} slots of sub-pool {entry.name!r} "
            f"({entry.entry_bytes} B each), but its first {min_slot} are the slot-0 sink: no room for real data. "
            "Raise the memory budget (--mem-fraction-static) or drop --enable-unified-memory."
        )
    return SubPoolGeometry(
        entry.name,
        entry.entry_bytes,
        pool_page,
        max_slots,
        min_slot,
        max_slots // pool_page,
        _ceil_div(min_slot, pool_page),
    )


def empty_end_available_tokens(grower: SubPoolGeometry, other_end: SubPoolGeometry) -> int:
    """Tokens ``grower`` (one END) can allocate into an empty arena whose other END is ``other_end``.

    ``MultiEndedAllocator._available_tokens`` at ``clear()``: the grow-down end's
    low frontier is the arena's top page boundary, the grow-up end's high
    frontier its first allocatable page; bytes and index space both bound it.
    """
    top = grower.num_pages * grower.entry_bytes_per_page
    bottom = other_end.min_page_index * other_end.entry_bytes_per_page
    pages = min(max(0, top - bottom) // grower.entry_bytes_per_page, grower.allocatable_pages)
    return pages * grower.page_size


def mamba_size_full(full: SubPoolGeometry, dcp_size: int = 1) -> int:
    """``UnifiedMambaTokenToKVPoolAllocator.size_full``: ``(max_slots - 1) × dcp``, a logical token label."""
    return (full.max_slots - 1) * dcp_size


def swa_size_full(full: SubPoolGeometry, swa: SubPoolGeometry) -> int:
    """``UnifiedSWATokenToKVPoolAllocator.size_full`` with a profiled budget: the full end's empty availability."""
    return empty_end_available_tokens(full, swa)


def hybrid_swa_token_capacity(size_full: int, max_total_tokens: int | None = None) -> int:
    """``hybrid_swa_token_capacity`` under unified memory: ``size_full``, capped by the user's cap."""
    return size_full if max_total_tokens is None else min(size_full, max_total_tokens)


def mamba_slot_full_token_cost(
    state: SubPoolEntry, full: SubPoolEntry, dcp_size: int = 1, swa: SubPoolEntry | None = None
) -> int:
    """Full tokens of admission budget one live state slot costs: ``ceil(state entry × dcp / full entry)``.

    In the Mamba+SWA chain a token costs a full *and* an SWA entry:
    ``ceil(state entry / (full entry + SWA entry))`` (``UnifiedMambaSWATokenToKVPoolAllocator``).
    """
    if swa is not None:
        return _ceil_div(state.entry_bytes, full.entry_bytes + swa.entry_bytes)
    return _ceil_div(state.entry_bytes * dcp_size, full.entry_bytes)


def bs1_floor_terms(
    *,
    entries: Sequence[SubPoolEntry],
    page_size: int,
    state: SubPoolEntry | None = None,
    swa: SubPoolEntry | None = None,
    context_len: int | None = None,
    sliding_window: int | None = None,
) -> list[tuple[str, int]]:
    """The batch-size-1 feasibility floor, itemised as SGLang prints it (``_check_bs1_feasibility_floor``).

    One sliding window of SWA KV plus a page of slack (clamped to the context),
    the state slots one request locks, and the sink.  The full side is not
    charged: ``max_req_len`` clamps it at admission.  The SWA term needs the
    context length (the 2-pool SWA factory skips the check without it).
    """
    terms: list[tuple[str, int]] = []
    if swa is not None and context_len is not None:
        tokens = context_len if sliding_window is None else min(context_len, sliding_window + page_size)
        terms.append(("swa_window_kv", tokens * swa.entry_bytes))
    if state is not None:
        terms.append(("bs1_state_slots", STATE_SLOTS_PER_REQUEST_FLOOR * state.entry_bytes))
    terms.append(("sink", sink_bytes(entries, page_size)))
    return terms


def bs1_floor_problem(total_bytes: int, terms: Sequence[tuple[str, int]], factory: str) -> UnifiedProblem | None:
    """SGLang's refusal of an arena below the bs=1 floor (a retract livelock at run time), or ``None``."""
    floor = sum(b for _, b in terms)
    if total_bytes >= floor:
        return None
    detail = " + ".join(f"{name}={b}" for name, b in terms)
    return UnifiedProblem(
        "--mem-fraction-static",
        f"[unified-memory-pool] {factory}: byte budget {total_bytes} cannot fit ONE worst-case request "
        f"(bs=1 floor {floor} = {detail}). A pool this size retract-livelocks at runtime.",
        "Raise --mem-fraction-static, lower the model context length, or reduce reserved memory.",
    )


def max_unified_full_tokens(
    available_bytes: int,
    page_size: int,
    *,
    full_bytes_per_token: int,
    swa_bytes_per_token: int = 0,
    swa_full_tokens_ratio: float = 0.0,
    fixed_swa_tokens: int | None = None,
    draft_bytes_per_token: int = 0,
) -> int:
    """``HybridSWAPoolConfigurator._max_unified_full_tokens``: the largest page-aligned full capacity that fits.

    The boot label (``full_max_total_num_tokens``) of a hybrid-SWA model under
    unified memory: SWA tokens follow the ratio (or are fixed by the request
    cap), a private draft pool is charged for the whole virtual span.
    """
    _positive("full_bytes_per_token", full_bytes_per_token)

    def allocation_bytes(full_pages: int) -> int:
        full_tokens = full_pages * page_size
        swa_tokens = (
            fixed_swa_tokens
            if fixed_swa_tokens is not None
            else int(full_tokens * swa_full_tokens_ratio) // page_size * page_size
        )
        target = full_tokens * full_bytes_per_token + swa_tokens * swa_bytes_per_token
        span = max(target // full_bytes_per_token - 1, 0)
        draft_tokens = _ceil_div(span, page_size) * page_size + page_size
        return target + draft_tokens * draft_bytes_per_token

    max_pages = available_bytes // full_bytes_per_token // page_size
    pages = bisect_right(range(max_pages + 1), available_bytes, key=allocation_bytes) - 1
    return max(pages, 0) * page_size


def row_alignment_problems(entries: Sequence[SubPoolEntry]) -> list[UnifiedProblem]:
    """Every per-rank KV row that is not a multiple of 16 B (``_check_row_alignment``)."""
    out = []
    for entry in entries:
        for part, nbytes in entry.rows:
            if nbytes % ROW_ALIGN_BYTES:
                out.append(
                    UnifiedProblem(
                        "--enable-unified-memory",
                        f"--enable-unified-memory needs every per-rank KV row to be a multiple of {ROW_ALIGN_BYTES} "
                        f"bytes; sub-pool {entry.name!r} has a {nbytes}-byte {part} row.",
                        "Run this model without --enable-unified-memory.",
                    )
                )
    return out


def state_alignment_problems(
    entry: SubPoolEntry, *, conv_itemsize: int, temporal_itemsize: int
) -> list[UnifiedProblem]:
    """A state entry whose bytes are not a multiple of its conv or temporal element (``build_mamba_views``).

    Every slot's views start at ``slot × entry``, read as the state dtypes, so
    the entry must hold whole elements of each (fp32 temporal state: 4 B).
    """
    out = []
    for what, size in (("conv-state", conv_itemsize), ("temporal-state", temporal_itemsize)):
        if entry.entry_bytes % size:
            out.append(
                UnifiedProblem(
                    "--enable-unified-memory",
                    f"misaligned mamba spec: per-slot entry_bytes={entry.entry_bytes} is not a multiple of the "
                    f"{what} itemsize {size} B.",
                    "Run this model without --enable-unified-memory.",
                )
            )
    return out


@attrs.frozen
class UnifiedProblem:
    """One reason SGLang 0.5.23 refuses ``--enable-unified-memory``: the option at fault, SGLang's reason, the fix."""

    option: str
    reason: str
    fix: str

    def __str__(self) -> str:
        return f"{self.reason} {self.fix}"


@attrs.frozen(kw_only=True)
class UnifiedRequest:
    """The serving facts SGLang's unified-memory rules read, as plain values (not tied to ``Plan`` yet)."""

    is_mamba: bool = False
    is_hybrid_swa: bool = False
    is_mla: bool = False
    is_deepseek_v4: bool = False
    kv_cache_dtype: str = "auto"
    enable_kv_cache_sharding: bool = False
    speculative_algorithm: str | None = None
    speculative_eagle_topk: int | None = None
    enable_two_batch_overlap: bool = False
    enable_lmcache: bool = False
    enable_unified_cache_external_linker: bool = False
    enable_hierarchical_cache: bool = False
    enable_hisparse: bool = False
    lazy_compaction: bool = True
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_decode_enable_offload_kvcache: bool = False
    hicache_storage_backend: str | None = None
    disaggregation_decode_retraction_backup: str | None = None
    pp_size: int = 1
    dcp_size: int = 1
    attention_backends: tuple[str, ...] = ()
    """The resolved attention backends (only the DCP rule reads them; empty = not known, not checked)."""


_SPEC_ALGORITHMS = (None, "DSPARK", "EAGLE", "EAGLE3", "DFLASH")
_FP4_DTYPES = ("fp4_e2m1", "nvfp4", "fp4_mx_block16", "mxfp4")
_DCP_BACKENDS = frozenset({"flashinfer", "trtllm_mla", "cutedsl_mla"})
_UM = "--enable-unified-memory"


def unified_memory_problems(req: UnifiedRequest) -> list[UnifiedProblem]:
    """Every rule of SGLang 0.5.23 that refuses ``--enable-unified-memory`` for ``req``; empty = accepted.

    From ``arg_groups/kv_cache_hook.py`` (``handle_unified_memory_pool``,
    ``_validate_unified_memory_dcp``, the FP4 rule), ``kv_shard_hook.py`` and
    ``kv_cache_configurator.py`` (the model classes and MLA-SWA).  The
    attention-backend audits of EAGLE / DSPARK / DFLASH are not modelled.
    """
    p: list[UnifiedProblem] = []

    def add(option: str, reason: str, fix: str) -> None:
        p.append(UnifiedProblem(option, reason, fix))

    if req.is_deepseek_v4 or not (req.is_mamba or req.is_hybrid_swa):
        add(
            _UM,
            "--enable-unified-memory only supports hybrid Mamba and hybrid sliding-window-attention models "
            "(DeepSeek-V4 excluded); this model is neither, so the unified memory pool cannot be built.",
            "Drop --enable-unified-memory for this model.",
        )
    elif req.is_hybrid_swa and req.is_mla:
        what = (
            "unified tri-pool does not support an MLA full side yet"
            if req.is_mamba
            else ("unified memory pool does not support MLA-SWA hybrid yet")
        )
        add(_UM, f"{what}.", "Drop --enable-unified-memory for this model.")
    if req.kv_cache_dtype.lower() in _FP4_DTYPES:
        add(
            "--kv-cache-dtype",
            "FP4 KV cache does not yet support --enable-unified-memory: the unified MHA pool does not allocate "
            "FP4 block scales or the prefill dequant workspace.",
            "Use a bf16 or fp8 --kv-cache-dtype, or drop --enable-unified-memory.",
        )
    if req.enable_kv_cache_sharding:
        add(
            "--enable-kv-cache-sharding",
            "--enable-kv-cache-sharding does not support --enable-unified-memory: the unified pool uses a different "
            "virtual-id allocator and layout.",
            "Drop one of the two options.",
        )
    _pd_rules(req, add)
    if req.speculative_algorithm not in _SPEC_ALGORITHMS:
        add(
            "--speculative-algorithm",
            "--enable-unified-memory only supports --speculative-algorithm DSPARK, DFLASH, EAGLE and EAGLE3; other "
            "speculative algorithms are not yet audited for the unified pool's virtual-to-physical loc translation. "
            f"Got --speculative-algorithm={req.speculative_algorithm!r}.",
            "Use one of those algorithms, or drop --enable-unified-memory.",
        )
    if req.speculative_eagle_topk not in (None, 1):
        add(
            "--speculative-eagle-topk",
            "--enable-unified-memory supports a linear draft chain only (--speculative-eagle-topk in {None, 1}); "
            "tree verify relocates accepted tokens one at a time inside the target pool, which the unified pool's "
            f"page-granular move_kv_cache cannot express. Got --speculative-eagle-topk={req.speculative_eagle_topk!r}.",
            "Set --speculative-eagle-topk 1.",
        )
    if req.enable_two_batch_overlap:
        add(
            "--enable-two-batch-overlap",
            "--enable-unified-memory does not support --enable-two-batch-overlap: the iteration's read tables are "
            "indexed by the whole batch's rows, and a TBO child's readers do not offset into them.",
            "Drop --enable-two-batch-overlap.",
        )
    if req.enable_lmcache:
        add(
            "--enable-lmcache",
            "--enable-unified-memory is not yet compatible with --enable-lmcache: the LMCache offload path indexes "
            "the device buffers with the ids it is handed, and under the unified pool those are VIRTUAL.",
            "Drop --enable-lmcache.",
        )
    if req.enable_unified_cache_external_linker:
        add(
            "--enable-unified-cache-external-linker",
            "--enable-unified-memory does not support --enable-unified-cache-external-linker: direct L3 transfers "
            "do not preserve unified page-envelope indices and compaction lifetimes.",
            "Use --enable-hierarchical-cache for supported L2/L3 transfers.",
        )
    eagle = req.speculative_algorithm in ("EAGLE", "EAGLE3")
    if eagle and req.disaggregation_decode_retraction_backup == "host_pool":
        add(
            "--disaggregation-decode-retraction-backup",
            "--enable-unified-memory + EAGLE/EAGLE3 does not support --disaggregation-decode-retraction-backup="
            "host_pool: the backup builds the draft's host pool off the draft's own device pool, which a fused "
            "EAGLE draft does not have.",
            "Choose another --disaggregation-decode-retraction-backup.",
        )
    if eagle and req.enable_hierarchical_cache:
        add(
            "--enable-hierarchical-cache",
            "--enable-unified-memory + EAGLE/EAGLE3 does not support --enable-hierarchical-cache: HiCache keeps the "
            "draft on a private pool, and would pack an MTP head's KV into the target's page-envelope host pool, "
            "which refuses per-layer draft loads.",
            "Drop --enable-hierarchical-cache.",
        )
    if req.dcp_size > 1:
        _dcp_rules(req, add)
    return p


def _pd_rules(req: UnifiedRequest, add) -> None:  # type: ignore[no-untyped-def]
    if req.disaggregation_mode == "null":
        return
    if req.disaggregation_transfer_backend != "mooncake":
        add(
            "--disaggregation-transfer-backend",
            "--enable-unified-memory with PD disaggregation supports only these transfer backends: mooncake; got "
            f"{req.disaggregation_transfer_backend!r}.",
            "Use --disaggregation-transfer-backend mooncake.",
        )
    if req.pp_size != 1:
        add(
            "--pp-size",
            "--enable-unified-memory with PD disaggregation does not support pipeline parallelism (whole-envelope "
            "transfer has no per-layer entries to subset).",
            "Use --pp-size 1.",
        )
    if req.disaggregation_transfer_backend == "mooncake" and req.speculative_algorithm is not None:
        add(
            "--speculative-algorithm",
            "--enable-unified-memory with PD disaggregation does not support speculative decoding with the Mooncake "
            "transfer backend.",
            "Drop --speculative-algorithm.",
        )
    if not req.lazy_compaction:
        add(
            "SGLANG_DISABLE_LAZY_COMPACTION",
            "--enable-unified-memory with PD disaggregation requires lazy compaction.",
            "Unset SGLANG_DISABLE_LAZY_COMPACTION.",
        )
    if req.enable_hisparse:
        add(
            "--enable-hisparse",
            "--enable-unified-memory with PD disaggregation is not compatible with --enable-hisparse: the "
            "decode-side HiSparse prealloc path ships host/C4 rows straight from the allocator, bypassing the "
            "virtual->physical translation the unified pool needs.",
            "Drop --enable-hisparse.",
        )
    if req.disaggregation_decode_enable_offload_kvcache:
        if req.hicache_storage_backend != "file":
            add(
                "--hicache-storage-backend",
                "--enable-unified-memory with decode KV offload currently supports --hicache-storage-backend=file "
                "only.",
                "Use --hicache-storage-backend file.",
            )
        for bad, what in (
            (req.is_mla, "does not support MLA models yet."),
            (req.is_mamba, "does not support hybrid-Mamba models."),
            (req.is_hybrid_swa, "does not support hybrid-SWA H2D/D2H transfers yet."),
        ):
            if bad:
                add(
                    "--disaggregation-decode-enable-offload-kvcache",
                    f"--enable-unified-memory decode KV offload {what}",
                    "Drop --disaggregation-decode-enable-offload-kvcache.",
                )
    if req.disaggregation_decode_retraction_backup == "host_pool" and req.is_mamba:
        add(
            "--disaggregation-decode-retraction-backup",
            "--enable-unified-memory host-pool decode retraction does not support hybrid-Mamba models.",
            "Choose another --disaggregation-decode-retraction-backup.",
        )


def _dcp_rules(req: UnifiedRequest, add) -> None:  # type: ignore[no-untyped-def]
    pre = "--enable-unified-memory with decode context parallelism (--dcp-size > 1)"
    if not req.is_mla:
        add(
            "--dcp-size",
            f"{pre} supports MLA models only (e.g. kimi-linear): the MHA unified pool has no DCP-aware masked write "
            "path.",
            "Use --dcp-size 1.",
        )
    if req.is_hybrid_swa:
        add(
            "--dcp-size",
            f"{pre} does not support hybrid sliding-window models: UnifiedSWATokenToKVPoolAllocator does not widen "
            "its virtual id space, and the full->swa mapping is not DCP-sharded.",
            "Use --dcp-size 1.",
        )
    if req.disaggregation_mode != "null":
        add(
            "--disaggregation-mode",
            f"{pre} does not support PD disaggregation: the transfer ships whole page envelopes, which under DCP "
            "hold only this rank's shard of each widened page.",
            "Use --dcp-size 1 or no PD disaggregation.",
        )
    backends = set(req.attention_backends) - {""}
    if backends and not backends <= _DCP_BACKENDS:
        add(
            "--attention-backend",
            f"{pre} requires {sorted(_DCP_BACKENDS)} for the full-attention layers; got {sorted(backends)}.",
            "Use one of those attention backends.",
        )
