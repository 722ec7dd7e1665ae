"""The capacity record in the shapes two orchestrators read (``docs/serve.md`` documents every field and its reader).

* **Dynamo** — the SGLang worker publishes a ``RuntimeCapacity`` (``total_kv_blocks``, ``max_num_seqs``,
  ``max_num_batched_tokens``, ``data_parallel_start_rank``, ``data_parallel_size``) computed by
  ``runtime_capacity`` in ``components/src/dynamo/sglang/capacity.py`` (ai-dynamo/dynamo commit ``0075e708``):
  ``total_kv_blocks = tokens_to_kv_blocks(max_total_num_tokens, page_size)`` (a ceiling division, the tokens
  themselves at page 1), ``max_num_seqs = max_running_requests // dp_size``.  Here the same fields come from the
  plan, before the engine starts.
* **llm-d** — the router's ``approx-prefix-cache-producer`` keeps at most ``lruCapacityPerServer`` block entries
  per pod, each block ``blockSizeTokens`` tokens (llm-d/llm-d-router's plugin configuration,
  ``LRUCapacityPerServer int `json:"lruCapacityPerServer"```, whose default 31250 its comment derives as the
  tokens an H100 caches divided by the block size).  Here: the blocks of every worker of one server.
"""

from __future__ import annotations

from typing import Any


def _stages(document: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per pipeline stage: the ranks of a stage share every number."""
    seen: dict[int, dict[str, Any]] = {}
    for record in document["records"]:
        seen.setdefault(record["pp_rank"], record)
    return [seen[rank] for rank in sorted(seen)]


def dynamo_shape(document: dict[str, Any]) -> dict[str, Any]:
    """What Dynamo's SGLang worker would publish (``RuntimeCapacity``), per pipeline stage, from a document."""
    workers = []
    for record in _stages(document):
        par = record["parallelism"]
        page = record["block_size"]
        tokens = record["max_total_num_tokens"]
        blocks = tokens if page <= 1 else -(-tokens // page)
        local_dp = par["dp_size"] if par["enable_dp_attention"] and par["dp_size"] > 1 else 1
        workers.append(
            {
                "pp_rank": record["pp_rank"],
                "runtime_capacity": {
                    "total_kv_blocks": blocks,
                    "max_num_seqs": record["max_running_requests"],
                    "max_num_batched_tokens": None,
                    "data_parallel_start_rank": 0,
                    "data_parallel_size": local_dp,
                },
                "page_size": page,
                "host_tokens": record["host_tokens"],
                "binding_group": record["binding_group"],
                "groups": [
                    {key: group[key] for key in ("name", "kind", "total_blocks", "blocks_per_request", "max_requests")}
                    for group in record["groups"]
                ],
            }
        )
    return {
        "schema": "kvpools.dynamo-runtime-capacity",
        "version": 1,
        "context_len": document["context_len"],
        "complete": document["complete"],
        "workers": workers,
    }


def llm_d_shape(document: dict[str, Any]) -> dict[str, Any]:
    """The llm-d router's prefix-cache parameters for one server (pod) of this deployment."""
    record = _stages(document)[0]
    par = record["parallelism"]
    page = record["block_size"]
    device_blocks = record["max_total_num_tokens"] // page
    host_blocks = (record["host_tokens"] or 0) // page
    workers = par["dp_size"]  # DP-attention workers or DP replicas: each keeps its own prefix cache in one server
    capacity = max(device_blocks, host_blocks) * workers
    notes = []
    if page < 16:
        notes.append(
            f"blockSizeTokens {page} is below the 16 llm-d recommends (its index costs ~60-70 bytes per entry and "
            f"autoTune clamps the block to 16): launch SGLang with --page-size 16 or more so router and engine agree."
        )
    return {
        "schema": "kvpools.llm-d-prefix-cache",
        "version": 1,
        "context_len": document["context_len"],
        "parameters": {"autoTune": False, "blockSizeTokens": page, "lruCapacityPerServer": capacity},
        "device_blocks_per_worker": device_blocks,
        "host_blocks_per_worker": host_blocks if record["host_tokens"] is not None else None,
        "workers_per_server": workers,
        "notes": notes,
    }
