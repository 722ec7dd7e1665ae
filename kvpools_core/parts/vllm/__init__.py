"""vLLM 0.33's per-layer KV-cache specs and the layer arithmetic plugins answer ``vllm_kv_cache_specs`` with.

The vocabulary of the ``vllm_kv_cache_specs`` hook (frozen values, no vLLM or torch import); the planner that
groups and sizes them is vLLM's engine, :mod:`kvpools_core.engines.vllm`.
"""
