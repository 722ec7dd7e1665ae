"""Reading an Inkling-class config (SGLang 0.5.23's ``configs/inkling.py``, ``InklingModelConfig``).

An Inkling-class model keeps three kinds of cache:

* **full-attention KV** on the layers not in ``local_layer_ids``
  (``num_key_value_heads`` x ``head_dim`` / ``v_head_dim``);
* **sliding-window KV** on the layers in ``local_layer_ids``, with a geometry of
  their own (``swa_num_key_value_heads`` x ``swa_head_dim`` / ``swa_v_head_dim``)
  and the window ``sliding_window_size`` (``configs/model_config.py``
  ``get_hybrid_layer_ids``, the ``InklingForConditionalGeneration`` branch);
* a **short-conv state** on *every* layer (``mamba2_cache_params``: six conv
  windows of ``sconv_kernel_size - 1`` rows, two over the full KV width, two over
  the SWA KV width and two over the hidden stream; no temporal state; bf16 always),
  which SGLang keeps in its Mamba machinery (``mambaish_config``).

Missing fields take ``InklingModelConfig.__init__``'s defaults, as SGLang's
config class gives them.  A multimodal wrapper (``inkling_mm_model``) keeps the
text model under ``text_config``; its ``mtp_config`` (``n_layers``,
``local_layer_ids``, ``local_extent``) overrides the text config's draft depth
and banded MTP heads, as ``InklingMMConfig.__init__`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvpools_core.config import ConfigReader, context_length, model_dtype
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.attention import attention_cell_size
from kvpools_core.parts.sizing import (
    SWA_MAPPING_POOL,
    allocator_pool,
    apply_token_cap,
    largest_fitting_tokens,
    not_enough_memory,
    page_align,
    req_to_token_rows,
    request_pools,
    request_rows_cost,
    resolve_max_num_reqs,
    sglang_rest_gib,
    sglang_tokens,
    sliding_window_terms,
    swa_mapping_pool,
    token_pool,
    with_cost,
)
from kvpools_core.parts.unified import max_unified_full_tokens
from kvpools_core.parts.unified_plan import kv_entry_from_cell, serving_problems, state_entry_from_cell
from kvpools_core.parts.unified_tri import TriPoolMembers, unified_tri_sizing
from kvpools_core.values import (
    FULL_TOKENS,
    REQUEST,
    STATE_SLOT,
    Budget,
    CellPart,
    CellSize,
    LayerSpec,
    ModelSpec,
    Plan,
    PoolSizing,
    PoolSpec,
    Serving,
)

from .inkling_mtp import head_pools, mtp_active, mtp_planned_problems, mtp_problem, mtp_terms
from .sizing import (
    MAPPING_ITEM_BYTES,
    MAPPING_POOL,
    PING_PONG_ITEM_BYTES,
    SLOT_ALLOCATOR_ITEM_BYTES,
    SLOT_ALLOCATOR_POOL,
    SPEC_STATE_POOL,
    STATE_POOL,
    _no_memory_left,
    cap_requests,
    decode_state_slots,
    draft_tokens,
    ping_pong_size,
    spec_state_rows,
    split_budget,
)
from .state import SCONV as MIXER
from .state import sconv_state_shape, sglang_stage_per_req, state_entry_parts

FAMILY = "inkling"
FULL_POOL = "kv_full"
SWA_POOL = "kv_swa"
SWA_ALLOCATOR = "swa_allocator"
SWA_TOKENS = "swa"
"""The SWA token space (the ``swa`` plugin's name for it, so plans and reports read alike)."""
FULL = "attention"
"""A full-attention layer (the ``swa`` plugin's kind, so its KV cell and pools read the layer as theirs)."""
SLIDING = "sliding_attention"
MODEL_TYPES = frozenset({"inkling_model", "inkling_mm_model"})
ARCHITECTURES = frozenset({"InklingForConditionalGeneration", "InklingForConditionalGenerationMTP"})
_CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "max_seq_len", "model_max_length")
_DEFAULTS = {  # InklingModelConfig.__init__'s keyword defaults (configs/inkling.py)
    "hidden_size": 1536,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "sliding_window_size": 512,
    "sconv_kernel_size": 4,
    "num_nextn_predict_layers": 8,
}
INKLING_SWA_FULL_TOKENS_RATIO = 0.1
"""``_inkling_overrides``' ``swa_full_tokens_ratio`` (``arg_groups/model_overrides/inkling.py``)."""
INKLING_MAMBA_FULL_MEMORY_RATIO = 0.1
"""``_inkling_overrides``' ``mamba_full_memory_ratio``."""
INKLING_VLLM_REFUSAL = (
    f"kvpools does not model Inkling-class models under {option('accounting')} vllm: vLLM 0.33 has no Inkling "
    f"model. Use {option('accounting')} sglang or exact."
)
SGLANG_CONTEXT_DEFAULT = 2048
"""``get_context_length``'s answer when the config states no context key (``utils/hf_transformers/common.py``)."""


def is_inkling(config: Mapping[str, Any], source: str) -> bool:
    """Whether ``config`` is an Inkling-class config (its ``model_type`` or its architecture)."""
    outer = ConfigReader(config, source)
    reader = outer.text()
    model_type = reader.string("model_type") or outer.string("model_type")
    architectures = set(outer.string_list("architectures") or reader.string_list("architectures"))
    return model_type in MODEL_TYPES or bool(architectures & ARCHITECTURES)


def is_inkling_model(model: ModelSpec) -> bool:
    """Whether a parsed model is Inkling-class (the mamba plugin's ``inkling`` family)."""
    return model.params.get("family") == FAMILY


def inkling_serving(serving: Serving) -> Serving:
    """``serving`` as SGLang runs an Inkling-class model: with the radix cache on, the extra-buffer state strategy
    (``_inkling_overrides`` pins ``--mamba-radix-cache-strategy extra_buffer``; ``models/inkling.py`` asserts it),
    whether or not ``--enable-mamba-extra-buffer`` was given."""
    if serving.radix_cache_disabled or serving.enable_mamba_extra_buffer:
        return serving
    return attrs.evolve(serving, enable_mamba_extra_buffer=True)


def inkling_plan(plan: Plan) -> Plan:
    """``plan`` with :func:`inkling_serving`, for the builders that read the extra buffer off the serving."""
    serving = inkling_serving(plan.serving)
    return plan if serving is plan.serving else attrs.evolve(plan, serving=serving)


def inkling_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang refuses for an Inkling-class model, and what kvpools does not model of it yet."""
    o = option
    if serving.accounting == "vllm":
        return [INKLING_VLLM_REFUSAL]
    problems: list[str] = []
    if serving.speculative and mtp_active(serving):
        problems += mtp_planned_problems(model, serving)
    elif serving.speculative:
        shape = sglang_swa_shape(model, serving)
        terms = mtp_terms(model, serving, full_per_token=shape.full_per_token, swa_per_token=shape.swa_per_token)
        problems.append(mtp_problem(model, serving, terms))
    if serving.radix_cache_disabled and serving.max_running_requests is not None and serving.chunked_prefill_size:
        problems.append(
            f"kvpools does not model SGLang's SWA chunk cap (SWAChunkCapPoolConfigurator: explicit "
            f"{o('max_running_requests')}, the radix cache off, chunked prefill) for Inkling yet: drop "
            f"{o('max_running_requests')} or keep the radix cache."
        )
    for name, applies, what in (
        ("enable_hierarchical_cache", serving.enable_hierarchical_cache, "a host tier"),
        ("pp_size", serving.pp_size > 1, "pipeline parallelism"),
        ("dcp_size", serving.dcp_size > 1, "decode context parallelism"),
        ("disaggregation_mode", serving.disaggregation_mode != "null", "PD disaggregation"),
        (
            "enable_linear_replayssm",
            serving.enable_linear_replayssm or serving.enable_linear_replayssm_spec,
            "ReplaySSM (SGLang runs it for GDN / KDA layers only)",
        ),
    ):
        if applies:
            problems.append(
                f"kvpools does not model {what} for Inkling-class models yet ({o(name)} {getattr(serving, name)!r}): "
                f"plan {model.name} without {o(name)}."
            )
    if serving.enable_unified_memory:
        problems += serving_problems(serving, model_name=model.name, is_mamba=True, is_hybrid_swa=True, is_mla=False)
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    if kv.is_fp4 or kv.scale_block is not None:  # SGLang's SWA pool takes its MXFP8 / FP4 pools then
        problems.append(
            f"kvpools does not model {o('kv_cache_dtype')} {serving.kv_cache_dtype} for Inkling-class models yet: "
            f"use auto, bf16 or an fp8 KV cache."
        )
    return problems


def parse_inkling_config(config: Mapping[str, Any], source: str, *, architecture: str) -> ModelSpec:
    """The model of an Inkling-class config (:func:`is_inkling`)."""
    outer = ConfigReader(config, source)
    reader = outer.text()

    def integer(key: str, default: int | None = None, minimum: int = 1) -> int:
        fallback = _DEFAULTS.get(key) if default is None else default
        return reader.integer(key, fallback, minimum=minimum)

    layers = integer("num_hidden_layers")
    hidden = integer("hidden_size")
    heads = integer("num_attention_heads")
    kv_heads = integer("num_key_value_heads")
    head_dim = integer("head_dim", hidden // heads)
    v_head_dim = integer("v_head_dim", head_dim)
    swa_kv_heads = integer("swa_num_key_value_heads", kv_heads)
    swa_head_dim = integer("swa_head_dim", head_dim)
    swa_v_head_dim = integer("swa_v_head_dim", swa_head_dim)
    window = integer("sliding_window_size")
    kernel = integer("sconv_kernel_size", minimum=2)
    local = reader.integer_list("local_layer_ids", maximum=layers - 1, fix="List layer ids below num_hidden_layers.")
    if len(set(local)) != len(local):  # get_hybrid_layer_ids' assert
        raise reader.error("local_layer_ids", f"repeats a layer id: {list(local)}", "List each layer id once.")
    if not local:
        raise reader.error(
            "local_layer_ids",
            "is empty: no layer slides",
            "SGLang 0.5.23 serves Inkling with hybrid SWA pools, whose configurator asserts at least one SWA layer "
            "(HybridSWAPoolConfigurator); list the sliding-window layers.",
        )
    nextn = integer("num_nextn_predict_layers", minimum=0)
    mtp_local = reader.integer_list("mtp_local_layer_ids", maximum=max(nextn - 1, 0))
    mtp_extent = reader.optional_integer("mtp_local_extent")
    if outer is not reader and outer.has("mtp_config"):  # InklingMMConfig.__init__ canonicalises mtp_config
        mtp = outer.child("mtp_config")
        nextn = mtp.integer("n_layers", nextn, minimum=0)
        if mtp.get("local_layer_ids"):
            mtp_local = mtp.integer_list("local_layer_ids", maximum=max(nextn - 1, 0))
            mtp_extent = mtp.optional_integer("local_extent") or mtp_extent
    local_set = set(local)
    specs = [
        LayerSpec(
            index=i,
            kind=SLIDING,
            num_kv_heads=swa_kv_heads,
            head_dim=swa_head_dim,
            v_head_dim=swa_v_head_dim,
            sliding_window=window,
        )
        if i in local_set
        else LayerSpec(index=i, kind=FULL, num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head_dim)
        for i in range(layers)
    ]
    notes = []
    if any(reader.has(key) for key in _CONTEXT_KEYS):
        context = context_length(reader, _CONTEXT_KEYS)
    else:
        context = SGLANG_CONTEXT_DEFAULT
        notes.append(
            f"the config states no context length: SGLang's get_context_length answers {SGLANG_CONTEXT_DEFAULT}"
        )
    dtype_reader = reader if reader.has("torch_dtype") or reader.has("dtype") else outer
    return ModelSpec(
        name=source,
        architecture=architecture,
        layers=specs,
        context_len=context,
        dtype=model_dtype(dtype_reader),
        num_attention_heads=heads,
        model_type=reader.string("model_type") or outer.string("model_type"),
        hf_architectures=outer.string_list("architectures") or reader.string_list("architectures"),
        source=source,
        num_nextn_predict_layers=nextn,
        is_multimodal=reader is not outer,
        params={
            "family": FAMILY,
            "mixer": MIXER,
            "state_tp": "attention",
            "ssm_dtype": None,
            "ple": None,
            "vllm": None,
            "sliding_window": window,
            "layer_pattern": "local_layer_ids (InklingForConditionalGeneration in get_hybrid_layer_ids)",
            "notes": notes,
            "sconv": {
                "kernel": kernel,
                "hidden_size": hidden,
                "num_kv_heads": kv_heads,
                "head_dim": head_dim,
                "swa_num_kv_heads": swa_kv_heads,
                "swa_head_dim": swa_head_dim,
            },
            "mtp_local_layer_ids": list(mtp_local),
            "mtp_local_extent": mtp_extent or window,
        },
    )


# ------------------------------------------------------------------------------------------------- the cell


def inkling_cell_size(model: ModelSpec, serving: Serving, state_part: CellPart, state_note: str) -> CellSize:
    """Bytes per token of the full and the SWA KV pools on this rank, one state slot, and SGLang's cell size.

    SGLang's cell size is ``HybridSWAPoolConfigurator``'s (``002_50706b73e02ffb67.txt`` lines 302-361):
    ``full x full layers + swa_full_tokens_ratio x swa x SWA layers`` (whole-model layer counts); the state
    is carved out of the budget before it (``_handle_max_mamba_cache``).
    """
    start, end = rank_layer_range(model, serving)
    layers = model.layers[start:end]
    full = tuple(layer for layer in layers if layer.kind == FULL)
    swa = tuple(layer for layer in layers if layer.kind == SLIDING)
    parts = [
        attrs.evolve(p, name=f"full_{p.name}") for p in attention_cell_size(full, model, serving, pool=FULL_POOL).parts
    ]
    parts += [
        attrs.evolve(p, name=f"swa_{p.name}") for p in attention_cell_size(swa, model, serving, pool=SWA_POOL).parts
    ]
    shape = sglang_swa_shape(model, serving)
    return CellSize(
        parts=[*parts, state_part],
        sglang_bytes_per_token=shape.cell,
        num_layers=end - start,
        # the MTP heads are this plugin's pools (size_inkling_pools): no second draft from the speculative plugin
        draft_included=serving.speculative,
        notes=[
            *model.params.get("notes", ()),
            f"kv_full bytes are per full token ({len(full)} full layer(s) on this rank), kv_swa bytes per SWA token "
            f"({len(swa)} SWA layer(s)); SGLang's cell size = {shape.full_per_token:,} x {shape.num_full} + "
            f"{shape.ratio} x {shape.swa_per_token:,} x {shape.num_swa} = {shape.cell:,.1f} B",
            state_note,
        ],
    )


@attrs.frozen
class SwaShape:
    """``HybridSWAPoolConfigurator``'s coefficients (whole-model layer counts, attention TP)."""

    full_per_token: int
    swa_per_token: int
    num_full: int
    num_swa: int
    ratio: float

    @property
    def cell(self) -> float:
        return self.full_per_token * self.num_full + self.ratio * self.swa_per_token * self.num_swa


def sglang_swa_shape(model: ModelSpec, serving: Serving) -> SwaShape:
    e = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype).element_bytes
    tp = serving.attn_tp_size

    def per_token(layer: LayerSpec) -> int:
        return max(1, layer.num_kv_heads // tp) * (layer.head_dim + layer.v_head_dim) * e

    full = [layer for layer in model.layers if layer.kind == FULL]
    swa = [layer for layer in model.layers if layer.kind == SLIDING]
    return SwaShape(
        full_per_token=per_token(full[0]) if full else 0,
        swa_per_token=per_token(swa[0]),
        num_full=len(full),
        num_swa=len(swa),
        ratio=serving.swa_full_tokens_ratio,
    )


# ------------------------------------------------------------------------------------------------ the sizing


def size_inkling_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, *, owner: str) -> PoolSizing:
    """The static three-pool stack: the state cache first (``_handle_max_mamba_cache``, SGLang's K), then the
    full / SWA split of what is left (``HybridSWAPoolConfigurator``), and the request cap of both."""
    pinned = serving.enable_mamba_extra_buffer
    serving = inkling_serving(serving)
    page = serving.page_size
    context_len = serving.context_length or model.context_len
    per_slot = cell.bytes_per_state_slot
    shape = sglang_swa_shape(model, serving)
    split = split_budget(sglang_rest_gib(budget), serving, sglang_stage_per_req(model, serving), model.name, budget)
    k = split.max_mamba_cache_size
    per_token = cell.pool_bytes_per_token()
    mtp = (
        mtp_terms(model, serving, full_per_token=shape.full_per_token, swa_per_token=shape.swa_per_token)
        if serving.speculative and mtp_active(serving)
        else None
    )
    d = draft_tokens(serving)

    def tokens_of(total: int) -> tuple[int, int]:  # _solve_pool_sizes
        full = page_align(total, page)
        return full, page_align(int(full * shape.ratio), page)

    def layout(total: int) -> tuple[list[PoolSpec], int, str | None]:
        full, swa = tokens_of(total)
        requests, note = cap_requests(resolve_max_num_reqs(full, context_len, serving), split)
        requests = max(requests, 0)
        slots = decode_state_slots(k, requests, serving)
        pools = [
            token_pool(FULL_POOL, full, page, per_token[FULL_POOL], owner, token_space=FULL_TOKENS),
            token_pool(SWA_POOL, swa, page, per_token[SWA_POOL], owner, token_space=SWA_TOKENS),
            swa_mapping_pool(full, page, owner),
            state_pool(slots, per_slot, owner),
            *request_pools(requests, context_len, serving),
        ]
        if serving.speculative:  # the target's intermediate conv windows (dense: InklingConvStateShape's dedup off)
            spec_rows = spec_state_rows(requests, serving)
            spec = PoolSpec(
                name=SPEC_STATE_POOL,
                kind="state",
                slots=spec_rows,
                padding_slots=1,
                bytes_per_slot=d * per_slot,
                bytes=(spec_rows + 1) * d * per_slot,
                owner=owner,
                unit=REQUEST,
            )
            pools.append(with_cost(spec, request_rows_cost(spec, requests)) if spec_rows != requests else spec)
        if mtp is not None:
            pools += head_pools(mtp, full, page, k, owner)
        rows, padding = req_to_token_rows(requests, serving)
        row_bytes = MAPPING_ITEM_BYTES + PING_PONG_ITEM_BYTES * ping_pong_size(serving)
        mapping = PoolSpec(
            name=MAPPING_POOL,
            kind="request",
            slots=rows,
            padding_slots=padding,
            bytes_per_slot=row_bytes,
            bytes=(rows + padding) * row_bytes,
            sglang_charged=False,
            owner=owner,
            unit=REQUEST,
        )
        pools.append(with_cost(mapping, request_rows_cost(mapping, requests)))
        pools.append(
            PoolSpec(
                name=SLOT_ALLOCATOR_POOL,
                kind="allocator",
                slots=slots,
                bytes_per_slot=SLOT_ALLOCATOR_ITEM_BYTES,
                bytes=slots * SLOT_ALLOCATOR_ITEM_BYTES,
                sglang_charged=False,
                owner=owner,
                unit=STATE_SLOT,
            )
        )
        pools.append(allocator_pool(full, page))
        pools.append(allocator_pool(swa, page, token_space=SWA_TOKENS, name=SWA_ALLOCATOR, owner=owner))
        return pools, requests, note

    notes: list[str] = []
    if serving.accounting == "sglang":
        if split.kv_rest_gib <= 0:
            raise _no_memory_left(model, split, budget)
        profiled = sglang_tokens(split.kv_budget_bytes, shape.cell + (mtp.cell_extra if mtp else 0), page)
        if serving.enable_unified_memory:  # calculate_pool_sizes' unified branch: the largest fitting full capacity
            profiled = max_unified_full_tokens(
                split.kv_budget_bytes,
                page,
                full_bytes_per_token=shape.full_per_token * shape.num_full,
                swa_bytes_per_token=shape.swa_per_token * shape.num_swa,
                swa_full_tokens_ratio=shape.ratio,
            )
    else:
        fixed = (k + 1) * per_slot + k * SLOT_ALLOCATOR_ITEM_BYTES
        if mtp is not None:
            fixed += len(mtp.heads) * mtp.head_state_bytes(k)
        if fixed > budget.budget_bytes:
            raise _no_memory_left(model, split, budget, exact_fixed=fixed)
        per_full = per_token[FULL_POOL] + shape.ratio * per_token[SWA_POOL]
        if mtp is not None:  # each head's one layer (and a banded head's mapping) per full token
            per_full += sum(mtp.head_kv_bytes(2, 0).values()) - sum(mtp.head_kv_bytes(1, 0).values())
        upper = int((budget.budget_bytes - fixed) // max(1.0, per_full))
        profiled = largest_fitting_tokens(
            budget.budget_bytes, page, upper, lambda t: sum(p.bytes for p in layout(t)[0])
        )
    total, cap_note = apply_token_cap(profiled, serving.max_total_tokens)
    if cap_note:
        notes.append(cap_note)
    full, swa = tokens_of(total)
    if full <= 0:
        raise not_enough_memory(model, serving, cell, attrs.evolve(budget, budget_bytes=max(0, split.kv_budget_bytes)))
    if swa <= 0:
        raise InsufficientMemoryError(
            f"The SWA pool of {model.name} would get {swa} tokens, less than one page of {page}: "
            f"int({full} full tokens x {option('swa_full_tokens_ratio')} {shape.ratio}) rounds to nothing. "
            f"Raise {option('memory')} or {option('swa_full_tokens_ratio')}, or lower {option('page_size')}."
        )
    window = int(model.params["sliding_window"])
    if serving.accounting == "sglang" and not serving.enable_unified_memory and window + page >= swa:
        raise InsufficientMemoryError(  # HybridSWAPoolConfigurator.validate_swa_pool_size (pool_configurator.py)
            f"The SWA pool of {model.name} ({swa} tokens) cannot hold even one request: the prefill admission floor "
            f"is sliding_window_size ({window}) + page_size ({page}). Raise {option('swa_full_tokens_ratio')} or "
            f"{option('memory')}."
        )
    pools, requests, note = layout(total)
    if note:
        notes.append(note)
    if requests <= 0:
        raise InsufficientMemoryError(
            f"The short-conv state cache of {model.name} is too small to serve any request: "
            f"max_mamba_cache_size={k}, {split.ratio} state slot(s) per request, resulting max_running_requests="
            f"{requests}. Raise {option('memory')} or {option('mamba_full_memory_ratio')}, or lower "
            f"{option('max_running_requests')}."
        )
    slots = decode_state_slots(k, requests, serving)
    if serving.enable_mamba_extra_buffer and not pinned:
        notes.append(
            f"{option('enable_mamba_extra_buffer')}: SGLang 0.5.23 serves Inkling with the extra-buffer state strategy "
            "whenever the radix cache is on (_inkling_overrides in arg_groups/model_overrides/inkling.py pins "
            "--mamba-radix-cache-strategy extra_buffer): planned with it"
        )
    if mtp is not None:
        notes.append(
            f"{option('enable_multi_layer_eagle')}: SGLang's budget charges num_nextn_predict_layers = "
            f"{mtp.draft_layers} draft layer(s) per full token ({mtp.budget_full_layers} full x "
            f"{mtp.full_per_token:,} B + {mtp.budget_swa_full_layers} full-capacity SWA x {mtp.swa_per_token:,} B = "
            f"{mtp.cell_extra:,} B, HybridSWAPoolConfigurator._recompute_cell_size); the draft builds one MTP head "
            f"per draft step ({len(mtp.heads)}, {len(mtp.banded_heads)} banded), each one layer of "
            f"{full:,} + {page} rows and a short-conv state pool of {k} + 1 slots of its own (clone_with_new_mamba, "
            "outside the budget)"
        )
    if serving.speculative:
        notes.append(
            f"the target's intermediate conv windows: {d} draft token(s) x {per_slot:,} B per request row "
            f"({spec_state_rows(requests, serving)} + 1 rows; dense, InklingConvStateShape turns the dedup off), "
            f"{split.intermediate_bytes:,} B charged by _handle_max_mamba_cache"
        )
    notes += [
        f"Inkling three-pool stack (SGLang's SWAKVPool + HybridReqToTokenPool): the short-conv state cache first, "
        f"{split.source}: K = {k} slots of {split.stage_per_req:,} B (+1 padding); the KV budget left "
        f"({split.kv_budget_bytes:,} B) split by {option('swa_full_tokens_ratio')} {shape.ratio}: "
        f"{full:,} full tokens, SWA tokens = int(full x {shape.ratio}) page aligned = {swa:,}",
        f"the state cache admits at most max_mamba_cache_size // ratio = {k} // {split.ratio} = "
        f"{k // split.ratio} running requests",
    ]
    return PoolSizing(
        max_total_num_tokens=full,
        max_running_requests=requests,
        pools=pools,
        sglang_config={
            "max_total_num_tokens": full,
            "max_running_requests": requests,
            "full_max_total_num_tokens": full,
            "swa_max_total_num_tokens": swa,
            "max_mamba_cache_size": k,
        },
        sglang_estimate_bytes=full * shape.full_per_token * shape.num_full
        + swa * shape.swa_per_token * shape.num_swa
        + (full * mtp.cell_extra if mtp else 0)
        + split.state_bytes
        + split.intermediate_bytes,
        notes=notes,
        token_counts={FULL_TOKENS: full, SWA_TOKENS: swa},
        windows=(sliding_window_terms(SWA_TOKENS, int(model.params["sliding_window"]), serving),),
        state_slots=slots,
        state_slots_per_request=split.ratio,
    )


def state_pool(slots: int, per_slot: int, owner: str) -> PoolSpec:
    return PoolSpec(
        name=STATE_POOL,
        kind="state",
        slots=slots,
        padding_slots=1,
        bytes_per_slot=per_slot,
        bytes=(slots + 1) * per_slot,
        owner=owner,
        unit=STATE_SLOT,
    )


# ------------------------------------------------------------------------------------------- the built pools


def inkling_unified_sizing(
    model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, static: PoolSizing, *, owner: str
) -> PoolSizing:
    """``--enable-unified-memory``: SGLang's tri-pool (``_init_unified_mamba_swa_pools``): the state END grows up,
    the full END down, the SWA KV floats between them (:mod:`kvpools_core.parts.unified_tri`)."""
    config = static.sglang_config
    return unified_tri_sizing(
        static,
        serving,
        budget_bytes=budget.budget_bytes,
        token_budget_bytes=kv_budget_bytes(model, serving, budget),
        members=tri_members(model, serving, cell),
        drop=(SWA_MAPPING_POOL, "allocator", SWA_ALLOCATOR, SLOT_ALLOCATOR_POOL),
        owner=owner,
        model_name=model.name,
        context_len=serving.context_length or model.context_len,
        sliding_window=int(model.params["sliding_window"]),
        max_mamba_cache_size=int(config["max_mamba_cache_size"]),
        full_max_total_num_tokens=int(config["full_max_total_num_tokens"]),
        swa_max_total_num_tokens=int(config["swa_max_total_num_tokens"]),
    )


def kv_budget_bytes(model: ModelSpec, serving: Serving, budget: Budget) -> int:
    """SGLang's profiled KV budget after ``_handle_max_mamba_cache`` took the state cache out (bytes)."""
    serving = inkling_serving(serving)
    return split_budget(
        sglang_rest_gib(budget), serving, sglang_stage_per_req(model, serving), model.name, budget
    ).kv_budget_bytes


def tri_members(model: ModelSpec, serving: Serving, cell: CellSize) -> TriPoolMembers:
    """The tri-pool's entries under SGLang's sub-pool names: every full (sliding) layer of one token on this rank,
    token-major and rounded to 32 B, and the state of every layer of one slot."""
    start, end = rank_layer_range(model, serving)
    layers = model.layers[start:end]
    num_swa = sum(layer.kind == SLIDING for layer in layers)
    full = attrs.evolve(kv_entry_from_cell(cell, FULL_POOL, max(len(layers) - num_swa, 1)), name="full")
    swa = attrs.evolve(kv_entry_from_cell(cell, SWA_POOL, max(num_swa, 1)), name="swa")
    parts = state_entry_parts(sconv_state_shape(model, serving))
    state = attrs.evolve(state_entry_from_cell(cell, STATE_POOL, len(layers), parts), name="mamba")
    return TriPoolMembers(FULL_POOL, full, SWA_POOL, swa, STATE_POOL, state, SWA_TOKENS)
