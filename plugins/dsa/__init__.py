"""DSA (DeepSeek sparse attention, DeepSeek-V3.2 and GLM-5): MLA plus the lightning indexer's key cache.

Claims configs SGLang's ``is_deepseek_dsa`` recognises (a DSA architecture
with ``index_topk``); declines everything else.  Every layer caches the MLA
latent row (the :mod:`kvpools_plugins.mla` math) and, in a separate paged
buffer, the indexer key: ``index_head_dim`` fp8 values and one fp32 scale per
128 of them (132 bytes for DeepSeek-V3.2).

With fp8 KV the latent row is FlashMLA's packed layout, 656 bytes for
DeepSeek-V3.2 (``calculate_mla_kv_cache_dim``), unless a TRTLLM DSA backend
(or a raw-layout ROCm backend) serves the local role; SGLang's configurator
still charges 576 for it, so ``--accounting sglang`` keeps that figure and
the exact accounting charges the 656 bytes the pool stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpools_core import hookimpl
from kvpools_core.config import ConfigReader
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.values import CellPart, CellSize, LayerSpec, ModelSpec, Plan, Serving

from ..mla import mla_problems, model_dims
from ..mla.config import has_mla_latent, is_deepseek_dsa, mla_model_spec
from ..mla.latent import FP8_BLOCK, LatentRow, sglang_latent_cell

ARCHITECTURE = "dsa"
INDEX_POOL = "indexer"
INDEX_BLOCK = 128
"""Index-key values sharing one fp32 scale (``DSATokenToKVPool.quant_block_size``)."""
INDEX_HEAD_DIM = 128
"""The only index head dim SGLang's DSA pool accepts."""
INDEX_EXTRA_SLOTS = 1
"""The indexer buffer holds ``(tokens + page_size + 1) // page_size`` pages (two padding slots at page size 1)."""
CUDA_PAGE_SIZE = 64
RAW_LAYOUT_ROCM_BACKENDS = frozenset({"tilelang", "triton", "aiter"})
ROCM_PLATFORMS = frozenset({"rocm", "hip"})
PRESET_DIR = Path(__file__).parent / "presets"


@hookimpl
def presets() -> dict[str, str]:
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    outer = ConfigReader(config, source)
    reader = outer.text()
    if not is_deepseek_dsa(outer) or not has_mla_latent(reader):
        return None
    indexer = {
        "index_head_dim": reader.integer("index_head_dim"),
        "index_topk": reader.integer("index_topk"),
        "index_n_heads": reader.integer("index_n_heads", 0, minimum=0),
    }
    return mla_model_spec(config, source, architecture=ARCHITECTURE, kind="dsa", layer_params=indexer)


@hookimpl
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    if model.architecture != ARCHITECTURE:
        return None
    return dsa_problems(model, serving)


def dsa_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang's DSA pools cannot hold (shared with the swa plugin's hybrid MLA-SWA full layers)."""
    problems = mla_problems(model, serving)
    index_dim = model.layers[0].params["index_head_dim"]
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
    problems += page_size_problems(serving)
    return problems


@hookimpl
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    if model.architecture != ARCHITECTURE:
        return None
    start, end = rank_layer_range(model, serving)
    return dsa_cell_size(model.layers[start:end], model, serving)


@hookimpl
def build_pool(plan: Plan, device: str) -> Any | None:
    if plan.model.architecture != ARCHITECTURE:
        return None
    from .pool import DSATokenToKVPool

    return DSATokenToKVPool.from_plan(plan, device)


def dsa_cell_size(layers: tuple[LayerSpec, ...], model: ModelSpec, serving: Serving) -> CellSize:
    """Latent row + indexer key per stored layer (``ceil(L / cp) + 1`` of them under the cache layer split).

    ``num_layers`` stays the stage's layer count: SGLang scales the draft's
    share by it, not by the split's stored layers; the draft keeps every layer,
    so one draft layer's parts are given explicitly.
    """
    num_layers = len(layers)
    stored = stored_layers(num_layers, serving)
    row = latent_row(model, serving)
    index_bytes = index_row_bytes(model)
    sglang = sglang_latent_cell(row.dims, row.kv, stored) + index_bytes * stored
    parts = [*row.cell_parts(stored), CellPart("indexer", index_bytes * stored, INDEX_POOL, INDEX_EXTRA_SLOTS)]
    one_layer = (*row.cell_parts(1), CellPart("indexer", index_bytes, INDEX_POOL, INDEX_EXTRA_SLOTS))
    notes = []
    if row.packed_fp8:
        notes.append(
            f"fp8 DSA latent row: {row.row_bytes} B per layer (FlashMLA's packed layout); SGLang's cell size "
            f"charges {row.dims.kv_cache_dim} B for it"
        )
    if row.kv.is_fp4:
        notes.append("fp4 DSA latent: stored as MLATokenToKVPoolFP4 rows (SGLang's DSA pool has no fp4 layout)")
    if layer_split(serving):
        notes.append(
            f"DSA cache layer split over {serving.attn_cp_size} CP ranks: {stored - 1} owned layer(s) of "
            f"{num_layers} plus one remote scratch layer"
        )
    return CellSize(
        parts=parts,
        sglang_bytes_per_token=max(sglang, 1),
        num_layers=num_layers,
        draft_layer_parts=one_layer if layer_split(serving) else (),
        notes=notes,
    )


def latent_row(model: ModelSpec, serving: Serving) -> LatentRow:
    """SGLang's ``calculate_mla_kv_cache_dim``: the packed fp8 row unless the local role reads raw MLA rows."""
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    packed = kv.name == "fp8_e4m3" and not reads_raw_latent(serving)
    return LatentRow(model_dims(model), kv, packed_fp8=packed)


def reads_raw_latent(serving: Serving) -> bool:
    """TRTLLM backends of the local role (and ROCm's tilelang/triton/aiter) read the raw 576-element MLA row."""
    prefill, decode = serving.dsa_prefill_backend, serving.dsa_decode_backend
    role = {"decode": (decode,), "prefill": (prefill,)}.get(serving.disaggregation_mode, (prefill, decode))
    if "trtllm" in role:
        return True
    return serving.platform in ROCM_PLATFORMS and bool({prefill, decode} & RAW_LAYOUT_ROCM_BACKENDS)


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


def index_row_bytes(model: ModelSpec) -> int:
    """Indexer bytes per token per layer: fp8 keys and one fp32 scale per 128 (132 for index_head_dim 128)."""
    dim = int(model.layers[0].params["index_head_dim"])
    return dim + dim // INDEX_BLOCK * 4


def page_size_problems(serving: Serving) -> list[str]:
    """SGLang's DSA pool asserts page size 64 on CUDA, and 1 or a multiple of 16 on ROCm."""
    page = serving.page_size
    if serving.platform == "cuda" and page != CUDA_PAGE_SIZE:
        return [
            f"DSA models need {option('page_size')} {CUDA_PAGE_SIZE} on CUDA (SGLang's DSA pool and FlashMLA's sparse "
            f"kernels page the cache by {CUDA_PAGE_SIZE} tokens); got {option('page_size')} {page}."
        ]
    if serving.platform in ROCM_PLATFORMS and page != 1 and page % 16:
        return [
            f"DSA models need {option('page_size')} 1, or a multiple of 16 with AITER's preshuffled paged MQA, on "
            f"ROCm; "
            f"got {option('page_size')} {page}."
        ]
    return []
