"""The parts of a weights estimate: tensors sharded as SGLang shards them, the blocks decoders are made of, and the sum.

An architecture plugin answers the ``estimate_weights`` hook for the ``model_type`` values it claims: it reads
its config through :attr:`WeightsConfig.reader`, adds its decoder's tensors to a :class:`Builder` with the blocks
here, and returns :func:`estimate`'s :class:`WeightsEstimate`.  Every tensor carries its Hugging Face module name
(so a ``quantization_config``'s ``modules_to_not_convert`` / ``ignore`` list applies to it) and how SGLang shards it:

* tensor parallelism splits attention heads (column-parallel ``q/k/v``, row-parallel ``o``; KV heads are
  replicated once TP exceeds them), the dense MLP and the shared experts, and the vocabulary of the embedding and
  LM head;
* DP attention (``enable_dp_attention``, where the plugin passes ``dp_attention=True``) splits the attention heads
  and the embedding's vocabulary over the attention-TP group of ``tp / dp_size`` ranks instead; everything else
  keeps TP/EP;
* expert parallelism (``ep_size``) gives each rank ``E / ep`` experts whose intermediate size splits over the
  remaining ``tp / ep`` ranks (SGLang's ``moe_tp_size``); with ``ep_size=1`` every expert is TP-sharded;
* pipeline parallelism keeps the layers of ``Serving.pp_rank`` (:func:`~kvpools_core.parallel.pp_layer_range`),
  the embedding on the first stage and the final norm and LM head on the last (a tied head is a copy there).

The modules: :mod:`~kvpools_core.parts.weights.tensors` (:class:`Tensor`, :class:`Sharding`, :class:`Builder`:
Linears, grouped-query attention, dense MLP, experts, embedding and head, norms),
:mod:`~kvpools_core.parts.weights.blocks` (MLA, the DSA indexer, MoE blocks, Gated DeltaNet, Mamba-1/2),
:mod:`~kvpools_core.parts.weights.decoders` (the Llama-shaped and the MLA decoder two plugins each share),
:mod:`~kvpools_core.parts.weights.vision` (SigLIP and Qwen3-VL vision towers),
:mod:`~kvpools_core.parts.weights.quantisation` (fp8, mxfp4, NVFP4, ModelOpt, compressed-tensors, AWQ, GPTQ) and
:mod:`~kvpools_core.parts.weights.estimate` (the sum).  No module here reads or names a ``model_type``.
"""

from __future__ import annotations

from kvpools_core.parts.weights.blocks import (
    dsa_indexer,
    gated_delta_net,
    mamba1,
    mamba2,
    mla_attention,
    routed_moe,
    sparse_moe,
    ungated_mlp,
)
from kvpools_core.parts.weights.decoders import llama_decoder, mla_decoder
from kvpools_core.parts.weights.estimate import (
    DTYPE_BYTES,
    FAMILIES,
    Decoder,
    WeightsConfig,
    WeightsEstimate,
    estimate,
    estimate_claimed,
    sharding,
)
from kvpools_core.parts.weights.quantisation import ByModule, Quantisation, mxfp4, quantisation_of
from kvpools_core.parts.weights.safetensors import (
    HeaderTensor,
    Share,
    exact_weights,
    find_safetensors,
    read_headers,
)
from kvpools_core.parts.weights.tensors import (
    Builder,
    Sharding,
    Tensor,
    expert_intermediate_per_rank,
    split,
    vocab_rows_per_rank,
)
from kvpools_core.parts.weights.vision import (
    gemma3_vision,
    gemma4_vision_tower,
    llama4_vision,
    pixtral_vision,
    qwen3_vl_vision,
    siglip_vision,
)

__all__ = [
    "DTYPE_BYTES",
    "FAMILIES",
    "Builder",
    "ByModule",
    "Decoder",
    "HeaderTensor",
    "Quantisation",
    "Sharding",
    "Share",
    "Tensor",
    "WeightsConfig",
    "WeightsEstimate",
    "dsa_indexer",
    "estimate",
    "estimate_claimed",
    "exact_weights",
    "expert_intermediate_per_rank",
    "find_safetensors",
    "gated_delta_net",
    "gemma3_vision",
    "gemma4_vision_tower",
    "llama4_vision",
    "llama_decoder",
    "mamba1",
    "mamba2",
    "mla_attention",
    "mla_decoder",
    "mxfp4",
    "pixtral_vision",
    "quantisation_of",
    "qwen3_vl_vision",
    "read_headers",
    "routed_moe",
    "sharding",
    "siglip_vision",
    "sparse_moe",
    "split",
    "ungated_mlp",
    "vocab_rows_per_rank",
]
