"""QSA (Qwen sparse attention) pools: SGLang 0.5.23's ``QSATokenToKVPool`` beside a linear-attention hybrid's KV.

A text config with ``indexer_n_heads`` has a QSA profile (``parse_qsa_profile``,
``layers/attention/qsa/config.py``): ``indexer_n_heads``, ``indexer_kv_heads`` (must be 1),
``indexer_head_dim``, ``indexer_budget`` and ``indexer_compress_ratio`` (at least 2, dividing the budget, with
``budget / ratio`` 512 or 2048), each positive.  ``_build_hybrid_linear_kv_pool`` (ref-000 lines 1938-1957) then
builds a ``QSATokenToKVPool`` (``mem_cache/qsa_kv_pool.py``), which adds to the full-attention KV, for the
``L`` full-attention layers of the rank and the request table's ``R`` rows (``num_request_slots``):

* ``qsa_compressed_k``: the compressed index keys, one flat ``(L, ceil((size + page) / ratio) x kv_heads x
  head_dim)`` tensor in the indexer dtype (``--qsa-indexer-dtype auto``: bf16), so per token of the pool's
  rows ``L x kv_heads x head_dim x 2 / ratio`` bytes (the page is a multiple of the ratio);
* ``qsa_key_state``: per layer the pending key ring ``(R x ratio, kv_heads, head_dim)`` bf16, per request row;
* ``qsa_rope_positions``: one ``(R x ratio, 3)`` int64 ring of MRoPE positions, per request row.

The reference's cell (``pool_configurator.py``) does not count them (0.5.23's adds the compressed keys); no
``--qsa-indexer-dtype`` option exists here (fp8 is not modelled).  Combinations kvpools does not lay out yet are
refused by :func:`qsa_problems`.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvpools_core.config import ConfigReader
from kvpools_core.options import option
from kvpools_core.parts.sizing import req_to_token_rows, request_rows_cost, with_cost
from kvpools_core.values import REQUEST, ModelSpec, PoolSpec, Serving

QSA_COMPRESSED_POOL = "qsa_compressed_k"
QSA_KEY_STATE_POOL = "qsa_key_state"
QSA_ROPE_POOL = "qsa_rope_positions"
QSA_POOLS = (QSA_COMPRESSED_POOL, QSA_KEY_STATE_POOL, QSA_ROPE_POOL)
INDEX_BYTES = 2
"""bf16: the pending ring always, the compressed keys under ``--qsa-indexer-dtype auto``."""
ROPE_BYTES = 3 * 8
"""Three int64 MRoPE coordinates per pending key."""
QSA_PAGE_SIZE = 64
"""The page SGLang's Qwen4-Exp override sets for a QSA profile (``arg_groups/model_overrides/qwen4_exp.py``)."""
_FIELDS = ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")
_BLOCK_TOPK = (512, 2048)


@attrs.frozen
class QSAProfile:
    n_heads: int
    kv_heads: int
    head_dim: int
    budget: int
    compress_ratio: int

    @property
    def index_k_bytes(self) -> int:
        """One token's pending index key, bf16 (``_index_k_bytes`` with ``index_state_dtype``)."""
        return self.kv_heads * self.head_dim * INDEX_BYTES

    def compressed_k_bytes(self, serving: Serving) -> int:
        """One compressed key in ``--qsa-indexer-dtype`` (``resolve_qsa_indexer_dtype``: fp8_e4m3 1 B, else bf16)."""
        return self.kv_heads * self.head_dim * compressed_item_bytes(serving)

    def describe(self) -> str:
        return (
            f"QSA indexer: {self.kv_heads} x {self.head_dim} bf16 keys compressed 1:{self.compress_ratio}, "
            f"budget {self.budget}"
        )


def parse_qsa_profile(reader: ConfigReader) -> dict[str, int] | None:
    """SGLang's ``parse_qsa_profile`` / ``_parse_compressed`` on a text config, its errors as ``ConfigError``."""
    if reader.get("indexer_n_heads") is None:
        return None
    missing = [name for name in _FIELDS if reader.get(name) is None]
    if missing:
        raise reader.error(
            missing[0], "is missing", f"SGLang raises 'QSA config is missing required fields: {missing}'."
        )
    values = {name: reader.integer(name) for name in _FIELDS}
    bad = [name for name, value in values.items() if value <= 0]
    if bad:
        raise reader.error(
            bad[0], f"is {values[bad[0]]}", f"SGLang raises 'QSA config values must be positive: {values}'."
        )
    if values["indexer_kv_heads"] != 1:
        raise reader.error(
            "indexer_kv_heads",
            f"is {values['indexer_kv_heads']}",
            "SGLang raises 'the QSA MQA operators require indexer_kv_heads=1'.",
        )
    ratio, budget = values["indexer_compress_ratio"], values["indexer_budget"]
    if ratio < 2:
        raise reader.error(
            "indexer_compress_ratio",
            f"is {ratio}",
            f"SGLang raises 'QSA requires indexer_compress_ratio >= 2, got {ratio}'.",
        )
    if budget % ratio:
        raise reader.error(
            "indexer_budget",
            f"is {budget}",
            f"SGLang raises 'indexer_budget must be divisible by indexer_compress_ratio, got {budget} / {ratio}'.",
        )
    if budget // ratio not in _BLOCK_TOPK:
        raise reader.error(
            "indexer_budget",
            f"is {budget}",
            "SGLang raises 'fast_topk_v2 requires indexer_budget / indexer_compress_ratio to be one of "
            f"{list(_BLOCK_TOPK)}, got {budget // ratio}'.",
        )
    return {
        "n_heads": values["indexer_n_heads"],
        "kv_heads": values["indexer_kv_heads"],
        "head_dim": values["indexer_head_dim"],
        "budget": budget,
        "compress_ratio": ratio,
    }


def qsa_profile(model: ModelSpec) -> QSAProfile | None:
    data: Any = model.params.get("qsa")
    return None if not data else QSAProfile(**dict(data))


def compressed_item_bytes(serving: Serving) -> int:
    return 1 if serving.qsa_indexer_dtype == "fp8_e4m3" else INDEX_BYTES


def compressed_bytes_per_token(profile: QSAProfile, layers: int, serving: Serving) -> int:
    """``qsa_compressed_k`` bytes per row of the full pool (``qsa_bytes_per_token`` of ``QSATokenToKVPool``)."""
    return profile.compressed_k_bytes(serving) // profile.compress_ratio * layers


def ring_bytes_per_row(profile: QSAProfile, layers: int) -> tuple[int, int]:
    """``(qsa_key_state, qsa_rope_positions)`` bytes per request row: ``ratio`` pending keys of every layer, and
    ``ratio`` MRoPE positions shared by the layers."""
    ratio = profile.compress_ratio
    return ratio * profile.index_k_bytes * layers, ratio * ROPE_BYTES


def qsa_problems(model: ModelSpec, serving: Serving, *, mla: bool) -> list[str]:
    """What SGLang's ``QSATokenToKVPool`` refuses, and what kvpools does not lay out yet, for a QSA model."""
    profile = qsa_profile(model)
    if profile is None:
        return []
    o = option
    ratio, page = profile.compress_ratio, serving.page_size
    problems = []
    if page <= 1 or page % ratio:
        problems.append(
            f"{model.name} has a QSA indexer (compress ratio {ratio}) and {o('page_size')} is {page}: SGLang raises "
            "'compressed QSA requires a paged full-KV cache with the page a multiple of the compress ratio "
            f"(compressed slots are full_slot // ratio): page_size={page}, ratio={ratio}.' Pass {o('page_size')} "
            f"{QSA_PAGE_SIZE} (SGLang's Qwen4-Exp default) or another multiple of {ratio}."
        )
    if profile.compressed_k_bytes(serving) % ratio:
        problems.append(
            f"{model.name}'s compressed QSA index key ({profile.compressed_k_bytes(serving)} B) does not divide by its "
            f"compress ratio {ratio}: kvpools does not model the rounding of SGLang's per-token charge yet."
        )
    if serving.qsa_indexer_dtype == "fp8_e4m3" and serving.platform != "cuda":
        problems.append(
            f"{o('qsa_indexer_dtype')} fp8_e4m3 on the {serving.platform} platform: SGLang raises '--qsa-indexer-dtype "
            "fp8_e4m3 requires a CUDA SM90/SM100 GPU'. Use the cuda platform (kvpools assumes SM90 or SM100 there)."
        )
    unmodelled = [
        (mla, "an MLA full-attention side"),
        (serving.speculative, f"{o('speculative_algorithm')} (the draft worker's own QSA pool)"),
        (serving.enable_hierarchical_cache, f"{o('enable_hierarchical_cache')} (the QSA host buffers)"),
        (serving.enable_unified_memory, o("enable_unified_memory")),
        (serving.dcp_size > 1, f"{o('dcp_size')} {serving.dcp_size}"),
        (serving.kv_cache_dtype not in ("auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2"), o("kv_cache_dtype")),
    ]
    problems += [
        f"kvpools does not model QSA (Qwen sparse attention) pools with {what} yet: drop it to plan {model.name}."
        for bad, what in unmodelled
        if bad
    ]
    return problems


def qsa_request_pools(profile: QSAProfile, layers: int, requests: int, serving: Serving, owner: str) -> list[PoolSpec]:
    """``qsa_key_state`` and ``qsa_rope_positions``: ``ratio`` rows per request-table row (``num_request_slots``
    = the table's rows, padding row included), uncharged by SGLang's budget."""
    rows, padding = req_to_token_rows(requests, serving)
    key_state, rope = ring_bytes_per_row(profile, layers)
    pools = []
    for name, per_row in ((QSA_KEY_STATE_POOL, key_state), (QSA_ROPE_POOL, rope)):
        if not per_row:
            continue
        pool = PoolSpec(
            name=name,
            kind="state",
            slots=rows,
            padding_slots=padding,
            bytes_per_slot=per_row,
            bytes=(rows + padding) * per_row,
            sglang_charged=False,
            owner=owner,
            unit=REQUEST,
        )
        pools.append(with_cost(pool, request_rows_cost(pool, requests)))
    return pools
