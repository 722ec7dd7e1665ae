"""DeepSeek sparse attention's storage: the lightning indexer's key row and the DSA latent row.

Every DSA layer (DeepSeek-V3.2, GLM-5, and the DSA full layers of hybrid
MLA-SWA models) caches an MLA latent row (:mod:`kvpools_core.parts.latent`)
and, in a separate paged buffer, the indexer key: ``index_head_dim`` fp8 values
and one fp32 scale per 128 of them (132 bytes for ``index_head_dim`` 128).
With fp8 KV the latent row is FlashMLA's packed layout
(``calculate_mla_kv_cache_dim``) unless a backend of the local role reads the
raw row.  The indexer buffer holds ``(tokens + page_size + 1) // page_size``
pages, so its parts declare ``extra_slots=1``.  GLM's cache layer split
stores ``ceil(L / cp) + 1`` layers per CP rank.  IndexShare layers (``SKIPS_TOPK``) keep no keys where
SGLang elides them (:func:`elides_index_k`); pooled keys (``index_kpool``) store ``132 / kpool`` B per
token; the buffer holds :func:`index_buffer_slots` slots (DCP replicates it, HiSparse scales it).
The store that allocates these is :class:`kvpools_core.pools.dsa.DSATokenToKVPool`.

What a platform's DSA kernels need comes from the platform's plugin, never
from its name here: its page-size rules for the ``"dsa"`` kernels
(:data:`DSA_KERNEL`; CUDA's 64, ROCm's 1 or a multiple of 16) and the
backends that read raw latent rows (``PlatformTraits.raw_mla_row_backends``;
ROCm's tilelang/triton/aiter), both read from ``serving.traits``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parts.hisparse import hisparse_ratio
from kvpools_core.parts.latent import FP8_BLOCK, LatentRow, mla_problems, model_dims
from kvpools_core.parts.names import INDEX_POOL
from kvpools_core.values import LayerSpec, ModelSpec, Serving

__all__ = [
    "DSA_KERNEL",
    "INDEX_BLOCK",
    "INDEX_EXTRA_SLOTS",
    "INDEX_HEAD_DIM",
    "INDEX_POOL",
    "INDEX_SCALE_BYTES",
    "INDEX_TAIL_POOL",
    "KPOOL",
    "KPOOL_COMPRESS",
    "SKIPS_TOPK",
    "dsa_problems",
    "elides_index_k",
    "hisparse_ratio",
    "index_buffer_slots",
    "index_head_dim",
    "index_kpool",
    "index_layer_count",
    "index_layer_mask",
    "index_pages",
    "index_row_bytes",
    "index_tail_bytes_per_request",
    "index_token_bytes",
    "latent_row",
    "layer_split",
    "owned_layers",
    "page_size_problems",
    "reads_raw_latent",
    "stored_layers",
]

INDEX_BLOCK = 128
"""Index-key values sharing one fp32 scale (``DSATokenToKVPool.quant_block_size``)."""
INDEX_SCALE_BYTES = 4
"""fp32 scales of the index keys."""
INDEX_HEAD_DIM = 128
"""The only index head dim SGLang's DSA pool accepts."""
INDEX_EXTRA_SLOTS = 1
"""The indexer buffer holds ``(tokens + page_size + 1) // page_size`` pages (two padding slots at page size 1)."""
DSA_KERNEL = "dsa"
"""The kernel family whose page-size rules (``PageSizeRule.kernels``) a DSA model must obey."""
TRTLLM_BACKEND = "trtllm"
"""SGLang's TRTLLM DSA backends read the raw latent row on every platform."""
KPOOL = "index_kpool"
"""``ModelSpec.params`` key (and config key): tokens one pooled index key spans (``get_dsa_index_kpool``: 1)."""
KPOOL_COMPRESS = "index_kpool_compress"
"""``ModelSpec.params`` key (and config key): the pooled indexer keeps per-request tails
(``get_dsa_index_kpool_compress``: absent is False)."""
SKIPS_TOPK = "skips_topk"
"""``LayerSpec.params`` key: the layer reuses another layer's top-k (SGLang's ``dsa_layer_skips_topk``:
IndexShare)."""
INDEX_TAIL_POOL = "index_tail"
"""The kpool-compress request tails' pool (``DSATokenToKVPool._init_kpool_compress_tail_buffers``)."""
TAIL_ELEMENT_BYTES = 2
"""The tails are bfloat16 (``tail_dtype = torch.bfloat16``)."""


def dsa_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang's DSA pools cannot hold for this model (its MLA latent, its indexer, the page size)."""
    problems = mla_problems(model, serving)
    index_dim = index_head_dim(model)
    if index_dim != INDEX_HEAD_DIM:
        problems.append(
            f"{model.name} has index_head_dim {index_dim}; SGLang's DSA pool (and its indexer kernels) "
            f"support index_head_dim {INDEX_HEAD_DIM} only."
        )
    row = latent_row(model, serving)
    if row.packed_fp8 and row.dims.kv_lora_rank % FP8_BLOCK:
        problems.append(
            f"DSA's fp8 latent row stores one scale per {FP8_BLOCK} values, but {model.name} has kv_lora_rank "
            f"{row.dims.kv_lora_rank}. Use {option('kv_cache_dtype')} bf16, or a trtllm DSA backend (raw fp8 layout)."
        )
    problems += kpool_problems(model, serving)
    if serving.dcp_size > 1 and serving.page_size == 1:
        problems.append(
            f"kvpools does not model the DSA index buffer under {option('dcp_size')} {serving.dcp_size} at "
            f"{option('page_size')} 1 yet: SGLang's ((S + 1) x {serving.dcp_size} - 1 + 2) one-token pages are not "
            f"whole pages of {serving.dcp_size} slots, as kvpools lays the replicated index out. Use a page size of "
            "16 or more."
        )
    return problems + disaggregation_problems(serving)


def kpool_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """The pooled indexer's page rules (SGLang 0.5.23 ``DSATokenToKVPool.__init__``): the page is whole pooled
    groups (``page_size % index_kpool == 0``) and the kernels' physical page is ``page_size // index_kpool``, which
    the platform's DSA rules check (CUDA: 64, so ``index_kpool`` 2 needs ``--page-size`` 128)."""
    kpool, page = index_kpool(model), serving.page_size
    if page % kpool:
        return [
            f"{option('page_size')} {page} with {model.name}'s index_kpool {kpool}: SGLang asserts 'page_size {page} "
            f"must be a multiple of index_kpool {kpool}' (DSATokenToKVPool). Use {option('page_size')} "
            f"{DSA_PHYSICAL_HINT * kpool} (64 x index_kpool on CUDA)."
        ]
    if kpool > 1 and (INDEX_HEAD_DIM + INDEX_HEAD_DIM // INDEX_BLOCK * INDEX_SCALE_BYTES) % kpool:
        return [
            f"kvpools does not model index_kpool {kpool} yet ({model.name}): a pooled index key of 132 B does not "
            f"split into {kpool} whole bytes per token. Use a config with index_kpool 1, 2, 3 or 4."
        ]
    problems = serving.traits.page_size_problems(page // kpool, kernel=DSA_KERNEL)
    if kpool == 1:
        return problems
    return [
        f"{option('page_size')} {page} with index_kpool {kpool} gives DSA kernel pages of {page // kpool} tokens "
        f"(page_size // index_kpool, DSATokenToKVPool.index_page_size): {problem}"
        for problem in problems
    ]


DSA_PHYSICAL_HINT = 64
"""CUDA's physical DSA page, used to suggest a ``--page-size`` (64 x index_kpool, SGLang's default)."""


def disaggregation_problems(serving: Serving) -> list[str]:
    """SGLang 0.5.23's PD refusals for a DSA model (``arg_groups/model_hook.py`` lines 362-380, the
    ``is_deepseek_dsa`` branch of ``handle_model_specific_adjustments``).

    DSA context parallelism is prefill CP (``--enable-prefill-cp`` sets ``attn_cp_size``,
    ``model_overrides/deepseek_v2.py`` lines 105-134), which a decode node refuses; the cache layer split is a
    prefill-CP optimisation that only a PD prefill node may run.
    """
    mode, flag = serving.disaggregation_mode, option("disaggregation_mode")
    problems = []
    if mode == "decode" and serving.attn_cp_size > 1:
        problems.append(
            f"{option('attn_cp_size')} {serving.attn_cp_size} on a PD decode node ({flag} decode): SGLang runs DSA "
            f"context parallelism only for prefill under PD disaggregation (CP is only supported for prefill when "
            f"PD disaggregation, please remove --enable-prefill-cp). Use {option('attn_cp_size')} 1 on the decode node."
        )
    split = option("enable_dsa_cache_layer_split")
    if serving.enable_dsa_cache_layer_split and mode == "decode":
        problems.append(
            f"{split} is not supported on decode workers ({flag} decode): it is a prefill-CP optimization; decode "
            f"receives full cache shards through PD transfer (SGLang). Drop {split}."
        )
    elif serving.enable_dsa_cache_layer_split and mode != "prefill":
        problems.append(
            f"{split} is only supported on PD prefill workers: non-PD workers also run decode and require ordinary "
            f"local decode cache semantics (SGLang). Add {flag} prefill, or drop {split}."
        )
    return problems


def latent_row(model: ModelSpec, serving: Serving) -> LatentRow:
    """SGLang's ``calculate_mla_kv_cache_dim``: the packed fp8 row unless the local role reads raw MLA rows."""
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    packed = kv.name == "fp8_e4m3" and not reads_raw_latent(serving)
    return LatentRow(model_dims(model), kv, packed_fp8=packed)


def reads_raw_latent(serving: Serving) -> bool:
    """A TRTLLM backend of the local role, or any backend the platform says reads raw rows, reads the raw row.

    ``calculate_mla_kv_cache_dim``: the TRTLLM check looks at the local role's
    backend only; the platform's raw-row backends (ROCm: tilelang, triton,
    aiter) at either backend.
    """
    prefill, decode = serving.dsa_prefill_backend, serving.dsa_decode_backend
    role = {"decode": (decode,), "prefill": (prefill,)}.get(serving.disaggregation_mode, (prefill, decode))
    if TRTLLM_BACKEND in role:
        return True
    return bool({prefill, decode} & serving.traits.raw_mla_row_backends)


def layer_split(serving: Serving) -> bool:
    """The GLM DSA cache layer split: ``--enable-dsa-cache-layer-split`` with ``--attn-cp-size`` above 1."""
    return serving.enable_dsa_cache_layer_split and serving.attn_cp_size > 1


def stored_layers(num_layers: int, serving: Serving) -> int:
    """``get_glm_dsa_layer_split_effective_num_layers``: ``ceil(L / cp) + 1`` under the split, else ``L``."""
    if not layer_split(serving):
        return num_layers
    return max(1, -(-num_layers // serving.attn_cp_size) + 1)


def owned_layers(start: int, end: int, serving: Serving) -> range | None:
    """Global layers CP rank 0 owns under the split (SGLang's contiguous split; rank 0's share is the largest)."""
    if not layer_split(serving):
        return None
    return range(start, start + -(-(end - start) // serving.attn_cp_size))


def index_head_dim(model: ModelSpec) -> int:
    """The model's ``index_head_dim``: its first DSA layer's (a linear-attention hybrid's first layers may be
    recurrent ones without an indexer; SGLang's ``get_dsa_index_head_dim`` reads one per model)."""
    return int(next(layer.params["index_head_dim"] for layer in model.layers if "index_head_dim" in layer.params))


def index_row_bytes(model: ModelSpec) -> int:
    """Indexer bytes per token per layer: fp8 keys and one fp32 scale per 128 (132 for index_head_dim 128)."""
    dim = index_head_dim(model)
    return dim + dim // INDEX_BLOCK * INDEX_SCALE_BYTES


def page_size_problems(serving: Serving) -> list[str]:
    """The serving platform's page-size rules for the DSA kernels (``PlatformTraits.page_size_rules``)."""
    return serving.traits.page_size_problems(serving.page_size, kernel=DSA_KERNEL)


def index_pages(size: int, page_size: int) -> int:
    """Pages of one layer's indexer buffer: ``(size + page_size + 1) // page_size`` (page 0 pads)."""
    return (size + page_size + 1) // page_size


def index_kpool(model: ModelSpec) -> int:
    """Tokens one pooled index key spans: the config's ``index_kpool`` (``get_dsa_index_kpool``: absent is 1)."""
    return int(model.params.get(KPOOL, 1))


def index_token_bytes(model: ModelSpec) -> int:
    """Bytes the index pages store per token per layer: 132 / ``index_kpool`` (a page of ``P`` tokens holds
    ``P // index_kpool`` keys of 132 B, ``IndexKeyCache._buffer_shape``)."""
    return index_row_bytes(model) // index_kpool(model)


def elides_index_k(serving: Serving) -> bool:
    """Whether the target's pool gives IndexShare layers no index keys: SGLang's ``_should_elide_dsa_index_k``
    (``000_fbd4f47288598fb9.txt`` lines 109-117): not with HiSparse, HiCache or PD disaggregation (the draft
    worker keeps every layer's keys)."""
    return (
        not serving.enable_hisparse and not serving.enable_hierarchical_cache and serving.disaggregation_mode == "null"
    )


def index_layer_mask(layers: Sequence[LayerSpec], serving: Serving) -> list[bool]:
    """Per layer, whether the target's pool allocates its index keys (``skip_topk_layers`` inverted)."""
    elide = elides_index_k(serving)
    return [not (elide and bool(layer.params.get(SKIPS_TOPK, False))) for layer in layers]


def index_layer_count(layers: Sequence[LayerSpec], serving: Serving) -> int:
    """Layers of ``layers`` whose index keys the target's pool allocates."""
    return sum(index_layer_mask(layers, serving))


def index_buffer_slots(size: int, page_size: int, serving: Serving) -> int:
    """Token slots of one layer's index buffer (``DSATokenToKVPool.index_buf_size``): ``size x
    host_to_device_ratio`` under HiSparse (``HiSparseDSATokenToKVPool``), else ``(size + page) x dcp - page``
    (the index keys are replicated over the DCP ranks while the latent rows shard)."""
    if serving.enable_hisparse:
        return size * hisparse_ratio(serving)
    return (size + page_size) * serving.dcp_size - page_size


def index_tail_bytes_per_request(model: ModelSpec, serving: Serving, num_index_layers: int) -> int:
    """Bytes per request row of the kpool-compress tails: per index layer a key and a score tail of
    ``index_kpool + draft tokens`` bf16 rows of ``index_head_dim`` (``_init_kpool_compress_tail_buffers``;
    0 unless ``index_kpool`` > 1 and ``index_kpool_compress``)."""
    kpool = index_kpool(model)
    if kpool <= 1 or not model.params.get(KPOOL_COMPRESS, False):
        return 0
    width = kpool + (serving.speculative_num_draft_tokens or 0 if serving.speculative_algorithm else 0)
    dim = index_head_dim(model)
    return 2 * width * dim * TAIL_ELEMENT_BYTES * num_index_layers
