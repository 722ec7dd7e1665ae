"""SGLang 0.5.23's ReplaySSM rings for linear-attention hybrids (Gated DeltaNet and KDA).

Two mutually exclusive server args drive one ring storage in ``MambaPool.__init__``
(``mem_cache/memory_pool.py``):

* ``--enable-linear-replayssm`` (the decode ring): per state slot (``size + 1`` rows), per recurrent layer,
  ``d (HV, L, V)`` and ``k (H_k, L, K)`` in the SSM dtype and a float32 gate ``g (HV, L)`` (KDA: ``(HV, L, K)``).
  ``_handle_max_mamba_cache`` does not charge it: it is allocated on top of SGLang's budget.
* ``--enable-linear-replayssm-spec`` (the spec-verify ring, GDN or KDA only; on any other hybrid SGLang passes
  it off, ``_build_hybrid_req_pool``): ``replayssm_ring_bytes_per_req(L)`` (``configs/mamba_utils.py``) per ring
  row. GDN keeps it per request row (``spec_state_size + 1`` rows), charged by ``_handle_max_mamba_cache`` as a
  fixed ``ring x (max_running_requests // dp + 1)``; KDA keeps it per state slot, charged per slot. Either way
  the speculative intermediate SSM state is not allocated (the conv windows stay) and the mamba budget reserves
  no intermediate state; the K solve is ``(budget - fixed - per_slot) // per_slot`` with ``per_slot`` the
  state plus the per-slot ring.

``HV`` = value heads per TP rank, ``H_k`` = ``num_k_heads_per_tp`` (key heads / groups per rank, rounded up),
``V`` / ``K`` the value / key head dims.  The rings' activation dtype is the conv dtype.
"""

from __future__ import annotations

import math

import attrs

from kvpools_core.dtypes import MODEL_DTYPES
from kvpools_core.options import option
from kvpools_core.values import ModelSpec, Serving

from .config import GDN, KDA
from .state import largest_stage_share, state_layer_ids, state_shape, state_tp_size

RING_POOL = "mamba_replayssm_ring"
FP32 = 4


@attrs.frozen
class RingGeometry:
    """One recurrent layer's ring dimensions on one TP rank."""

    hv: int
    h_k: int
    v_dim: int
    k_dim: int
    kda: bool


def replayssm_mixer(model: ModelSpec) -> bool:
    """Whether SGLang's ReplaySSM applies: a GDN (``hybrid_gdn_config``) or KDA (``hybrid_kda_config``) hybrid."""
    return model.params.get("mixer") in (GDN, KDA)


def spec_active(model: ModelSpec, serving: Serving) -> bool:
    """``replayssm_active`` of ``_handle_max_mamba_cache``: the spec flag on a GDN or KDA hybrid."""
    return serving.enable_linear_replayssm_spec and replayssm_mixer(model)


def ring_geometry(model: ModelSpec, serving: Serving) -> RingGeometry:
    geometry = model.params["state"]
    tp = state_tp_size(model, serving)
    if model.params["mixer"] == KDA:  # KimiLinearStateShape.create: K heads and dims default to V's
        heads, dim = geometry["num_heads"], geometry["head_dim"]
        return RingGeometry(heads // tp, math.ceil(heads / tp), dim, dim, kda=True)
    # Mamba2StateShape.create for GDN: temporal (HV, V, K), num_k_heads_per_tp = ceil(n_groups / tp)
    return RingGeometry(
        geometry["num_v_heads"] // tp,
        math.ceil(geometry["num_k_heads"] / tp),
        geometry["v_head_dim"],
        geometry["k_head_dim"],
        kda=False,
    )


def spec_ring_bytes_per_layer(model: ModelSpec, serving: Serving, conv_dtype: str) -> int:
    """``replayssm_ring_bytes_per_req(L)`` over one layer (``configs/mamba_utils.py``)."""
    g = ring_geometry(model, serving)
    length, conv = serving.linear_replayssm_cache_len, MODEL_DTYPES[conv_dtype]
    d = g.hv * length * g.v_dim * conv
    k = g.h_k * length * g.k_dim * conv
    if g.kda:  # rawv, rawk, beta, the per-K gate, d, k
        return d + k + g.hv * length * FP32 + g.hv * length * g.k_dim * FP32 + d + k
    per_layer = d + k + g.hv * length * FP32  # d, normalized k, scalar gate
    if conv_dtype != "float32":  # the low parts of d and k
        per_layer += d + k
    return per_layer


def decode_ring_bytes_per_layer(model: ModelSpec, serving: Serving, ssm_dtype: str) -> int:
    """The decode ring over one layer and one slot: d and k in the SSM dtype, the fp32 gate."""
    g = ring_geometry(model, serving)
    length, ssm = serving.linear_replayssm_cache_len, MODEL_DTYPES[ssm_dtype]
    gate = g.hv * length * (g.k_dim if g.kda else 1) * FP32
    return g.hv * length * g.v_dim * ssm + g.h_k * length * g.k_dim * ssm + gate


def sglang_spec_ring_per_req(model: ModelSpec, serving: Serving) -> int:
    """SGLang's charge: ``int(replayssm_ring_bytes_per_req(L) x pp_layer_scale)`` (the largest stage's share)."""
    per_layer = spec_ring_bytes_per_layer(model, serving, state_shape(model, serving).conv_dtype)
    return int(per_layer * len(state_layer_ids(model)) * largest_stage_share(model, serving))


def replayssm_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """SGLang 0.5.23's refusals (``arg_groups/attention_hook.py``, ``MambaPool``) and what kvpools does not model."""
    problems = []
    spec, ring = serving.enable_linear_replayssm_spec, serving.enable_linear_replayssm
    if spec and ring:
        problems.append(
            f"{option('enable_linear_replayssm_spec')} and {option('enable_linear_replayssm')} are mutually "
            "exclusive in SGLang: they share the ring storage but drive it with incompatible cursor protocols. "
            "Pass one."
        )
    if ring:
        if not replayssm_mixer(model):
            problems.append(
                f"kvpools does not model {option('enable_linear_replayssm')} on {model.name} yet: SGLang allocates "
                f"its decode ring for Gated DeltaNet and KDA hybrids, and this is a {model.params.get('mixer')} "
                "hybrid."
            )
        if serving.enable_mamba_extra_buffer and not serving.radix_cache_disabled:
            problems.append(
                f"{option('enable_linear_replayssm')} requires the no_buffer mamba strategy in SGLang (the "
                "extra_buffer ping-pong donation path is not yet supported): drop "
                f"{option('enable_mamba_extra_buffer')}."
            )
        if serving.disaggregation_mode != "null":
            problems.append(
                f"{option('enable_linear_replayssm')} is not supported under PD disaggregation in SGLang "
                f"({option('disaggregation_mode')} {serving.disaggregation_mode})."
            )
    if spec:
        if serving.speculative and serving.speculative_eagle_topk not in (None, 1):
            problems.append(
                f"{option('enable_linear_replayssm_spec')} requires a linear draft chain "
                f"({option('speculative_eagle_topk')} 1 or unset) in SGLang, got {serving.speculative_eagle_topk}."
            )
        if serving.disaggregation_mode == "prefill":
            problems.append(
                f"{option('enable_linear_replayssm_spec')} is not supported on a PD prefill server in SGLang: the "
                "ring is spec-verify-only scratch and the prefill server never runs spec verify."
            )
        algorithm = (serving.speculative_algorithm or "").upper() if serving.speculative else ""
        if algorithm in ("DSPARK", "DFLASH") and model.params.get("mixer") != KDA:
            # KVCacheConfigurator._build_hybrid_req_pool (ref-000 L1136-1145)
            problems.append(
                f"{option('enable_linear_replayssm_spec')} with DSPARK/DFLASH requires a KDA model; got a non-KDA "
                f"model ({model.name}), as SGLang refuses it."
            )
        if spec_active(model, serving):
            length = serving.linear_replayssm_cache_len
            if model.params["mixer"] == GDN and serving.max_running_requests is None:
                problems.append(
                    f"{option('enable_linear_replayssm_spec')} on a Gated DeltaNet hybrid sizes its ring from "
                    f"{option('max_running_requests')} (SGLang's _handle_max_mamba_cache reads it unchecked): "
                    f"pass {option('max_running_requests')}."
                )
            if model.params["mixer"] == KDA and length & (length - 1):
                problems.append(
                    f"SGLang's spec-verify ring length must be a power of two for KDA, got "
                    f"{option('linear_replayssm_cache_len')} {length}."
                )
            d = serving.speculative_num_draft_tokens if serving.speculative else None
            if model.params["mixer"] == KDA and d is not None and length < 2 * d:
                problems.append(
                    f"SGLang's spec-verify ring is too small for KDA: {option('linear_replayssm_cache_len')} "
                    f"{length} < 2 x {option('speculative_num_draft_tokens')} {d} (early-flush margin)."
                )
    return problems
