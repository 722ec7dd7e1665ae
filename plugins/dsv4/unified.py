"""DeepSeek-V4's unified-KV pool (SGLang 0.5.23 on ROCm), torch-free: which layout a platform selects, its buffers.

A platform whose kernels run SGLang's unified-KV path says so in ``PlatformTraits.pool_layouts["dsv4"]``
(:data:`UNIFIED_BF16` / :data:`UNIFIED_FP8`; kvpools-rocm answers it from its ``rocm.flashmla_backend`` /
``rocm.dsv4_unified_kv_fp8`` options, SGLang's ``SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton`` and
``SGLANG_DSV4_UNIFIED_KV_FP8``).  ``DeepSeekV4TokenToKVPool`` (``mem_cache/deepseek_v4_memory_pool.py``) then
builds, instead of the paged SWA, c4 and c128 row pools, one ``DeepSeekV4UnifiedKVPool`` whose every stage layer
holds ``rows = swa_pages + c128_size x k + page // ratio`` rows (``k`` 0 / 32 / 1 for ratio 0 / 4 / 128, the page
term only for a compressed layer: "Pad by one extra page"), ``swa_pages = num_req_slots x swa_ring``, the SWA ring
addressed by request slot (``swa_ring = window + speculative_num_draft_tokens - 1`` when speculative,
``get_swa_ring_size``):

* bf16 (``unified_fp8`` false): one ``(rows, qk_nope + qk_rope)`` bf16 buffer per layer;
* fp8 (``unified_fp8_for_dsv4_pool``, ref-000 lines 138-145): a ``(rows, 512)`` fp8 nope buffer
  (``DSV4_FP8_NOPE_ROW_BYTES``: 448 fp8 values and their e8m0 tile scales) and a ``(rows, qk_rope)`` bf16 rope
  buffer per layer.

The c4 compressor states are request-addressed there (``c4_state_pool_size = num_req_slots x c4 ring``); the
c4 indexer, the c128 state, the full-to-SWA mapping and the SWA allocator stay (the target still takes the paged
SWA allocator: ``needs_paged_swa_allocator`` without encoder replay).  A speculative draft worker's pool follows
the same switch (an MTP / EAGLE NextN draft: ``unified_fp8_for_dsv4_pool`` keeps only a DSpark draft bf16), its
NextN layers of ratio 0 holding the ring rows alone.  SGLang's configurator (ref-002) sizes the same counts as
for the separate-KV pool, so ``--accounting sglang`` is unchanged; the exact accounting charges these buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import attrs

from kvpools_core.options import option
from kvpools_core.parts.sizing import with_cost
from kvpools_core.values import FIXED, REQUEST, TOKEN, GroupCost, PoolSpec, Serving

__all__ = [
    "DRAFT_UNIFIED_KV_POOL",
    "DRAFT_UNIFIED_ROPE_POOL",
    "FP8_NOPE_ROW_BYTES",
    "SEPARATE",
    "UNIFIED_BF16",
    "UNIFIED_FP8",
    "UNIFIED_KV_POOL",
    "UNIFIED_ROPE_POOL",
    "UnifiedGeometry",
    "compressed_name",
    "dsv4_layout",
    "platform_plans_layout",
    "platform_pool_layout",
    "ring_name",
    "swa_ring_size",
    "unified_geometry",
    "unified_layout",
    "unified_notes",
    "unified_problems",
]

SEPARATE = "separate"
UNIFIED_BF16 = "unified_bf16"
UNIFIED_FP8 = "unified_fp8"
LAYOUTS = (SEPARATE, UNIFIED_BF16, UNIFIED_FP8)
LAYOUT_KEY = "dsv4"
UNIFIED_KV_POOL = "unified_kv"
UNIFIED_ROPE_POOL = "unified_kv_rope"
DRAFT_UNIFIED_KV_POOL = "draft_unified_kv"
DRAFT_UNIFIED_ROPE_POOL = "draft_unified_kv_rope"
FP8_NOPE_ROW_BYTES = 512
"""``DSV4_FP8_NOPE_ROW_BYTES`` (``kernels/ops/attention/dsv4/unified_kv_kernels/layout.py``): one fp8 row."""
BF16_BYTES = 2
BLOCKS_PER_C128 = {0: 0, 4: 32, 128: 1}
"""``DeepSeekV4UnifiedKVPool.K_PER_BLOCK``: compressed rows per c128 block (``num_blocks = c128_size``)."""
SGLANG_HISPARSE_MESSAGE = (
    "--enable-hisparse is not supported with the unified-KV path on ROCm"
    "(SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton) for DeepSeek-V4: HiSparse currently requires the separate "
    "packed KV layout."
)


def dsv4_layout(serving: Serving) -> str:
    """The DeepSeek-V4 pool layout the platform's kernels select (``PlatformTraits.pool_layouts``; default the
    separate-KV pools)."""
    return serving.traits.pool_layouts.get(LAYOUT_KEY, SEPARATE)


def platform_pool_layout(serving: Serving) -> str | None:
    """A DeepSeek-V4 layout the platform selects that is none kvpools plans (its own pool class), or None.

    SGLang asserts page 256 for the pools it builds on CUDA and HIP (``_build_dsv4_kv_pool``: ``if not _is_npu``);
    a platform with a pool class of its own is refused by name instead (:func:`unified_problems`)."""
    layout = dsv4_layout(serving)
    return None if layout in LAYOUTS else layout


def platform_plans_layout(serving: Serving) -> bool:
    """Whether the platform plugin plans and builds its DeepSeek-V4 layout itself
    (``PlatformTraits.platform_planned_layouts``): this plugin then neither refuses the name nor sizes it."""
    return LAYOUT_KEY in serving.traits.platform_planned_layouts


def swa_ring_size(window: int, serving: Serving) -> int:
    """``get_swa_ring_size``: the window, plus the draft tokens a verify batch writes ahead (less one)."""
    extra = (serving.speculative_num_draft_tokens or 1) - 1 if serving.speculative else 0
    return window + extra


@attrs.frozen
class UnifiedGeometry:
    """Per stage layer the rows of ``DeepSeekV4UnifiedKVPool`` and their bytes (and the draft worker's)."""

    fp8: bool
    head_dim: int
    rope_dim: int
    ring: int
    slots: int
    c128_tokens: int
    page_size: int
    ratios: tuple[int, ...]
    draft_layers: int

    @property
    def swa_rows(self) -> int:
        return self.slots * self.ring

    def rows(self, ratio: int) -> int:
        pad = self.page_size // ratio if ratio else 0
        return self.swa_rows + self.c128_tokens * BLOCKS_PER_C128[ratio] + pad

    @property
    def kv_row_bytes(self) -> int:
        """The first buffer's row: the fp8 nope row, or the whole bf16 latent."""
        return FP8_NOPE_ROW_BYTES if self.fp8 else self.head_dim * BF16_BYTES

    @property
    def rope_row_bytes(self) -> int:
        """The fp8 layout's bf16 rope row (none in bf16)."""
        return self.rope_dim * BF16_BYTES if self.fp8 else 0

    def layer_rows(self, draft: bool = False) -> tuple[int, ...]:
        return (self.swa_rows,) * self.draft_layers if draft else tuple(self.rows(r) for r in self.ratios)

    def nbytes(self, row_bytes: int, draft: bool = False) -> int:
        return sum(self.layer_rows(draft)) * row_bytes

    def c128_rows_per_token(self) -> int:
        """Rows one c128 token adds across the stage (32 per c4 layer, 1 per c128 layer)."""
        return sum(BLOCKS_PER_C128[r] for r in self.ratios)


def unified_geometry(
    serving: Serving,
    *,
    head_dim: int,
    rope_dim: int,
    window: int,
    slots: int,
    c128_tokens: int,
    ratios: tuple[int, ...],
    draft_layers: int,
) -> UnifiedGeometry | None:
    """The unified pool of this stage, or None on the separate-KV layout."""
    layout = dsv4_layout(serving)
    if layout == SEPARATE:
        return None
    return UnifiedGeometry(
        fp8=layout == UNIFIED_FP8,
        head_dim=head_dim,
        rope_dim=rope_dim,
        ring=swa_ring_size(window, serving),
        slots=slots,
        c128_tokens=c128_tokens,
        page_size=serving.page_size,
        ratios=ratios,
        draft_layers=draft_layers,
    )


def unified_notes(serving: Serving) -> list[str]:
    """What the plan says about the layout a platform selects (nothing on the separate-KV pools)."""
    layout = dsv4_layout(serving)
    if layout not in (UNIFIED_BF16, UNIFIED_FP8):
        return []
    rows = (
        f"a {FP8_NOPE_ROW_BYTES} B fp8 nope row and a bf16 rope row"
        if layout == UNIFIED_FP8
        else "a bf16 row of qk_nope + qk_rope"
    )
    return [
        f"{serving.platform} selects SGLang's unified-KV DeepSeek-V4 pool ({layout}, DeepSeekV4UnifiedKVPool): per "
        f"layer the SWA ring of every request slot and the compressed blocks (32 per c128 token in a c4 layer, 1 in "
        f"a c128 layer) in one buffer, {rows} each; no separate SWA / c4 / c128 pools, the c4 states per request "
        "slot. SGLang's configurator sizes the same counts as for the separate pools (--accounting sglang)."
    ]


def unified_problems(serving: Serving) -> list[str]:
    """What SGLang refuses on the unified-KV path, and a layout name the dsv4 plugin does not know."""
    layout = dsv4_layout(serving)
    if layout == SEPARATE:
        return []
    o = option
    if layout not in LAYOUTS:
        if serving.accounting != "exact" or platform_plans_layout(serving):
            # SGLang's configurator (ref-002) sizes the same counts whatever pool class is built; a platform that
            # plans its own layout answers size_pools / build_pool for it (PlatformTraits.platform_planned_layouts)
            return []
        return [
            f"The {serving.platform} platform selects DeepSeek-V4 pool layout {layout!r} "
            f"(PlatformTraits.pool_layouts), which kvpools does not model yet: the exact accounting charges the "
            f"pools build makes, and the dsv4 plugin plans {', '.join(LAYOUTS)} only. Use {o('accounting')} sglang "
            f"for the configurator's numbers (SGLang's DSV4PoolConfigurator sizes every layout alike)."
        ]
    problems = []
    if serving.enable_hisparse:
        problems.append(f"SGLang refuses {o('enable_hisparse')} here: '{SGLANG_HISPARSE_MESSAGE}'")
    if layout == UNIFIED_FP8 and serving.disaggregation_mode != "null" and serving.pp_size > 1:
        problems.append(
            f"SGLang refuses the fp8 unified-KV pool on a PD {serving.disaggregation_mode} node with "
            f"{o('pp_size')} {serving.pp_size} ('SGLANG_DSV4_UNIFIED_KV_FP8=1 does not support PD disaggregation "
            f"with pp_size={serving.pp_size}', check_dsv4_unified_fp8_pd_supported). Use {o('pp_size')} 1."
        )
    return problems


_Make = Callable[[str], PoolSpec]
C128_TOKENS = "c128"


def unified_layout(u: UnifiedGeometry, c4_states: Sequence[Any], requests: int) -> list[tuple[int, _Make]]:
    """The unified buffers and the request-addressed c4 states as ``(bytes, make(owner))`` (:mod:`.buffers`).

    Each buffer is charged as two pools: its ring rows (``*_ring``: the first ``swa_pages`` rows of every layer,
    per request slot) and its compressed rows (``*_compressed``: per c128 token, and the padding page), since a
    cost pays per request or per token, not both."""
    layout: list[tuple[int, _Make]] = []
    for name, row_bytes, draft in (
        (UNIFIED_KV_POOL, u.kv_row_bytes, False),
        (UNIFIED_ROPE_POOL, u.rope_row_bytes, False),
        (DRAFT_UNIFIED_KV_POOL, u.kv_row_bytes, True),
        (DRAFT_UNIFIED_ROPE_POOL, u.rope_row_bytes, True),
    ):
        layers = len(u.layer_rows(draft))
        if not row_bytes or not layers:
            continue
        ring = u.swa_rows * row_bytes * layers
        layout.append((ring, partial(_ring_pool, ring_name(name), ring, u.ring * row_bytes * layers, requests)))
        compressed = u.nbytes(row_bytes, draft) - ring
        if compressed:
            per_token = u.c128_rows_per_token() * row_bytes
            layout.append(
                (compressed, partial(_compressed_pool, compressed_name(name), compressed, per_token, u.c128_tokens))
            )
    for state in c4_states:
        if state.layers:
            per_request = state.ring * state.row_bytes * len(state.layers)
            layout.append((state.nbytes, partial(_state_pool, state.name, state.nbytes, per_request, requests)))
    return layout


def ring_name(buffer: str) -> str:
    return f"{buffer}_ring"


def compressed_name(buffer: str) -> str:
    return f"{buffer}_compressed"


def _ring_pool(name: str, nbytes: int, per_request: int, requests: int, owner: str) -> PoolSpec:
    """The SWA ring rows of a unified buffer: a ring per request slot (the padding slot's fixed)."""
    pool = PoolSpec(
        name=name, kind="kv", slots=requests, bytes_per_slot=per_request, bytes=nbytes, owner=owner, unit=REQUEST
    )
    fixed = nbytes - per_request * requests
    if fixed < 0:  # cannot happen: the slots are the requests and the padding rows
        return attrs.evolve(pool, unit=FIXED)
    return with_cost(pool, GroupCost(group=name, bytes_per_request=per_request, fixed_bytes=fixed))


def _compressed_pool(name: str, nbytes: int, per_token: int, c128_tokens: int, owner: str) -> PoolSpec:
    """The compressed rows of a unified buffer: 32 rows per c128 token in a c4 layer, 1 in a c128 layer; the
    padding page of each compressed layer fixed."""
    pool = PoolSpec(
        name=name,
        kind="kv",
        slots=c128_tokens,
        bytes_per_slot=per_token,
        bytes=nbytes,
        owner=owner,
        unit=TOKEN,
        token_space=C128_TOKENS,
    )
    fixed = nbytes - per_token * c128_tokens
    cost = GroupCost(group=name, token_space=C128_TOKENS, token_bytes=per_token, fixed_bytes=fixed)
    return with_cost(pool, cost)


def _state_pool(name: str, nbytes: int, per_request: int, requests: int, owner: str) -> PoolSpec:
    """A c4 state addressed by request slot: a ring of rows per running request; the padding slot and the
    rounding fixed."""
    pool = PoolSpec(
        name=name, kind="state", slots=requests, bytes_per_slot=per_request, bytes=nbytes, owner=owner, unit=REQUEST
    )
    fixed = nbytes - per_request * requests
    if fixed < 0:
        return attrs.evolve(pool, unit=FIXED)
    return with_cost(pool, GroupCost(group=name, bytes_per_request=per_request, fixed_bytes=fixed))
