"""The parts library: the building blocks every architecture composes, public and documented.

What a token (a request, a state slot) costs is decided here, once, for each
storage kind more than one architecture uses; the stores that allocate those
bytes are in :mod:`kvpools_core.pools`.  Architecture plugins keep only what
is theirs — reading their configs, deciding which layer is which kind, their
engine-specific sizing rules — and import the rest from here, never from
another plugin: a third party composes exactly what the built-ins compose.

* :mod:`~kvpools_core.parts.attention` — K/V rows of full and sliding
  attention per KV dtype (fp8, fp4 and mxfp8 scales) and head sharding
  (attention TP, DCP); store: :class:`~kvpools_core.pools.mha.MHATokenToKVPool`
  / :class:`~kvpools_core.pools.kv.LayerKV`.
* :mod:`~kvpools_core.parts.latent` — MLA latent rows (raw, fp4, DSA's packed
  fp8) and reading MLA-family configs; store:
  :class:`~kvpools_core.pools.mla.MLATokenToKVPool`.
* :mod:`~kvpools_core.parts.indexer` — DeepSeek sparse attention's indexer key
  row and latent-row rules; store: :class:`~kvpools_core.pools.dsa.DSATokenToKVPool`.
* :mod:`~kvpools_core.parts.hisparse` — HiSparse's device and logical token spaces, its logical allocator
  and int64 mapping (DSA, MiniMax-M3); store: :class:`~kvpools_core.pools.hisparse.HiSparseAllocator`.
* :mod:`~kvpools_core.parts.names` — the pool names shared by sizing and building,
  and the draft model's share.
* :mod:`~kvpools_core.parts.device_memory` — ``torch.cuda.mem_get_info()``'s total per catalogue GPU, the device
  total the vLLM and TensorRT-LLM engines' whole-GPU budgets start from.
* :mod:`~kvpools_core.parts.weights` — a model's weights from its config: tensors
  sharded as SGLang shards them and the blocks decoders are made of, for the
  ``estimate_weights`` hook (not imported here: import it by name).

This package is torch-free: planning never imports torch.
"""

from __future__ import annotations

from kvpools_core.parts.attention import (
    LayerGeometry,
    attention_cell_size,
    layer_geometry,
    scale_block_problems,
    sglang_fp4_cell,
)
from kvpools_core.parts.indexer import (
    INDEX_BLOCK,
    INDEX_EXTRA_SLOTS,
    INDEX_HEAD_DIM,
    dsa_problems,
    index_pages,
    index_row_bytes,
    layer_split,
    owned_layers,
    stored_layers,
)
from kvpools_core.parts.latent import (
    FP4_BLOCK,
    FP8_BLOCK,
    LatentRow,
    MLADims,
    has_mla_latent,
    latent_cell_size,
    latent_dtype_problems,
    latent_model_spec,
    mla_problems,
    model_dims,
    sglang_latent_cell,
)
from kvpools_core.parts.names import (
    DRAFT_INDEX_POOL,
    DRAFT_KV_POOL,
    INDEX_POOL,
    KV_POOL,
    draft_name,
    draft_num_layers,
    packs_draft_into_host,
)

__all__ = [
    "DRAFT_INDEX_POOL",
    "DRAFT_KV_POOL",
    "FP4_BLOCK",
    "FP8_BLOCK",
    "INDEX_BLOCK",
    "INDEX_EXTRA_SLOTS",
    "INDEX_HEAD_DIM",
    "INDEX_POOL",
    "KV_POOL",
    "LatentRow",
    "LayerGeometry",
    "MLADims",
    "attention_cell_size",
    "draft_name",
    "draft_num_layers",
    "dsa_problems",
    "has_mla_latent",
    "index_pages",
    "index_row_bytes",
    "latent_cell_size",
    "latent_dtype_problems",
    "latent_model_spec",
    "layer_geometry",
    "layer_split",
    "mla_problems",
    "model_dims",
    "owned_layers",
    "packs_draft_into_host",
    "scale_block_problems",
    "sglang_fp4_cell",
    "sglang_latent_cell",
    "stored_layers",
]
