"""DeepSeek-V4.1's encoder SWA bounded replay (``--enable-encoder-swa-bounded-replay``), SGLang 0.5.23, issue 33.

With the flag the target's SWA rows live in a per-request window instead of a paged SWA pool (ledger rows
000-119 and 000-024):

* the pool (``mem_cache/deepseek_v4_memory_pool.py`` lines 1124-1180): ``needs_paged_swa_allocator`` is false
  (line 1134; no draft, kvpools plans none for V4.1), no ``swa_kv_pool``, and a ``RequestWindow``
  (``mem_cache/dsv41_request_window.py`` lines 226-264) with ``num_slots = num_req_slots`` (the request table's
  rows), ``capacity = ceil((window + draft tokens) / page) x page`` rows per slot, its ``state``: one
  ``DeepSeekV4SingleKVPool`` of ``num_slots x capacity + page`` rows over every stage layer (``_make_kv_pool``,
  paged by the SWA page, so ``ceil((size + page) / page)`` pages a layer), its ``tags``: int64
  ``(layers, num_slots x capacity + page)``, and its replay ``workspace``: one more single-layer KV pool of
  ``(num_slots + 1) x window + max(chunk, prefill graph rows, (num_slots + 1) x (1 + draft tokens))`` rows,
  rounded up to whole pages (``_ensure_workspace``);
* the allocator (``kv_cache_configurator.py`` ``_build_token_to_kv_pool_allocator``, ref-000 L2097-2108): a
  ``DeepSeekV4TokenToKVPool`` without a paged SWA allocator gets ``PagedTokenToKVPoolAllocator(full, page)``
  alone: no SWA allocator, no full-to-SWA mapping;
* the budget (``model_executor/pool_configurator.py`` lines 1200-1244, 1318-1322, 1374-1376, 1424-1431):
  ``request_window_bytes`` (:func:`request_window_bytes`) is fixed bytes set aside before the tokens, the SWA
  ratio becomes 0 (so the SWA rows and the c4 states, priced per SWA slot, leave the bytes per full token), the
  SWA cap is 0, so ``swa_max_total_num_tokens`` and ``c4_state_pool_size`` are 0.

The prefill CUDA graph rows are 0 here: SGLang's default prefill graph on CUDA is the breakable one
(``cuda_graph_config.py`` ``default_prefill_backend``), which ``disable_breakable_cudagraph_if_incompatible``
(``arg_groups/cuda_graph_hook.py``) turns off for DeepSeek-V4 models without prefill context parallelism, which
encoder replay refuses; kvpools has no option for another prefill graph backend.  Speculative decoding (so the
DSpark draft ring and the draft tokens) is refused on V4.1 already (:func:`.low_ratio.v41_problems`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import attrs

from kvpools_core.options import option
from kvpools_core.values import ModelSpec, Serving

from .unified import SEPARATE, dsv4_layout


class _Shape(Protocol):
    """What the configurator's formula reads (``.sizing.DSV4Shape``; a protocol keeps the modules acyclic)."""

    @property
    def requested_per_worker(self) -> int | None: ...
    @property
    def window(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def kv_bytes(self) -> int: ...
    @property
    def attn_head_dim(self) -> int: ...


class _Rows(Protocol):
    """One packed-row pool (``.buffers.KVRowGeometry``)."""

    @property
    def name(self) -> str: ...
    @property
    def layers(self) -> tuple[int, ...]: ...
    @property
    def pages(self) -> int: ...
    @property
    def page_bytes(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


__all__ = [
    "FEATURE",
    "REPLAY_WORKSPACE_POOL",
    "REQUEST_WINDOW_POOL",
    "REQUEST_WINDOW_TAGS_POOL",
    "SGLANG_BUDGET_MESSAGE",
    "SGLANG_REQUIRES_V41_MESSAGE",
    "RequestWindowGeometry",
    "encoder_replay_problems",
    "local_chunk",
    "replay_notes",
    "replay_on",
    "request_window_bytes",
    "request_window_geometry",
    "window_layout",
    "window_planned",
]

FEATURE = "encoder_swa_bounded_replay"
"""The ``engine_features`` name of ``--enable-encoder-swa-bounded-replay`` (DeepSeek-V4.1 only)."""
REQUEST_WINDOW_POOL = "swa_request_window"
REQUEST_WINDOW_TAGS_POOL = "swa_request_window_tags"
REPLAY_WORKSPACE_POOL = "swa_replay_workspace"
TAG_BYTES = 8  # int64 tags, one per window row and layer
REPLAY_ROWS = 128
"""The replay rows a prefix hit's first chunk runs (``validate_deepseek_v41_encoder_replay_budget``) and the
configurator's per-slot scratch (``max(128, draft tokens)``, ``slots x 128``)."""
PREFILL_GRAPH_ROWS = 0
"""``graph_rows`` of the workspace: no breakable prefill CUDA graph on DeepSeek-V4 by default (module docstring)."""
DRAFT_TOKENS = 0
"""``online_mtp_max_draft_tokens``: no speculative decoding on DeepSeek-V4.1 in kvpools (SGLang's DSpark only)."""
V41_MODEL_TYPE = "deepseek_v41"
SGLANG_REQUIRES_V41_MESSAGE = "--enable-encoder-swa-bounded-replay requires DeepSeek-V4.1"
SGLANG_UNSUPPORTED = "--enable-encoder-swa-bounded-replay does not support {feature} yet"
SGLANG_V41_UNSUPPORTED = "DeepSeek-V4.1 does not support {feature} yet; disable it to serve this model."
SGLANG_BUDGET_MESSAGE = (
    "encoder SWA replay requires --max-running-requests > 0 and at least {min_chunk} chunked prefill tokens per "
    "attention DP rank (128 replay tokens plus one page)"
)


def replay_on(serving: Serving) -> bool:
    return serving.enable_encoder_swa_bounded_replay


def local_chunk(serving: Serving) -> int:
    """``get_schedule().chunked_prefill_size`` on a rank: DP attention divides it (``_handle_data_parallelism``,
    ``arg_groups/parallel_hook.py``); 0 without chunked prefill (the pool's ``chunked_prefill_size or 0``)."""
    chunk = serving.chunked_prefill_size or 0
    return chunk // serving.attn_dp_size if chunk > 0 else 0


def encoder_replay_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang 0.5.23 refuses with encoder replay, in its words, and what kvpools does not model with it."""
    if not replay_on(serving):
        return []
    o = option
    flag = o("enable_encoder_swa_bounded_replay")
    if model.model_type != V41_MODEL_TYPE:
        # arg_groups/model_hook.py line 1045, deepseek_v4_hook.py line 279
        return [
            f"{model.name} (model_type {model.model_type!r}): SGLang raises '{SGLANG_REQUIRES_V41_MESSAGE}'. "
            f"Drop {flag}."
        ]
    problems: list[str] = []
    # validate_deepseek_v41_features (arg_groups/deepseek_v4_hook.py lines 291-331): the features kvpools has
    # options for (mixed chunks, LoRA and radix sessions are not kvpools options)
    incompatible = (
        ("context parallelism", serving.attn_cp_size > 1, o("attn_cp_size")),
        ("unified memory", serving.enable_unified_memory, o("enable_unified_memory")),
        ("PD decode", serving.disaggregation_mode == "decode", f"{o('disaggregation_mode')} decode"),
    )
    problems += [
        f"SGLang raises '{SGLANG_UNSUPPORTED.format(feature=feature)}'. Drop {what} or {flag}."
        for feature, enabled, what in incompatible
        if enabled
    ]
    layout = dsv4_layout(serving)
    if layout != SEPARATE and layout.startswith("unified"):
        problems.append(
            f"SGLang raises '{SGLANG_V41_UNSUPPORTED.format(feature='the unified KV layout')}' (the "
            f"{serving.platform} platform selects DeepSeek-V4's unified-KV pool). Drop {flag}."
        )
    elif serving.platform != "cuda":
        problems.append(
            f"kvpools does not model {flag} on {serving.platform} yet (SGLang runs it on CUDA and gfx950 only; "
            f"kvpools plans the CUDA request window). Drop {flag}."
        )
    if serving.dsv4_attn_backend == "trtllm":
        feature = "TRT-LLM with encoder SWA bounded replay"
        problems.append(
            f"SGLang raises '{SGLANG_V41_UNSUPPORTED.format(feature=feature)}'. Drop "
            f"{o('dsv4_attn_backend')} trtllm or {flag}."
        )
    min_chunk = REPLAY_ROWS + serving.page_size
    chunk = local_chunk(serving)
    requests = serving.max_running_requests
    if requests is None or requests <= 0 or chunk < min_chunk:
        # validate_deepseek_v41_encoder_replay_budget (arg_groups/deepseek_v4_hook.py lines 250-267)
        problems.append(
            f"SGLang raises '{SGLANG_BUDGET_MESSAGE.format(min_chunk=min_chunk)}' (got {o('max_running_requests')} "
            f"{requests}, {o('chunked_prefill_size')} {serving.chunked_prefill_size}"
            f"{f' over {serving.attn_dp_size} DP-attention ranks' if serving.attn_dp_size > 1 else ''}). Set "
            f"{o('max_running_requests')} and a {o('chunked_prefill_size')} of at least "
            f"{min_chunk * serving.attn_dp_size}."
        )
    if serving.enable_hierarchical_cache:
        problems.append(
            f"kvpools does not model DeepSeek-V4's host tier with {flag} yet (the request window's pages in "
            f"HiCache). Drop {o('enable_hierarchical_cache')}."
        )
    return problems


# ---------------------------------------------------------------------------
# the configurator's budget
# ---------------------------------------------------------------------------


def request_window_bytes(shape: _Shape, serving: Serving) -> int:
    """``DSV4PoolConfigurator.request_window_bytes`` (``pool_configurator.py`` lines 1211-1241), without a draft.

    ``slots = requests per worker + 1``, ``capacity = ceil_align(window + draft tokens, page)`` (draft tokens 0:
    no speculative decoding on V4.1), ``scratch = max(chunk, slots x max(128, draft tokens)) + slots x 128 +
    page``; bytes = ``(slots x capacity + page) x layers x (kv_bytes + 16) + 4 x scratch x (kv_bytes + 16) +
    slots x 3 x 16 x attn_head_dim x 8`` (the draft ring term is 0 without DSpark draft layers).
    """
    assert shape.requested_per_worker is not None, "encoder replay requires --max-running-requests"
    page = serving.page_size
    slots = max(1, shape.requested_per_worker) + 1
    capacity = -(-shape.window // page) * page
    scratch = max(local_chunk(serving), slots * REPLAY_ROWS) + slots * REPLAY_ROWS + page
    row = shape.kv_bytes + 16
    return (
        (slots * capacity + page) * shape.num_layers * row
        + 4 * scratch * row
        + slots * 3 * 16 * shape.attn_head_dim * 8
    )


def replay_notes(shape: _Shape, serving: Serving) -> list[str]:
    """How the configurator priced the request window (the plan's notes)."""
    assert shape.requested_per_worker is not None
    page = serving.page_size
    slots = max(1, shape.requested_per_worker) + 1
    capacity = -(-shape.window // page) * page
    chunk = local_chunk(serving)
    scratch = max(chunk, slots * REPLAY_ROWS) + slots * REPLAY_ROWS + page
    row = shape.kv_bytes + 16
    return [
        f"{option('enable_encoder_swa_bounded_replay')}: the target's SWA rows live in a per-request window, not a "
        f"paged SWA pool (SGLang's DSV4 SWA storage 'request_window', paged_allocator False): the SWA ratio is 0, "
        f"no SWA pool, no c4 states, no full-to-SWA mapping, and the allocator is the full-only paged one. SGLang's "
        f"configurator sets request_window_bytes aside first: slots {slots} (requests + 1), capacity {capacity} "
        f"(window {shape.window} in whole pages of {page}), scratch max({chunk}, {slots} x 128) + {slots} x 128 + "
        f"{page} = {scratch:,}; ({slots} x {capacity} + {page}) x {shape.num_layers} layer(s) x ({shape.kv_bytes} + "
        f"16) + 4 x {scratch:,} x {row} + {slots} x 3 x 16 x {shape.attn_head_dim} x 8 = "
        f"{request_window_bytes(shape, serving):,} B."
    ]


# ---------------------------------------------------------------------------
# the pool's buffers
# ---------------------------------------------------------------------------


@attrs.frozen
class RequestWindowGeometry:
    """``RequestWindow``'s buffers on one rank: its state rows, its tags and its replay workspace."""

    num_slots: int
    capacity: int
    """Rows per request slot: the window in whole pages (``RequestWindow.capacity``)."""
    window: int
    page_size: int
    workspace_rows: int
    """The rows the pool asks for (``workspace_rows=``); the workspace holds them in whole pages."""
    state: _Rows
    workspace: _Rows

    @property
    def rows(self) -> int:
        return self.num_slots * self.capacity

    @property
    def tags_shape(self) -> tuple[int, int]:
        return len(self.state.layers), self.rows + self.page_size

    @property
    def tags_nbytes(self) -> int:
        layers, rows = self.tags_shape
        return layers * rows * TAG_BYTES


def request_window_geometry(
    serving: Serving,
    *,
    swa: _Rows,
    row_bytes: int,
    page_align: int,
    layout: str,
    window: int,
    num_req_slots: int,
    rows: Callable[..., _Rows],
) -> RequestWindowGeometry | None:
    """The request window that replaces the SWA pool ``swa`` under encoder replay (None without it).  ``rows``
    makes a packed-row pool as the SWA pool's (``.buffers.KVRowGeometry``)."""
    if not replay_on(serving):
        return None
    page = serving.page_size
    capacity = -(-(window + DRAFT_TOKENS) // page) * page
    slots = num_req_slots
    num_rows = slots * capacity
    workspace_rows = (slots + 1) * window + max(
        local_chunk(serving), PREFILL_GRAPH_ROWS, (slots + 1) * (1 + DRAFT_TOKENS)
    )
    state = rows(REQUEST_WINDOW_POOL, num_rows + page, page, swa.layers, row_bytes, page_align, layout)
    workspace = rows(
        REPLAY_WORKSPACE_POOL, -(-workspace_rows // page) * page, page, swa.layers[:1], row_bytes, page_align, layout
    )
    return RequestWindowGeometry(
        num_slots=slots,
        capacity=capacity,
        window=window,
        page_size=page,
        workspace_rows=workspace_rows,
        state=state,
        workspace=workspace,
    )


def window_layout(
    rw: RequestWindowGeometry,
    max_running_requests: int,
    request_pool: Callable[..., Any],
    fixed_pool: Callable[..., Any],
) -> list[tuple[int, Callable[[str], Any]]]:
    """The window's pools as ``(bytes, make(owner))``: the state and its tags cost ``capacity`` rows per request
    (the padding slot and the trailing page are fixed), the workspace is fixed bytes.  ``request_pool`` and
    ``fixed_pool`` are ``.buffers``' pool makers."""
    layers = len(rw.state.layers)
    pages_per_slot = rw.capacity // rw.page_size
    per_request = pages_per_slot * rw.state.page_bytes * layers
    tags_per_request = rw.capacity * TAG_BYTES * layers
    return [
        (
            rw.state.nbytes,
            partial(request_pool, REQUEST_WINDOW_POOL, max_running_requests, per_request, rw.state.nbytes),
        ),
        (
            rw.tags_nbytes,
            partial(request_pool, REQUEST_WINDOW_TAGS_POOL, max_running_requests, tags_per_request, rw.tags_nbytes),
        ),
        (rw.workspace.nbytes, partial(fixed_pool, REPLAY_WORKSPACE_POOL, rw.workspace.nbytes)),
    ]


def window_planned(rw: RequestWindowGeometry) -> list[tuple[str, int, str]]:
    """``(pool, bytes, how)`` of the window's buffers, for the build's check against the plan."""
    state, ws = rw.state, rw.workspace
    layers, rows = rw.tags_shape
    return [
        (state.name, state.nbytes, f"{len(state.layers)} layer(s) of {state.pages} pages x {state.page_bytes} B"),
        (REQUEST_WINDOW_TAGS_POOL, rw.tags_nbytes, f"({layers}, {rows}) int64"),
        (ws.name, ws.nbytes, f"1 layer of {ws.pages} pages x {ws.page_bytes} B ({rw.workspace_rows} rows asked)"),
    ]
