"""Speculative decoding: charge the draft model's KV cache in the target's cell size.

A new-style wrapper around ``estimate_cell_size``, so no architecture repeats
it.  SGLang scales the target's cell: EAGLE / EAGLE3 / STANDALONE / NEXTN by
``int(cell * (1 + D / L))``, the DFLASH family (DFLASH and DSPARK, ``is_dflash_family``) by
``ceil(cell * (L + D) / L)``; NGRAM writes no draft KV.  What SGLang's ``_handle_dspark`` refuses
or resolves for DSPARK is :func:`dspark_problems`.  That scaled cell is what ``--accounting sglang`` divides
the budget by, whatever the draft is.

What the draft really stores is added as ``draft_*`` token parts (pools of
their own, which the draft worker allocates with its own padding page).  With
a draft model of its own (``Serving.speculative_draft``, resolved by the
pipeline from ``--speculative-draft-model-path``) they are the token parts of
the draft's own cell, as its own architecture plugin estimated it, and the
cell records the difference from SGLang's scaling (``CellSize.draft``).
Without one (EAGLE heads, NEXTN MTP layers, ``--speculative-draft-num-layers``)
they are ``D`` layers of the target's per-layer geometry (SGLang's own
assumption; an architecture may name one draft layer's parts in
``CellSize.draft_layer_parts``).  Under ``--dcp-size k`` > 1 the
draft parts span ``k`` slots per token (``CellPart.slot_scale``): SGLang's draft worker keeps replicated pools
over the allocator's ``k x max_total`` virtual slots in pages of ``k x page`` (``loc_space_scale``,
``000_fbd4f47288598fb9.txt`` lines 405-433), which its cell size never counts.  Only token parts are added: the
target's per-request, per-state-slot and fixed parts stay as they are (the draft worker
shares the target's request table and keeps no recurrent state of its own).
Under ``--enable-hierarchical-cache`` it also places the ``draft_*`` pools in
the host tier as SGLang's draft plan does (:func:`host_mirrors`): packed into
the target's host rows for an MTP draft, a sidecar on the target's host slots
otherwise.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

import attrs

from kvpools_core import hookimpl
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.names import DRAFT_PREFIX, packs_draft_into_host
from kvpools_core.values import (
    SGLANG_ACCOUNTING_MODES,
    TOKEN,
    CellPart,
    CellSize,
    DraftCharge,
    EngineDefault,
    ModelSpec,
    PackedInto,
    Plan,
    Serving,
)

EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "STANDALONE", "NEXTN"})
DFLASH_FAMILY = frozenset({"DFLASH", "DSPARK"})
"""SGLang's ``is_dflash_family()`` (``speculative/spec_info.py``): DFLASH and DSPARK scale the cell alike
(``002_50706b73e02ffb67.txt`` lines 159-175)."""
DSPARK_PLATFORMS = frozenset({"cuda", "rocm", "ascend"})
"""Platforms whose SGLang device ``_handle_dspark`` accepts (cuda, npu, xpu; ROCm runs as ``cuda``)."""
DEFAULT_DSPARK_GAMMA = 7
"""SGLang 0.5.23's ``DEFAULT_DSPARK_GAMMA`` (``speculative/dspark_components/dspark_config.py``)."""


@hookimpl(wrapper=True)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> Generator[None, CellSize | None, CellSize | None]:
    cell = yield
    if cell is None:
        return cell
    if cell.draft_included:
        if serving.speculative_draft is not None and _has_draft_kv(serving):
            raise UnsupportedCombinationError(
                f"{model.name} (architecture {model.architecture!r}) sizes its draft layers in its own pools, in its "
                f"own geometry; kvpools does not model a draft model of its own ({option('draft_model')} "
                f"{serving.speculative_draft.model.name}) beside them. Pass {option('speculative_draft_num_layers')} "
                f"{serving.speculative_draft.model.num_layers} instead."
            )
        return cell
    return with_draft(cell, serving)


def _has_draft_kv(serving: Serving) -> bool:
    return serving.speculative_algorithm in EAGLE_FAMILY | DFLASH_FAMILY and bool(serving.speculative_draft_num_layers)


def sglang_draft_cell(cell_bytes: float, layers: int, draft_layers: int, algorithm: str) -> float:
    """SGLang's cell with the draft: ``pool_configurator.py`` (``002_50706b73e02ffb67.txt`` lines 148-175)."""
    if algorithm in EAGLE_FAMILY:
        return float(int(cell_bytes * (1 + draft_layers / layers)))
    return float(-(-int(cell_bytes) * (layers + draft_layers) // layers))


def with_draft(cell: CellSize, serving: Serving) -> CellSize:
    """The cell with the draft model's KV added (unchanged without draft KV)."""
    algorithm = serving.speculative_algorithm
    draft_layers = serving.speculative_draft_num_layers or 0
    layers = cell.num_layers
    if algorithm is None or not _has_draft_kv(serving) or layers <= 0:
        return cell
    sglang = sglang_draft_cell(cell.sglang_bytes_per_token, layers, draft_layers, algorithm)
    own = serving.speculative_draft
    charge = None
    if own is not None:  # a draft model of its own: its own architecture's token parts
        draft_parts = tuple(_draft_part(part, part.bytes_per_token) for part in own.cell.parts_of(TOKEN))
        charge = DraftCharge(
            model=own.model.name,
            architecture=own.model.architecture,
            num_layers=draft_layers,
            exact_bytes_per_token=own.cell.bytes_per_token,
            own_sglang_bytes_per_token=own.cell.sglang_bytes_per_token,
            target_sglang_bytes_per_token=cell.sglang_bytes_per_token,
            sglang_bytes_per_token=sglang,
        )
        note = (
            f"{algorithm} draft {own.model.name} ({own.model.architecture}): {draft_layers} layer(s) of its own "
            f"geometry, {own.cell.bytes_per_token:,} B/token; SGLang's scaling charges "
            f"{charge.sglang_draft_bytes_per_token:,.0f} B/token ({draft_layers} of the target's {layers} layers)"
        )
    elif cell.draft_layer_parts:  # the architecture says what one draft layer stores
        one_layer = tuple(part for part in cell.draft_layer_parts if part.unit == TOKEN)
        draft_parts = tuple(_draft_part(part, part.bytes_per_token * draft_layers) for part in one_layer)
        note = f"{algorithm} draft: {draft_layers} layer(s) beside the target's {layers}"
    else:
        draft_parts = tuple(
            _draft_part(part, -(-part.bytes_per_token * draft_layers // layers)) for part in cell.parts_of(TOKEN)
        )
        note = f"{algorithm} draft: {draft_layers} layer(s) beside the target's {layers}"
    notes = (*cell.notes, note)
    if serving.dcp_size > 1:
        draft_parts = tuple(attrs.evolve(part, slot_scale=serving.dcp_size) for part in draft_parts)
        notes += (_dcp_note(draft_parts, serving),)
    return attrs.evolve(
        cell,
        parts=cell.parts + draft_parts,
        sglang_bytes_per_token=sglang,
        draft_included=True,
        draft=charge,
        notes=notes,
    )


def _dcp_note(draft_parts: tuple[CellPart, ...], serving: Serving) -> str:
    """Why the draft pools hold ``dcp`` times the tokens, and what SGLang's estimate misses of them."""
    dcp = serving.dcp_size
    per_token = sum(part.bytes_per_token for part in draft_parts)
    return (
        f"{option('dcp_size')} {dcp}: the draft worker's pools are replicated, not DCP-sharded, and address the "
        f"shared allocator's {dcp} x max_total_num_tokens virtual slots untranslated (SGLang's loc_space_scale), "
        f"so they hold {dcp} x (tokens + page) rows in pages of {dcp} x {option('page_size')}: "
        f"{per_token * dcp:,} B per token where SGLang's cell size counts {per_token:,} B; its estimate leaves the "
        f"other {per_token * (dcp - 1):,} B/token out"
    )


def _draft_part(part: CellPart, bytes_per_token: int) -> CellPart:
    """The draft pool's copy of a part (same layout, ``draft_`` names)."""
    return attrs.evolve(part, name=f"draft_{part.name}", bytes_per_token=bytes_per_token, pool=f"draft_{part.pool}")


@hookimpl(wrapper=True)
def host_mirrors(plan: Plan) -> Generator[None, Mapping[str, str | PackedInto | None] | None, object]:
    """Place the draft worker's pools (``draft_<pool>``) in the host tier as SGLang's ``_build_hicache_draft_plan``.

    Packed (:func:`packs_draft_into_host`): each draft pool's rows join its
    target pool's host rows (``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost``
    / ``DSAIndexerPoolHost`` ``draft_buffer_infos``, ``layer_num = target +
    drafts``), so the host pool's bytes per token grow and its slots keep the
    target's sizing.  Sidecar (``build_full_draft_pools``,
    ``hybrid_cache/hybrid_pool_assembler.py``): a draft host pool of its own
    with ``host_token_capacity`` = the target's host slots (no share of
    ``--hicache-size``, no padding page), i.e. riding on the target's host pool;
    a draft indexer lays out whole pages with slack on those slots.  Only
    token pools are placed: the draft keeps no recurrent state of its own.
    """
    answer = yield
    if answer is None or not plan.serving.speculative:
        return answer
    mirrors = dict(answer)
    pools = {pool.name: pool for pool in plan.pools}
    packed = packs_draft_into_host(plan.model, plan.serving)
    for name, pool in pools.items():
        if not name.startswith(DRAFT_PREFIX) or pool.unit != TOKEN:
            continue
        mirrors.pop(name, None)
        target = _draft_target(name.removeprefix(DRAFT_PREFIX), pool.token_space, plan, mirrors)
        if target is None:
            continue
        if packed:
            mirrors[name] = PackedInto(target)
        else:
            anchor = mirrors[target]
            mirrors[name] = anchor if isinstance(anchor, str) else target
    return mirrors


def _draft_target(
    target: str, token_space: str, plan: Plan, mirrors: Mapping[str, str | PackedInto | None]
) -> str | None:
    """The mirrored pool a draft pool follows: its namesake, else the first own host pool of its token space."""
    if target in mirrors and not isinstance(mirrors[target], PackedInto):
        return target
    return next(
        (
            pool.name
            for pool in plan.pools
            if pool.name in mirrors
            and mirrors[pool.name] is None
            and pool.unit == TOKEN
            and pool.token_space == token_space
        ),
        None,
    )


SPECULATIVE_MAX_RUNNING_REQUESTS = 48
"""SGLang 0.5.23's ``--max-running-requests`` for speculative decoding when it is unset: every in-tree algorithm's
handler declares it (``arg_groups/speculative_hook.py``: ``_handle_dflash`` lines 439-447, ``_handle_dspark``
853-861, ``_handle_eagle_family`` (EAGLE, EAGLE3, STANDALONE; NEXTN is EAGLE by then) 1087-1095,
``_handle_ngram`` 1295-1303), on every platform it accepts, warning "Max running requests is reset to 48 for
speculative decoding"."""


@hookimpl(trylast=True)
def engine_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault] | None:
    """SGLang's speculative ``--max-running-requests`` default (:data:`SPECULATIVE_MAX_RUNNING_REQUESTS`) and the
    draft parameters its handlers choose when they are unset (:func:`speculative_parameter_defaults`).

    ``trylast``: a model default declared earlier in SGLang's pipeline (DeepSeek-V4's 256 in
    ``handle_model_specific_adjustments``) leaves the option set, so the speculative hook keeps it; dispatched
    last, this answer only fills what no architecture or platform answered.  SGLang's accountings only: vLLM and
    TensorRT-LLM keep their own request limits with speculative decoding.
    """
    if not serving.speculative or serving.accounting not in SGLANG_ACCOUNTING_MODES:
        return None
    return [
        EngineDefault(
            option="max_running_requests",
            value=SPECULATIVE_MAX_RUNNING_REQUESTS,
            reason=(
                f"SGLang 0.5.23 resets it to {SPECULATIVE_MAX_RUNNING_REQUESTS} for speculative decoding "
                f"({serving.speculative_algorithm}; arg_groups/speculative_hook.py)"
            ),
        ),
        *speculative_parameter_defaults(model, serving),
    ]


AUTO_PARAMS_WIDE = (5, 4, 8)
AUTO_PARAMS = (3, 1, 4)
AUTO_PARAMS_WIDE_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})
"""SGLang 0.5.23's ``_auto_choose_speculative_params`` (``arg_groups/speculative_hook.py`` lines 1430-1461):
(steps, top-k, draft tokens) = (5, 4, 8) for these target architectures, (3, 1, 4) for every other one and for
STANDALONE whatever the target."""
TOPK_ASSERTED_FIRST = frozenset({"DeepseekV4ForCausalLM"})
"""Target architectures whose model hook asserts on the top-k as given before the speculative hook could choose
one (``apply_deepseek_v4_defaults``, ``arg_groups/deepseek_v4_hook.py`` lines 155-158): no auto-chosen
parameters, the architecture's plugin refuses an unset top-k."""
NGRAM_MAX_BFS_BREADTH = 10
"""SGLang 0.5.23's ``--speculative-ngram-max-bfs-breadth`` default, which ``_handle_ngram`` makes the top-k
whatever was given (``arg_groups/speculative_hook.py`` lines 1306-1310); kvpools has no such option."""
NGRAM_DRAFT_TOKENS = 12
"""``_handle_ngram``'s ``--speculative-num-draft-tokens`` when unset (lines 1311-1320)."""
DFLASH_DEFAULT_BLOCK_SIZE = 16
"""``_handle_dflash``'s draft tokens when the draft checkpoint names no ``block_size`` (lines 377-408)."""
_SPEC_HOOK = "arg_groups/speculative_hook.py"


def speculative_parameter_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault]:
    """What SGLang 0.5.23's speculative handlers set for unset ``--speculative-num-steps`` /
    ``--speculative-eagle-topk`` / ``--speculative-num-draft-tokens`` (issue 32), before it sizes anything.

    * EAGLE family (EAGLE, EAGLE3, STANDALONE, NEXTN; ``_handle_eagle_family`` lines 1163-1179): with all three
      unset, ``_auto_choose_speculative_params`` (:data:`AUTO_PARAMS`); with the steps given and top-k 1, draft
      tokens = steps + 1 (lines 1247-1257).  The combinations SGLang asserts on or crashes on are refused
      (:func:`speculative_parameter_problems`).  Adaptive speculation resolves its own
      (:func:`kvpools_core.values.serving.resolve_adaptive_speculation`, which runs before these handlers).
    * NGRAM (``_handle_ngram`` lines 1306-1326): top-k :data:`NGRAM_MAX_BFS_BREADTH`, draft tokens
      :data:`NGRAM_DRAFT_TOKENS`, steps = draft tokens // top-k.
    * DFLASH (``_handle_dflash`` lines 325-360): steps and top-k 1.  Its draft tokens come from the draft
      checkpoint, which kvpools does not read: unset, they are refused.
    """
    if serving.adaptive_speculation:
        return []
    algorithm = serving.speculative_algorithm
    steps, topk, draft = (
        serving.speculative_num_steps,
        serving.speculative_eagle_topk,
        serving.speculative_num_draft_tokens,
    )
    chosen: dict[str, tuple[int, str]] = {}
    if algorithm in EAGLE_FAMILY:
        arch = model.hf_architectures[0] if model.hf_architectures else ""
        if steps is None and topk is None and draft is None and arch not in TOPK_ASSERTED_FIRST:
            wide = algorithm != "STANDALONE" and arch in AUTO_PARAMS_WIDE_ARCHITECTURES
            auto = AUTO_PARAMS_WIDE if wide else AUTO_PARAMS
            why = (
                f"SGLang 0.5.23's _auto_choose_speculative_params picks (steps, top-k, draft tokens) = {auto} for "
                f"{algorithm} on {arch or model.architecture} when {option('speculative_num_steps')} is unset "
                f"({_SPEC_HOOK})"
            )
            for name, value in zip(
                ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"), auto, strict=True
            ):
                chosen[name] = (value, why)
            steps, topk, draft = auto
        if topk == 1 and steps is not None and draft is None:
            chosen["speculative_num_draft_tokens"] = (
                steps + 1,
                f"SGLang 0.5.23 sets it to {option('speculative_num_steps')} + 1 with top-k 1 (_handle_eagle_family)",
            )
    elif algorithm == "NGRAM":
        if topk is None:
            chosen["speculative_eagle_topk"] = (
                NGRAM_MAX_BFS_BREADTH,
                f"SGLang 0.5.23's _handle_ngram sets it to --speculative-ngram-max-bfs-breadth "
                f"({NGRAM_MAX_BFS_BREADTH} by default)",
            )
        if draft is None:
            draft = NGRAM_DRAFT_TOKENS
            chosen["speculative_num_draft_tokens"] = (draft, "SGLang 0.5.23's _handle_ngram default")
        if steps is None and draft // NGRAM_MAX_BFS_BREADTH > 0:
            chosen["speculative_num_steps"] = (
                draft // NGRAM_MAX_BFS_BREADTH,
                f"SGLang 0.5.23's _handle_ngram sets it to draft tokens // top-k = {draft} // {NGRAM_MAX_BFS_BREADTH}",
            )
    elif algorithm == "DFLASH":
        for name, given in (("speculative_num_steps", steps), ("speculative_eagle_topk", topk)):
            if given is None:
                chosen[name] = (1, "SGLang 0.5.23's _handle_dflash forces it to 1")
    return [EngineDefault(option=name, value=value, reason=reason) for name, (value, reason) in chosen.items()]


def speculative_parameter_problems(serving: Serving) -> list[str]:
    """What SGLang 0.5.23's speculative handlers refuse, crash on, or override of the draft parameters as given
    (after :func:`speculative_parameter_defaults`).  An override of a given value is refused, naming the value
    SGLang would use, as :func:`dspark_problems` does: the plan would otherwise be of options SGLang does not
    run."""
    if serving.accounting not in SGLANG_ACCOUNTING_MODES or serving.adaptive_speculation:
        return []
    o = option
    algorithm = serving.speculative_algorithm
    steps, topk, draft = (
        serving.speculative_num_steps,
        serving.speculative_eagle_topk,
        serving.speculative_num_draft_tokens,
    )
    problems = []
    if algorithm in EAGLE_FAMILY:
        if steps is None:
            problems.append(
                f"{o('speculative_algorithm')} {algorithm} with {o('speculative_eagle_topk')} {topk} and "
                f"{o('speculative_num_draft_tokens')} {draft} but no {o('speculative_num_steps')}: SGLang 0.5.23 "
                f"asserts that top-k and draft tokens are unset when the steps are (_handle_eagle_family, which "
                f"then chooses all three). Pass {o('speculative_num_steps')}, or leave all three unset."
            )
        elif topk is None:
            problems.append(
                f"{o('speculative_algorithm')} {algorithm} with {o('speculative_num_steps')} {steps} and no "
                f"{o('speculative_eagle_topk')}: SGLang 0.5.23's _handle_eagle_family fails on it (it compares "
                f"the unset top-k with 1). Pass {o('speculative_eagle_topk')}, or leave all three unset."
            )
        elif topk == 1 and draft is not None and draft != steps + 1:
            problems.append(
                f"{o('speculative_algorithm')} {algorithm} with {o('speculative_eagle_topk')} 1 and "
                f"{o('speculative_num_draft_tokens')} {draft}: SGLang 0.5.23 adjusts it to "
                f"{o('speculative_num_steps')} + 1 = {steps + 1} with a warning ('speculative_num_draft_tokens is "
                f"adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1'). Pass "
                f"{o('speculative_num_draft_tokens')} {steps + 1} or leave it unset."
            )
    elif algorithm == "NGRAM":
        if topk is not None and topk != NGRAM_MAX_BFS_BREADTH:
            problems.append(
                f"{o('speculative_algorithm')} NGRAM with {o('speculative_eagle_topk')} {topk}: SGLang 0.5.23's "
                f"_handle_ngram replaces it with --speculative-ngram-max-bfs-breadth ({NGRAM_MAX_BFS_BREADTH} by "
                f"default), which kvpools does not model yet. Leave {o('speculative_eagle_topk')} unset or pass "
                f"{NGRAM_MAX_BFS_BREADTH}."
            )
        if steps is None and draft is not None and draft < NGRAM_MAX_BFS_BREADTH:
            problems.append(
                f"{o('speculative_algorithm')} NGRAM with {o('speculative_num_draft_tokens')} {draft} and no "
                f"{o('speculative_num_steps')}: SGLang 0.5.23 sets the steps to {draft} // "
                f"{NGRAM_MAX_BFS_BREADTH} = 0, which kvpools does not model yet. Pass "
                f"{o('speculative_num_steps')}."
            )
    elif algorithm == "DFLASH":
        for name, value in (("speculative_eagle_topk", topk), ("speculative_num_steps", steps)):
            if value not in (None, 1):
                problems.append(
                    f"{o('speculative_algorithm')} DFLASH with {o(name)} {value}: SGLang 0.5.23 overrides it to 1 "
                    f"with a warning ('DFLASH only supports {name} == 1'), which kvpools does not model. Pass "
                    f"{o(name)} 1 or leave it unset."
                )
        if draft is None:
            problems.append(
                f"{o('speculative_algorithm')} DFLASH without {o('speculative_num_draft_tokens')}: SGLang 0.5.23 "
                f"resolves it to the draft checkpoint's block_size ({DFLASH_DEFAULT_BLOCK_SIZE} when it names "
                f"none; _handle_dflash), which kvpools does not read. Pass {o('speculative_num_draft_tokens')} "
                f"the draft's block size (e.g. {DFLASH_DEFAULT_BLOCK_SIZE})."
            )
    return problems


@hookimpl
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    return [
        *dspark_problems(serving),
        *speculative_parameter_problems(serving),
        *_hicache_draft_problems(model, serving),
        *_multi_layer_eagle_problems(model, serving),
    ] or None


MULTI_LAYER_EAGLE = frozenset({"EAGLE", "EAGLE3", "NEXTN"})
"""``SpeculativeAlgorithm.is_eagle`` (``speculative/spec_info.py``): the algorithms ``--enable-multi-layer-eagle``
switches to ``MultiLayerEagleWorkerV2``."""


MULTI_LAYER_EAGLE_FAMILIES = frozenset({"inkling"})
"""Model families (``ModelSpec.params["family"]``) whose architecture plugin plans SGLang's per-step draft runners
itself: the mamba plugin's Inkling-class MTP heads."""


def _multi_layer_eagle_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """``--enable-multi-layer-eagle`` changes nothing without an EAGLE-family algorithm (``spec_info.py`` picks
    ``MultiLayerEagleWorkerV2`` only when ``is_eagle()``): refused as an option that would change nothing; on a
    model whose plugin does not plan the per-step runners, refused as not modelled (never planned as one draft)."""
    if not serving.enable_multi_layer_eagle:
        return []
    if serving.speculative_algorithm in MULTI_LAYER_EAGLE:
        if model.params.get("family") in MULTI_LAYER_EAGLE_FAMILIES:
            return []
        return [
            f"kvpools does not model {option('enable_multi_layer_eagle')} for {model.name} (architecture "
            f"{model.architecture!r}) yet: SGLang 0.5.23 builds one draft runner per draft step "
            "(MultiLayerEagleWorkerV2), each with a KV pool of its own; kvpools plans it for Inkling-class MTP "
            f"heads only. Plan it without {option('enable_multi_layer_eagle')}."
        ]
    return [
        f"{option('enable_multi_layer_eagle')} changes nothing with {option('speculative_algorithm')} "
        f"{serving.speculative_algorithm}: SGLang 0.5.23 runs the multi-layer EAGLE worker only for EAGLE, EAGLE3 "
        f"or NEXTN. Pass one of those, or drop {option('enable_multi_layer_eagle')}."
    ]


def dspark_problems(serving: Serving) -> list[str]:
    """SGLang 0.5.23's ``_handle_dspark`` (``arg_groups/speculative_hook.py``) on the options kvpools has.

    Refused as SGLang refuses them: a device other than CUDA / NPU / XPU
    ('DSpark speculative decoding only supports CUDA, NPU or XPU device.'),
    pipeline parallelism outside a PD prefill node, context-parallel attention
    under DP attention, and fewer than 2 draft tokens (gamma + 1).  What
    SGLang resolves and kvpools does not model is refused too, naming the
    value SGLang would pick: a top-k or step count other than 1 (overridden to
    1 with a warning), and unset ``--speculative-num-draft-tokens`` (``gamma +
    1`` from ``--speculative-dspark-block-size`` or the draft checkpoint's
    ``block_size``, 8 by default).
    """
    if serving.speculative_algorithm != "DSPARK":
        return []
    o = option
    problems = []
    if serving.platform not in DSPARK_PLATFORMS:
        problems.append(
            f"{o('speculative_algorithm')} DSPARK on the {serving.platform} platform: SGLang raises 'DSpark "
            "speculative decoding only supports CUDA, NPU or XPU device.' (_handle_dspark). Use a GPU platform or "
            "another speculative algorithm."
        )
    if serving.pp_size != 1 and serving.disaggregation_mode != "prefill":
        problems.append(
            f"{o('speculative_algorithm')} DSPARK with {o('pp_size')} {serving.pp_size}: SGLang raises 'DSpark "
            "pipeline parallelism requires PD prefill; decode and non-disaggregated serving require pp_size == 1.' "
            f"Use {o('pp_size')} 1 or {o('disaggregation_mode')} prefill."
        )
    if serving.attn_dp_size > 1 and serving.attn_cp_size > 1:
        problems.append(
            f"{o('speculative_algorithm')} DSPARK with DP attention and {o('attn_cp_size')} {serving.attn_cp_size}: "
            f"SGLang raises 'DSpark with dp attention does not support context parallel (attn_cp_size="
            f"{serving.attn_cp_size}).' Drop one of them."
        )
    for name, value in (
        ("speculative_eagle_topk", serving.speculative_eagle_topk),
        ("speculative_num_steps", serving.speculative_num_steps),
    ):
        if value not in (None, 1):
            problems.append(
                f"{o('speculative_algorithm')} DSPARK with {o(name)} {value}: SGLang overrides it to 1 with a "
                f"warning ('DSpark only supports {name} == 1'), which kvpools does not "
                f"model. Pass {o(name)} 1 or leave it unset."
            )
    draft_tokens = serving.speculative_num_draft_tokens
    if draft_tokens is None:
        problems.append(
            f"{o('speculative_algorithm')} DSPARK without {o('speculative_num_draft_tokens')}: SGLang resolves it to "
            f"gamma + 1 from --speculative-dspark-block-size or the draft checkpoint's block_size "
            f"({DEFAULT_DSPARK_GAMMA + 1} with the default gamma {DEFAULT_DSPARK_GAMMA}), which kvpools does not read. "
            f"Pass {o('speculative_num_draft_tokens')} gamma + 1 (e.g. {DEFAULT_DSPARK_GAMMA + 1})."
        )
    elif draft_tokens < 2:
        problems.append(
            f"{o('speculative_algorithm')} DSPARK with {o('speculative_num_draft_tokens')} {draft_tokens}: SGLang "
            f"raises 'DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), got {draft_tokens}.' Pass "
            f"{o('speculative_num_draft_tokens')} 2 or more."
        )
    return problems


def _hicache_draft_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang refuses of a sidecar draft host pool (``build_full_draft_pools``): more draft layers than the
    target's stage transfers ('Draft HiCache layers exceed the target transfer stages'), and, under DCP, a draft
    sized over the target's *logical* host slots (replicated over the DCP ranks), which kvpools does not model."""
    if not (serving.enable_hierarchical_cache and serving.speculative) or serving.speculative_algorithm == "NGRAM":
        return []
    if packs_draft_into_host(model, serving):
        return []
    problems = []
    start, end = rank_layer_range(model, serving)
    draft_layers = serving.speculative_draft_num_layers or 0
    if draft_layers > end - start:
        problems.append(
            f"{option('enable_hierarchical_cache')} with {draft_layers} draft layer(s) on a stage of {end - start}: "
            f"SGLang raises 'Draft HiCache layers exceed the target transfer stages' (build_full_draft_pools). "
            f"Lower {option('pp_size')} or drop {option('enable_hierarchical_cache')}."
        )
    if serving.dcp_size > 1:
        problems.append(
            f"{option('enable_hierarchical_cache')} with {option('dcp_size')} {serving.dcp_size} and "
            f"{option('speculative_algorithm')} {serving.speculative_algorithm}: SGLang's sidecar draft host pool "
            f"spans the target's logical host slots (replicated over the DCP ranks), which kvpools does not model. "
            f"Use {option('dcp_size')} 1, or a NEXTN draft (packed into the target's host pool)."
        )
    return problems
