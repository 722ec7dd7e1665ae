"""The layer specs vLLM 0.33 builds for a Mamba / linear-attention hybrid (``--accounting vllm``).

Line numbers are vLLM 0.33.0's.  Each recurrent layer's ``MambaBase.get_kv_cache_spec``
(``model_executor/layers/mamba/abstract.py`` L72-91) answers a ``MambaSpec`` of its state shapes and dtypes
(``mamba_utils.py``: ``MambaStateShapeCalculator`` L152-319, ``MambaStateDtypeCalculator`` L53-149), each
attention layer a ``FullAttentionSpec``.  What the engine decides before the specs are built:

* ``vllm serve`` enables prefix caching for hybrid models (``ModelConfig.is_prefix_caching_supported``,
  ``config/model.py`` L2277), so ``MambaModelConfig.verify_and_update_config`` (``models/config.py`` L750-787)
  sets ``mamba_cache_mode = "align"`` and ``mamba_block_size = block_size``.
* ``Platform._align_hybrid_block_size`` (``platforms/interface.py`` L940-1132) grows the attention block until
  an attention page holds a Mamba state and pads the Mamba page to it
  (:func:`kvpools_core.parts.vllm.layers.align_hybrid_block_size`).  The backend is CUDA's default on Hopper:
  FlashAttention for the attention layers (kernel blocks ``MultipleOf(16)``, ``flash_attn.py`` L357-367) and,
  for Gated DeltaNet, FlashInfer's prefill (``qwen_gdn_linear_attn.py`` L246-267), which in ``align`` mode
  exports one prefill checkpoint per request on a 64-token grid (L688-750, ``gdn_attn.py`` L34): one more
  Mamba block per request and blocks a multiple of 64 tokens.  On a GPU without FlashInfer's GDN kernel
  (before Hopper) vLLM runs Triton instead and the checkpoint is absent.
* Every Mamba2 layer (``MambaMixer2``: Nemotron-H, Falcon-H1, Granite-4.0-H) declares one prefill checkpoint block
  too, whatever the backend or GPU (``MambaMixer2.get_kv_cache_spec``, ``mamba_mixer2.py`` L1108-1118, alignment 1:
  no effect on the block size); in ``align`` mode a request holds ``2 + 1`` Mamba blocks
  (``MambaSpec.max_memory_usage_bytes``, ``v1/kv_cache_interface.py`` L1135-1141).  Mamba-1 (Jamba) declares none.
* The conv state's dtype is the model dtype (``--mamba-cache-dtype auto``), the SSM state's the config's
  where vLLM reads one (``config.py`` ``_vllm_readings``), else the conv's.  ``--kv-cache-dtype`` does not
  change the state.
* The state is sharded over the whole TP group (``tensor_parallel_size``; vLLM's ``divide`` asserts it
  divides); no speculative decoding under ``--accounting vllm``, so ``num_speculative_blocks`` is 0.

Kimi-Linear (``KimiLinearForCausalLM``) is served by ``vllm.models.kimi_k3`` (``registry.py`` L148-151), whose
CUDA entry is ``nvidia/model.py`` (``kimi_k3/__init__.py`` L35-36): each KDA layer is
``KimiGatedDeltaNetAttention`` (``layers/mamba/gdn/kimi_gdn_linear_attn.py``, ``KimiDecoderLayer`` L716-732), a
``gdn_attn`` Mamba layer of ``kda_state_shape`` (``mamba_utils.py`` L296-319: conv ``3 x num_heads x head_dim / TP``
wide, recurrent ``(num_heads / TP, head_dim, head_dim)``) in ``kda_state_dtype`` (L133-149: conv in the model dtype,
recurrent float32), with a Triton prefill only (``kimi_gdn_linear_attn.py`` L279-288), so no prefill checkpoint;
each other layer is ``MultiHeadLatentAttention`` (``nvidia/mla.py`` L421-436), an ``MLAAttentionSpec`` of one
``kv_lora_rank + qk_rope_head_dim`` latent row per token.
``ModelConfig.use_mla`` holds (``kimi_linear`` in ``is_deepseek_mla``), so ``_align_hybrid_block_size`` sizes the
attention page from the latent row and keeps blocks a multiple of 128 tokens; the MLA backend on Hopper is
FlashAttention-MLA (``MultipleOf(16)``) for a 16-bit cache or FlashMLA (64) for fp8 (``platforms/cuda.py``
L149-155), both dividing 128, so the kernel choice never moves the block size.  Refused with the reason:
``use_full_rank_gate`` configs (Kimi-K3's ``KimiK3DeltaAttention``, whose FlashKDA prefill checkpoint depends on
the GPU, ``nvidia/kda.py`` L363-379, L901-909), ``mla_use_nope`` false (vLLM asserts it), caches no Hopper MLA
backend takes, and non-CUDA platforms (ROCm / XPU build ``kimi_k3/amd/linear.py``).  On Blackwell, vLLM's
attention backend and FA4's 128-token hd256 pages differ from Hopper's: not modelled either.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kvpools_core.dtypes import MODEL_DTYPES, resolve_kv_dtype
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.vllm.layers import (
    align_hybrid_block_size,
    kv_element_bytes,
    kv_heads_per_rank,
    latent_kv_cache_spec,
)
from kvpools_core.parts.vllm.specs import FullAttentionSpec, KVCacheSpec, MambaSpec

from .config import GDN, KDA, KV_KINDS, MAMBA1, MAMBA2, STATE_KINDS

if TYPE_CHECKING:
    from kvpools_core.values import LayerSpec, ModelSpec, Serving

VLLM_VERSION = "0.33.0"
MAMBA_CACHE_MODE = "align"
"""``mamba_cache_mode`` under ``vllm serve``'s default prefix caching (``models/config.py`` L763-779)."""
ATTENTION_KERNEL_BLOCK = 16
"""Smallest kernel block of CUDA's FlashAttention backend (``MultipleOf(16)``, ``flash_attn.py`` L367)."""
GDN_CHECKPOINT_ALIGNMENT = 64
"""``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`` (``v1/attention/backends/gdn_attn.py`` L34)."""
MAMBA2_CHECKPOINT_ALIGNMENT = 1
"""A Mamba2 layer's ``prefill_checkpoint_alignment``: its chunked scan puts a chunk end on the checkpoint, so any
token works (``MambaMixer2.get_kv_cache_spec``, ``mamba_mixer2.py`` L1112-1118)."""
KDA_RECURRENT_STATE_BYTES = 4
"""``kda_state_dtype`` under ``--mamba-ssm-cache-dtype auto``: float32 (``mamba_utils.py`` L140-141)."""
MLA_KERNEL_BLOCK = {"bf16": 16, "fp16": 16, "fp8_e4m3": 64}
"""The smallest kernel block of the MLA backend Hopper picks for each cache dtype (``platforms/cuda.py`` L149-155):
FlashAttention-MLA (``auto``/``float16``/``bfloat16``, ``MultipleOf(16)``, ``flashattn_mla.py`` L42-50), else
FlashMLA (``fp8``/``fp8_e4m3``, 64, ``flashmla.py`` L48-58)."""

_MAMBA_TYPE = {MAMBA1: "mamba1", GDN: "gdn_attn"}


def _divide(value: int, tp: int, what: str) -> int:
    """``vllm.distributed.divide``: vLLM asserts the TP size divides the state."""
    if value % tp:
        raise UnsupportedCombinationError(
            f"vLLM {VLLM_VERSION} cannot shard the recurrent state over TP {tp}: {what} is {value}, not a multiple "
            f"of {tp}. Use a {option('tp_size')} that divides it."
        )
    return value // tp


def state_shapes(model: ModelSpec, tp: int) -> tuple[tuple[int, ...], ...]:
    """``MambaStateShapeCalculator`` (``mamba_utils.py``) for one layer on one TP rank, conv window first (the
    default ``SD`` layout, L28-45): Mamba-1 L171-183, Mamba2 L186-211, Gated DeltaNet L272-293."""
    geometry = model.params["state"]
    mixer = model.params["mixer"]
    window = geometry["conv_kernel"] - 1
    if mixer == MAMBA1:
        inner = _divide(geometry["intermediate_size"], tp, "the Mamba-1 inner size (mamba_expand x hidden_size)")
        return (window, inner), (inner, geometry["state_size"])
    if mixer == GDN:
        k_heads, v_heads = geometry["num_k_heads"], geometry["num_v_heads"]
        k_dim, v_dim = geometry["k_head_dim"], geometry["v_head_dim"]
        conv_dim = k_dim * k_heads * 2 + v_dim * v_heads
        return (
            (window, _divide(conv_dim, tp, "the conv width (2 x key heads x key dim + value heads x value dim)")),
            (_divide(v_heads, tp, "linear_num_value_heads"), v_dim, k_dim),
        )
    groups = geometry["n_groups"]
    if groups % tp:  # extra_groups_for_head_shards (L261-269)
        groups = tp
    intermediate = geometry["intermediate_size"]
    if model.params["family"] == "falcon_h1":
        intermediate = _falcon_d_ssm(model)
    conv_dim = intermediate + 2 * groups * geometry["state_size"]
    return (
        (window, _divide(conv_dim, tp, f"the conv width ({conv_dim} after replicating the groups)")),
        (_divide(geometry["num_heads"], tp, "the mamba heads"), geometry["head_dim"], geometry["state_size"]),
    )


def _falcon_d_ssm(model: ModelSpec) -> int:
    """``FalconH1SSMDecoderLayer``: ``mamba_d_ssm``, read from the config (``falcon_h1.py`` L112-117, L556-560)."""
    d_ssm = model.params["vllm"]["d_ssm"]
    if d_ssm is None:
        raise ConfigError(
            f"{model.name}: vLLM {VLLM_VERSION} sizes Falcon-H1's Mamba2 state from mamba_d_ssm, which this config "
            "lacks (vLLM would take transformers' FalconH1Config default, not mamba_n_heads x mamba_d_head). Add "
            "mamba_d_ssm from the checkpoint's config.json."
        )
    return int(d_ssm)


def state_dtype_bytes(model: ModelSpec) -> tuple[int, int]:
    """``MambaStateDtypeCalculator._mamba_state_dtype`` (L98-110): conv in the model dtype
    (``--mamba-cache-dtype auto``), SSM in ``mamba_ssm_cache_dtype`` or, when ``auto``, the conv's."""
    conv = resolve_kv_dtype("auto", model.dtype).element_bytes
    ssm_dtype = model.params["vllm"]["ssm_dtype"]
    return conv, conv if ssm_dtype == "auto" else MODEL_DTYPES[ssm_dtype]


def _attention_spec(layer: LayerSpec, model: ModelSpec, serving: Serving, block_size: int) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=kv_heads_per_rank(layer.num_kv_heads, serving.tp_size),
        head_size=layer.head_dim,
        head_size_v=layer.v_head_dim,
        dtype_bytes=kv_element_bytes(model, serving),
    )


def hybrid_vllm_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, KVCacheSpec]:
    """Every cache layer's spec on one TP rank, named as vLLM's model classes register them."""
    family = model.params["family"]
    if model.params["mixer"] == KDA:
        return kimi_linear_vllm_specs(model, serving, block_size)
    shapes = state_shapes(model, serving.tp_size)
    conv_bytes, ssm_bytes = state_dtype_bytes(model)
    mamba_page = sum(math.prod(shape) * size for shape, size in zip(shapes, (conv_bytes, ssm_bytes), strict=True))
    attention = next(layer for layer in model.layers if layer.kind in KV_KINDS)
    attn_page_1_token = _attention_spec(attention, model, serving, 1).page_size_bytes
    mixer = model.params["mixer"]
    gdn = mixer == GDN
    aligned, padded = align_hybrid_block_size(
        block_size=block_size,
        attn_page_size_1_token=attn_page_1_token,
        mamba_page_size=mamba_page,
        kernel_block_size=ATTENTION_KERNEL_BLOCK,
        backend_block_alignment=ATTENTION_KERNEL_BLOCK,
        prefill_checkpoint_alignment=GDN_CHECKPOINT_ALIGNMENT if gdn else None,
    )
    # One prefill checkpoint block per request: the GDN layer's on the prefix-cache grid (mamba_block_size,
    # qwen_gdn_linear_attn.py L739-750); every Mamba2 layer's at any token (MambaMixer2.get_kv_cache_spec,
    # mamba_mixer2.py L1108-1118, whatever the backend or GPU), which leaves the block size alone (MambaMixer2 has
    # no get_prefill_checkpoint_alignment, abstract.py L65-70).  Mamba-1 and KDA layers export none.
    checkpoint = aligned if gdn else MAMBA2_CHECKPOINT_ALIGNMENT if mixer == MAMBA2 else None
    mamba = MambaSpec(
        block_size=aligned,
        shapes=shapes,
        dtype_bytes=(conv_bytes, ssm_bytes),
        page_size_padded=padded,
        mamba_type=_MAMBA_TYPE.get(model.params["mixer"], "mamba2"),
        mamba_cache_mode=MAMBA_CACHE_MODE,
        num_prefill_checkpoint_blocks=1 if checkpoint else 0,
        prefill_checkpoint_alignment=checkpoint,
    )
    specs: dict[str, KVCacheSpec] = {}
    for layer in model.layers:
        prefix = f"model.layers.{layer.index}"
        if family == "falcon_h1":
            # attention first, then the SSM branch under index num_layers + i (falcon_h1.py L335-354)
            specs[f"{prefix}.attn"] = _attention_spec(layer, model, serving, aligned)
            specs[f"model.{model.num_layers + layer.index}.mixer"] = mamba
        elif layer.kind in KV_KINDS:
            specs[_ATTENTION_NAME[family].format(prefix)] = _attention_spec(layer, model, serving, aligned)
        elif layer.kind in STATE_KINDS:
            specs[_STATE_NAME[family].format(prefix)] = mamba
    return specs


_ATTENTION_NAME = {
    "qwen_gdn": "{}.self_attn.attn",  # qwen3_next.py L353-360, L509-515
    "nemotron_h": "{}.mixer.attn",  # nemotron_h.py L480-487, L520-526
    "jamba": "{}.attn",  # jamba.py L182, L231-237
    "granite": "{}.self_attn.attn",  # granitemoehybrid.py L159-163, L286-293
}
_STATE_NAME = {
    "qwen_gdn": "{}.linear_attn",  # qwen3_next.py L501-504
    "nemotron_h": "{}.mixer",  # nemotron_h.py L390-405
    "jamba": "{}.mixer",  # jamba.py L127-141
    "granite": "{}.mixer",  # granitemoehybrid.py L72-87
}


def kimi_linear_vllm_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, KVCacheSpec]:
    """Kimi-Linear's specs on one TP rank: ``KimiGatedDeltaNetAttention`` (a ``gdn_attn`` Mamba layer) at every KDA
    layer and ``MultiHeadLatentAttention.get_kv_cache_spec`` (``nvidia/mla.py`` L421-436) at the others, both
    registered as ``model.layers.<i>.self_attn`` (``nvidia/model.py`` L716-762), block size from
    ``Platform._align_hybrid_block_size`` with ``use_mla`` (``platforms/interface.py`` L977-985, L1083-1088)."""
    name = f"{model.name}: vLLM {VLLM_VERSION}'s Kimi-Linear"
    readings = model.params["vllm"]
    if serving.platform != "cuda":
        raise UnsupportedCombinationError(
            f"{name} is modelled on CUDA only (on {serving.platform} vLLM builds kimi_k3/amd/linear.py); use "
            f"{option('platform')} cuda or --accounting sglang / exact."
        )
    if readings["use_full_rank_gate"]:
        raise UnsupportedCombinationError(
            f"{name}: linear_attn_config.use_full_rank_gate selects Kimi-K3's KimiK3DeltaAttention, whose prefill "
            "backend (FlashKDA on SM90/SM10x/SM12x, Triton elsewhere) decides a prefill checkpoint block per request "
            "(nvidia/kda.py L363-379, L901-909); kvpools does not model that choice. Use --accounting sglang or exact."
        )
    if not readings["mla_use_nope"]:
        raise UnsupportedCombinationError(
            f"{name} asserts mla_use_nope ('Kimi-K3 MLA (MultiHeadLatentAttention) is NoPE-only', nvidia/model.py "
            "L744); this config leaves it false. Set mla_use_nope true if the checkpoint is NoPE, else use "
            "--accounting sglang or exact."
        )
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    if kv.name not in MLA_KERNEL_BLOCK:
        raise UnsupportedCombinationError(
            f"{name}: no MLA backend vLLM picks on Hopper (FlashAttention-MLA, FlashMLA) takes a {kv.name} KV cache, "
            f"and the fallback is not modelled; use {option('kv_cache_dtype')} auto (a 16-bit model), bf16, fp16 "
            "or fp8."
        )
    geometry = model.params["state"]
    heads, head_dim, window = geometry["num_heads"], geometry["head_dim"], geometry["conv_kernel"] - 1
    tp = serving.tp_size
    shapes = (
        (window, _divide(3 * heads * head_dim, tp, "the KDA conv width (3 x num_heads x head_dim)")),
        (_divide(heads, tp, "linear_attn_config.num_heads"), head_dim, head_dim),
    )
    conv_bytes = resolve_kv_dtype("auto", model.dtype).element_bytes
    dtype_bytes = (conv_bytes, KDA_RECURRENT_STATE_BYTES)
    mamba_page = sum(math.prod(shape) * size for shape, size in zip(shapes, dtype_bytes, strict=True))
    latent = next(layer for layer in model.layers if layer.kind in KV_KINDS)
    kernel = MLA_KERNEL_BLOCK[kv.name]
    aligned, padded = align_hybrid_block_size(
        block_size=block_size,
        attn_page_size_1_token=latent_kv_cache_spec(latent, model, serving, 1).page_size_bytes,
        mamba_page_size=mamba_page,
        kernel_block_size=kernel,
        backend_block_alignment=kernel,
        use_mla=True,
    )
    kda = MambaSpec(
        block_size=aligned,
        shapes=shapes,
        dtype_bytes=dtype_bytes,
        page_size_padded=padded,
        mamba_type="gdn_attn",
        mamba_cache_mode=MAMBA_CACHE_MODE,
    )
    return {
        f"model.layers.{layer.index}.self_attn": kda
        if layer.kind in STATE_KINDS
        else latent_kv_cache_spec(layer, model, serving, aligned)
        for layer in model.layers
        if layer.kind in STATE_KINDS or layer.kind in KV_KINDS
    }
