"""Run vLLM 0.33's own KV-cache planning on cases sent as JSON lines; run by the peers venv's Python.

Started by ``tests/vllm/peer.py`` as ``python vllm_runner.py SHARED_BENCH_DIR``; reads one JSON case per stdin
line and writes one JSON answer per stdout line.  The planning functions, spec classes, spec registry and
layout enum are vLLM's installed code, imported with ``peer_imports`` (``../shared/bench``) as the benchmarks
do; the stand-ins are only for what planning never reaches on this path (listed in ``_install``) and for
``VllmConfig`` (a namespace holding exactly the fields the planner reads).  Nothing of vLLM is copied here.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from types import SimpleNamespace

DTYPE_NAMES = {1: "float8_e4m3fn", 2: "bfloat16", 4: "float32"}
DEFAULT_BUILDER = "vllm.v1.core.kv_cache_planning.DefaultKVCacheConfigBuilder"


class _Platform:
    """``current_platform`` for the planner: the default builder, no custom specs (the base ``Platform``'s)."""

    def get_kv_cache_config_builder_cls(self, vllm_config):
        return DEFAULT_BUILDER

    def register_custom_kv_cache_specs(self, vllm_config):
        return None

    def is_pin_memory_available(self):  # read at import by ``vllm.utils.torch_utils``; no device here
        return False


def _install(bench_dir: str):
    sys.path.insert(0, bench_dir)
    import peer_imports as p

    p.install()
    for package in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.distributed"):
        p._BARE.add(package)  # heavy __init__s (torch patching, NCCL)
    p._STUB.add("vllm.distributed.kv_events", MEDIUM_GPU="GPU", MEDIUM_CPU="CPU")  # KV events off
    p._STUB.add("vllm.platforms", current_platform=_Platform())
    # ``logger.info_once`` asks whether this is the first local rank (one process here: it is).
    p._STUB.add("vllm.distributed.parallel_state", is_local_first_rank=lambda: True)
    # The attention backends' module (quantization, transformers) is read only for the ``MultipleOf`` class of
    # ``block_stride_alignment``; no spec here sets one (``None`` -> alignment 1), so a bare class stands in.
    p._STUB.add("vllm.v1.attention.backend", MultipleOf=type("MultipleOf", (), {}))
    # pydantic config tree (replaced by the namespace below), request/multimodal/metrics types, HiSparse
    # runtime (HiSparse off), and third-party modules imported by utilities planning does not call.
    for name in (
        "vllm.config",
        "vllm.multimodal",
        "vllm.v1.request",
        "vllm.v1.core.kv_cache_metrics",
        "vllm.v1.hisparse.runtime",
        "psutil",
        "regex",
        "uvloop",
        "cpuinfo",
        "requests",
        "zmq",
        "urllib3",
    ):
        p._STUB.add(name)
    # torch version probes read ``packaging``, absent from the --no-deps install; torch 2.13 passes them all.
    p._STUB.add(
        "vllm.utils.torch_version",
        is_torch_equal_or_newer=lambda target: True,
        is_torch_less_than=lambda target: False,
    )
    planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
    interface = importlib.import_module("vllm.v1.kv_cache_interface")
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    managers = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    managers.register_all_kvcache_specs(None)
    return planning, interface, utils


def _config(case):
    limits = case["limits"]
    max_concurrent_batches = limits["max_concurrent_batches"]
    max_num_batched_tokens = limits["max_num_batched_tokens"]
    from vllm.v1.kv_cache_layout import KVCacheLayout

    cache_config = SimpleNamespace(
        num_gpu_blocks_override=case.get("num_gpu_blocks_override"),
        kv_cache_layout="LBNHC",
        prefix_cache_retention_interval=None,
        mamba_cache_mode=limits["mamba_cache_mode"],
        get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBNHC,
    )
    return SimpleNamespace(
        model_config=SimpleNamespace(
            max_model_len=limits["max_model_len"],
            original_max_model_len=-1 if case.get("auto_fit") else limits["max_model_len"],
            supports_kv_cache_grouping=False,
        ),
        cache_config=cache_config,
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=max_num_batched_tokens
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=case.get("tp_size", 1),
            decode_context_parallel_size=limits["decode_context_parallel_size"],
            pipeline_parallel_size=len(case["workers"]),
        ),
        device_config=SimpleNamespace(device_type="cuda"),
        speculative_config=None,
        num_prefill_lookahead_tokens=0,
        max_in_flight_tokens=max_concurrent_batches * max_num_batched_tokens,
    )


def _spec(interface, data):
    import torch

    kind = data["kind"]
    common = {"block_size": data["block_size"]}
    if kind == "mamba":
        return interface.MambaSpec(
            shapes=tuple(tuple(s) for s in data["shapes"]),
            dtypes=tuple(getattr(torch, DTYPE_NAMES[b]) for b in data["dtype_bytes"]),
            num_speculative_blocks=data.get("num_speculative_blocks", 0),
            **common,
        )
    attention = dict(
        common,
        num_kv_heads=data["num_kv_heads"],
        head_size=data["head_size"],
        dtype=getattr(torch, DTYPE_NAMES[data["dtype_bytes"]]),
        state_content_bytes=data.get("state_content_bytes"),
    )
    if kind == "mla":
        return interface.MLAAttentionSpec(
            cache_dtype_str=data.get("cache_dtype_str"),
            cache_role=interface.SparseCacheRole(data.get("cache_role", "sparse")),
            **attention,
        )
    attention["head_size_v"] = data["head_size_v"]
    if kind == "full":
        return interface.FullAttentionSpec(**attention)
    if kind == "sliding_window":
        return interface.SlidingWindowSpec(sliding_window=data["sliding_window"], **attention)
    if kind == "chunked_local":
        return interface.ChunkedLocalAttentionSpec(attention_chunk_size=data["attention_chunk_size"], **attention)
    raise ValueError(f"unknown spec kind {kind!r}")


def _plan(planning, interface, utils, case):
    config = _config(case)
    workers = [{name: _spec(interface, spec) for name, spec in worker.items()} for worker in case["workers"]]
    answer: dict = {}
    try:
        groups = planning.get_global_kv_cache_groups(config, workers)
    except NotImplementedError as error:
        return {"error": "NotImplementedError", "message": str(error)}
    answer["groups"] = [
        {
            "layers": list(g.layer_names),
            "block_size": g.kv_cache_spec.block_size,
            "page": g.kv_cache_spec.page_size_bytes,
        }
        for g in groups
    ]
    builder = planning.DefaultKVCacheConfigBuilder()
    projected = [planning._project_kv_cache_groups_to_worker(groups, worker) for worker in workers]
    memory = case["available_memory"]
    answer["bytes_per_block"] = [planning._pool_bytes_per_block_from_builder(builder, config, g) for g in projected]
    answer["estimates"] = [
        planning._estimate_max_model_len_from_groups(builder, config, g, m - b)
        for g, m, b in zip(projected, memory, answer["bytes_per_block"], strict=True)
    ]
    try:
        configs = planning.get_kv_cache_configs(config, workers, list(memory), groups)
    except ValueError as error:
        answer.update(error="ValueError", message=str(error))
        return answer
    scheduler = utils.generate_scheduler_kv_cache_config(configs)
    tokens, concurrency = utils.get_kv_cache_capacity(config, scheduler)
    answer.update(
        num_gpu_blocks=scheduler.num_blocks,
        max_model_len=config.model_config.max_model_len,
        max_concurrency=concurrency,
        kv_cache_size_tokens=tokens,
        tensor_bytes=[sum(t.size for t in c.kv_cache_tensors[:1]) for c in configs],
    )
    return answer


def main() -> None:
    planning, interface, utils = _install(sys.argv[1])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            answer = _plan(planning, interface, utils, json.loads(line))
        except Exception as error:  # reported to the test, which fails with vLLM's traceback
            answer = {"error": type(error).__name__, "message": str(error), "traceback": traceback.format_exc()}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
