"""MiniMax sparse attention (MiniMax-M3): full K/V on every layer plus a lightning-indexer cache on sparse layers.

Claims configs SGLang's ``is_minimax_sparse`` recognises (``architectures[0]``
is ``MiniMaxM3SparseForCausalLM`` or ``MiniMaxM3SparseForConditionalGeneration``);
the layer kinds come from ``sparse_attention_config`` (``text_config``'s,
else the top level's): ``sparse_attention_freq`` marks sparse layers (0 =
dense) and ``sparse_disable_index_value`` the sparse layers whose indexer
keeps keys only.  As SGLang's ``MiniMaxSparseKVPool`` (mirrored by its
configurator): a main pool with K and V of every layer (KV heads sharded by
attention TP), and an indexer pool with one ``sparse_index_dim`` head in the
model dtype — K and V on index-value layers, K only on the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpools_core import for_architecture, hookimpl
from kvpools_core.config import DIM, ConfigReader, context_length, derived_head_dim, grouped_kv_heads, model_dtype
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parallel import kv_heads_per_rank, rank_layer_range
from kvpools_core.parts.attention import attention_cell_size
from kvpools_core.parts.hisparse import hisparse_ratio
from kvpools_core.parts.names import INDEX_POOL
from kvpools_core.values import (
    Budget,
    CellPart,
    CellSize,
    EngineDefault,
    LayerSpec,
    ModelSpec,
    Plan,
    PoolSizing,
    Serving,
)

from .hisparse import dense_parts, m3_hisparse_pools, m3_hisparse_problems
from .weights import estimate_weights as estimate_weights

if TYPE_CHECKING:
    from kvpools_core.pools.layout import BufferLayout

from .kinds import DENSE, SPARSE

ARCHITECTURE = "minimax_sparse"
SPARSE_ARCHITECTURES = frozenset({"MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"})
PRESET_DIR = Path(__file__).parent / "presets"

_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


@hookimpl
def presets() -> dict[str, str]:
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


@hookimpl
def architecture_traits() -> dict[str, list[str]]:
    """SGLang 0.5.23 never plans post-capture KV sizing for MiniMax-M3's sparse models (``is_minimax_sparse`` in
    ``post_capture_kv_sizing_planned``, ``arg_groups/overrides.py`` L1859-1860)."""
    return {architecture: ["no_post_capture_kv_sizing"] for architecture in SPARSE_ARCHITECTURES}


@hookimpl
def engine_features() -> dict[str, list[str]]:
    """SGLang 0.5.23 runs HiSparse on MiniMax-M3's sparse models (``is_minimax_sparse`` in ``validate_hisparse``),
    and its fp8 attention-GEMM mode (``m3_fp8_attn_gemm_enabled``) on them."""
    return {ARCHITECTURE: ["hisparse", "m3_fp8_attn_gemm"]}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    outer = ConfigReader(config, source)
    architectures = outer.string_list("architectures")
    if not architectures or architectures[0] not in SPARSE_ARCHITECTURES:
        return None
    reader = outer.text()
    sparse = _sparse_config(outer, reader)
    num_layers = reader.integer("num_hidden_layers")
    heads = reader.integer("num_attention_heads")
    head_dim = reader.optional_integer("head_dim") or derived_head_dim(reader, heads)
    kv_heads = grouped_kv_heads(reader, heads)
    index_dim = sparse.integer("sparse_index_dim")
    if not sparse.has("sparse_attention_freq"):
        raise sparse.error("sparse_attention_freq", "is missing", "Give one flag per layer (0 = dense, 1 = sparse).")
    freq = _flags(sparse, "sparse_attention_freq")
    if len(freq) < num_layers:
        raise sparse.error(
            "sparse_attention_freq",
            f"has {len(freq)} entries for {num_layers} layers",
            "Give one flag per layer (0 = dense attention, 1 = sparse).",
        )
    k_only = _flags(sparse, "sparse_disable_index_value")
    layers = [
        LayerSpec(
            index=i,
            kind=SPARSE if freq[i] else DENSE,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=head_dim,
            params=(
                {"index_head_dim": index_dim, "index_value": not (i < len(k_only) and k_only[i])} if freq[i] else {}
            ),
        )
        for i in range(num_layers)
    ]
    return ModelSpec(
        name=source,
        architecture=ARCHITECTURE,
        layers=layers,
        context_len=context_length(reader, _CONTEXT_KEYS),
        dtype=model_dtype(reader) if reader.has("torch_dtype") or reader.has("dtype") else model_dtype(outer),
        num_attention_heads=heads,
        model_type=reader.string("model_type") or outer.string("model_type"),
        hf_architectures=architectures,
        source=source,
        num_nextn_predict_layers=reader.integer("num_nextn_predict_layers", 0, minimum=0),
        is_multimodal=reader is not outer,
    )


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault] | None:
    """SGLang 0.5.23's page for MiniMax-M3 on CUDA when ``--page-size`` is unset: 128, the sparse block its
    kernels need (``_minimax_m3_overrides``, ``arg_groups/model_overrides/minimax_m3.py``: lines 178-187 on
    Hopper with fa3, lines 147-168 on Blackwell with fa4 / trtllm_mha; its NVFP4 checkpoints, lines 92-115, on
    every GPU).  ROCm keeps the generic page (lines 124-146 declare none); Ascend's 128 answers first."""
    if serving.platform != "cuda":
        return None
    reason = (
        "SGLang 0.5.23's default for MiniMax-M3 on Hopper and Blackwell GPUs (the fa3 / fa4 / trtllm_mha sparse "
        "block; _minimax_m3_overrides in arg_groups/model_overrides/minimax_m3.py)"
    )
    return [EngineDefault(option="page_size", value=MINIMAX_M3_KERNEL_BLOCK, reason=reason)]


@hookimpl
@for_architecture(ARCHITECTURE)
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    dims = sorted({layer.head_dim for layer in model.layers})
    if kv.scale_block is not None and any(d % kv.scale_block for d in dims):
        return [
            f"{option('kv_cache_dtype')} {kv.name} stores one scale per {kv.scale_block} values, but {model.name} has "
            f"head dims {dims}. Use bf16, fp16 or fp8_e4m3."
        ]
    if serving.enable_hisparse:
        start, end = rank_layer_range(model, serving)
        problems = m3_hisparse_problems(model.layers[start:end], SPARSE, serving)
        if problems:
            return problems
    if serving.enable_hierarchical_cache and serving.pp_size > 1:
        return [
            f"{option('enable_hierarchical_cache')} with {option('pp_size')} {serving.pp_size}: SGLang raises "
            f"'MiniMax-M3 sparse HiCache does not support pipeline parallelism (pp_size>1) yet.' Drop one of them."
        ]
    return []


MINIMAX_M3_KERNEL_BLOCK = 128
"""``MiniMaxM3SparseBackend`` and ``MiniMaxM3IndexerBackend.get_supported_kernel_block_sizes``: ``[128]``, one
sparse block per page (vLLM 0.33 ``models/minimax_m3/common/sparse_attention.py`` L165-167, ``indexer.py``
L94-95)."""
FLASH_ATTENTION_KERNEL_BLOCK = 16
"""CUDA's FlashAttention (the dense layers' ``Attention``): ``MultipleOf(16)`` (``flash_attn.py`` L367)."""
INDEXER_KV_BYTES = 2
"""``attention_config.resolve_indexer_kv_dtype("bf16")`` (``nvidia/model.py`` L505-509): a bf16 index key unless
``--attention-config`` sets ``indexer_kv_dtype``, whatever ``--kv-cache-dtype`` says."""


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> tuple[Any, ...] | None:
    """TensorRT-LLM serves these models with a cache manager kvpools does not reproduce yet: refused, with the
    reason (``--accounting trtllm``); None for other engines."""
    from kvpools_core.parts.trtllm import ENGINE, trtllm_refusal

    if engine == ENGINE:
        raise trtllm_refusal(model, "MiniMax sparse attention")
    return None


@hookimpl
@for_architecture(ARCHITECTURE)
def vllm_kv_cache_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, Any] | None:
    """vLLM 0.33's MiniMax-M3 (``vllm/models/minimax_m3/nvidia/model.py``): a dense layer's ``Attention`` builds a
    ``FullAttentionSpec``; a sparse layer (``sparse_attention_freq`` != 0, L99-107, L708-726) registers its
    indexer's key cache first, ``MiniMaxM3IndexerCache.get_kv_cache_spec`` (``common/indexer.py`` L145-153: an
    ``MLAAttentionSpec`` with one ``sparse_index_dim`` key per token, role indexer; M3 never creates the index
    value, L392-407), then its main K/V, a ``FullAttentionSpec`` (L562-571).  KV heads per rank are
    ``max(1, heads // tp)``.  The block size is the backends' common one: 128 (:func:`backend_block_size`)."""
    from kvpools_core.parts.vllm.layers import backend_block_size, kv_element_bytes, kv_heads_per_rank
    from kvpools_core.parts.vllm.specs import FullAttentionSpec, KVCacheSpec, MLAAttentionSpec

    sparse = any(layer.kind == SPARSE for layer in model.layers)
    kernels = [[FLASH_ATTENTION_KERNEL_BLOCK]] if any(layer.kind == DENSE for layer in model.layers) else []
    if sparse:
        kernels += [[MINIMAX_M3_KERNEL_BLOCK], [MINIMAX_M3_KERNEL_BLOCK]]
    block = backend_block_size(block_size, kernels, "MiniMax-M3's attention backends")
    dtype_bytes = kv_element_bytes(model, serving)
    specs: dict[str, KVCacheSpec] = {}
    for layer in model.layers:
        name = f"model.layers.{layer.index}.self_attn.attn"
        if layer.kind == SPARSE:
            specs[f"{name}.index_cache"] = MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                head_size=int(layer.params["index_head_dim"]),
                dtype_bytes=INDEXER_KV_BYTES,
                cache_role="indexer",
            )
        specs[name] = FullAttentionSpec(
            block_size=block,
            num_kv_heads=kv_heads_per_rank(layer.num_kv_heads, serving.tp_size),
            head_size=layer.head_dim,
            head_size_v=layer.v_head_dim,
            dtype_bytes=dtype_bytes,
        )
    return specs


@hookimpl
@for_architecture(ARCHITECTURE)
def host_mirrors(plan: Plan) -> dict[str, str | None] | None:
    """SGLang's MiniMax sparse host stack (``build_minimax_sparse_hicache_stack``): the KV host pool takes all of
    ``--hicache-size`` (or the ratio), and the indexer's K-only host pool (``MHATokenToKOnlyPoolHost``) has
    exactly its slots (``self.size = anchor_host.size``)."""
    names = [pool.name for pool in plan.pools]
    if "kv" not in names:
        return None
    return {"kv": None, **({"indexer": "kv"} if "indexer" in names else {})}


@hookimpl
@for_architecture(ARCHITECTURE)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    start, end = rank_layer_range(model, serving)
    layers = model.layers[start:end]
    cell = sparse_cell_size(layers, model, serving)
    last = sparse_cell_size(model.layers[-1:], model, serving)
    parts = cell.parts
    if serving.enable_hisparse:  # the dense layers' K/V in a pool of S x r logical slots (.hisparse)
        dense = tuple(layer for layer in layers if layer.kind == DENSE)
        sparse = tuple(layer for layer in layers if layer.kind == SPARSE)
        main = [*attention_cell_size(sparse, model, serving).parts] if sparse else []
        if dense:
            main += dense_parts(attention_cell_size(dense, model, serving).parts)
        parts = (*main, *(part for part in cell.parts if part.pool == INDEX_POOL))
    # The draft (MiniMax-M3's MTP module) is charged as layers shaped like the target's last layer.
    return CellSize(
        parts=parts,
        sglang_bytes_per_token=max(cell.sglang_bytes_per_token, 1),
        num_layers=len(layers),
        draft_layer_parts=last.parts,
    )


@hookimpl
@for_architecture(ARCHITECTURE)
def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing | None:
    """HiSparse's pools (:mod:`.hisparse`); without HiSparse the core's default sizing."""
    if not serving.enable_hisparse:
        return None
    return m3_hisparse_pools(model, serving, cell, budget, owner=ARCHITECTURE)


@hookimpl
@for_architecture(ARCHITECTURE)
def build_allocator(plan: Plan, pool: Any, device: str, checked: bool) -> Any | None:
    """HiSparse's logical and device allocators and their mapping (SGLang's ``HiSparseTokenToKVPoolAllocator``);
    else the core's."""
    serving = plan.serving
    if not serving.enable_hisparse:
        return None
    from kvpools_core.pools.hisparse import HiSparseAllocator

    return HiSparseAllocator(
        plan.max_total_num_tokens,
        serving.page_size,
        hisparse_ratio(serving),
        device=device,
        kvcache=pool,
        need_sort=serving.disaggregation_mode != "null",
        checked=checked,
    )


@hookimpl
@for_architecture(ARCHITECTURE)
def build_pool(plan: Plan, device: str, layout: BufferLayout | None) -> Any | None:
    from .pool import MiniMaxSparseKVPool

    return MiniMaxSparseKVPool.from_plan(plan, device, layout=layout)


def sparse_cell_size(layers: tuple[LayerSpec, ...], model: ModelSpec, serving: Serving) -> CellSize:
    """Main K/V of every layer plus the indexer's keys (and values) on sparse layers.

    SGLang's figure: ``layers × 2 × kv_heads × head_dim × kv_size`` plus
    ``(2 × index-value layers + key-only layers) × sparse_index_dim × model
    dtype size``, with no fp4 scale term; kvpools' parts also charge fp4/mxfp8
    scales and DCP's head layout (as the MHA pool stores them).
    """
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    main = attention_cell_size(layers, model, serving) if layers else None
    sglang = sum(
        2 * kv_heads_per_rank(layer.num_kv_heads, serving.attn_tp_size) * layer.head_dim * kv.element_bytes
        for layer in layers
    )
    index_k = index_v = sglang_index = 0
    index_bytes = index_element_bytes(model, serving)
    for layer in layers:
        if layer.kind == SPARSE:
            dim = int(layer.params["index_head_dim"])
            index_k += dim * index_bytes
            index_v += dim * index_bytes if layer.params["index_value"] else 0
            # SGLang's estimate (ref-002 lines 224-261): the model dtype, whatever the pool stores
            sglang_index += dim * model.dtype_bytes * (2 if layer.params["index_value"] else 1)
    parts = list(main.parts) if main is not None else []
    if index_k:
        parts.append(CellPart("index_k", index_k, INDEX_POOL))
    if index_v:
        parts.append(CellPart("index_v", index_v, INDEX_POOL))
    return CellSize(parts=parts, sglang_bytes_per_token=max(sglang + sglang_index, 1), num_layers=len(layers))


def index_element_bytes(model: ModelSpec, serving: Serving) -> int:
    """The indexer cache's element size: the KV dtype's (fp8, 1 B) under ``m3_fp8_attn_gemm``, else the model
    dtype's (``_build_minimax_sparse_kv_pool``'s ``index_dtype``, ref-000 lines 1857-1861)."""
    if serving.m3_fp8_attn_gemm:
        return resolve_kv_dtype(serving.kv_cache_dtype, model.dtype).element_bytes
    return model.dtype_bytes


def _sparse_config(outer: ConfigReader, reader: ConfigReader) -> ConfigReader:
    """``get_minimax_sparse_attention_config``: the text config's, else the top level's."""
    for candidate in (reader, outer):
        if candidate.has("sparse_attention_config"):
            return candidate.child("sparse_attention_config")
    raise reader.error(
        "sparse_attention_config",
        "is missing",
        "A MiniMax-M3 sparse model needs it (sparse_attention_freq, sparse_index_dim, ...); check the config.",
    )


def _flags(sparse: ConfigReader, key: str) -> tuple[int, ...]:
    """Per-layer flags, SGLang-style: 0 is off, any other value on (empty when absent)."""
    return sparse.integer_list(key, minimum=0, maximum=DIM.maximum)
