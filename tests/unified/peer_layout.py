"""The peer server's answers about SGLang 0.5.23's page-major layout and the side states under unified memory.

Imported by ``unified_peer_server.py`` inside the peers venv (never by kvpools' tests): each function calls the
installed SGLang code and returns plain JSON values.
"""

from __future__ import annotations

import inspect
import types
from typing import Any


def answer(op: str, req: dict[str, Any], *, hook: Any, ump: Any) -> dict[str, Any]:
    if op == "page_major":
        return page_major(hook, req["args"])
    if op == "ple":
        return ple(ump)
    if op == "envelope":
        return envelope(req)
    return signatures(ump)


def page_major(hook: Any, args: dict[str, Any]) -> dict[str, Any]:
    """``handle_page_major_kv_layout`` on a server-args namespace: SGLang's refusal (or None) and whether the flag
    ends up on (``--enable-unified-memory`` declares it)."""
    cfg = types.SimpleNamespace(**args)

    def declare(server_args: Any, _source: str, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(server_args, name, value)

    hook.declare_resolution = declare
    try:
        hook.handle_page_major_kv_layout(cfg)
        error = None
    except AssertionError as exc:
        error = str(exc)
    return {"error": error, "enable_page_major_kv_layout": cfg.enable_page_major_kv_layout}


def ple(ump: Any) -> dict[str, Any]:
    """``UnifiedHybridReqToTokenPool._init_mamba_pool`` asked for Qwen4-Exp's short-conv state."""
    pool = object.__new__(ump.UnifiedHybridReqToTokenPool)
    try:
        pool._init_mamba_pool(
            mamba_size=1,
            mamba_spec_state_size=1,
            cache_params=None,
            mamba_layer_ids=[0],
            device="cpu",
            enable_mamba_extra_buffer=False,
            short_conv_layer_ids=[1],
            short_conv_state_shape=(8, 3),
            ngram_context_len=4,
        )
    except ValueError as exc:
        return {"error": str(exc)}
    return {"error": None}


def signatures(ump: Any) -> dict[str, Any]:
    """The parameters of the unified Mamba factory and of its request pool: what can reach the arena."""
    return {
        "init_unified_mamba_pools": sorted(inspect.signature(ump.init_unified_mamba_pools).parameters),
        "UnifiedHybridReqToTokenPool": sorted(inspect.signature(ump.UnifiedHybridReqToTokenPool).parameters),
    }


def envelope(req: dict[str, Any]) -> dict[str, Any]:
    """``layout/token_major.py`` ``mamba_entry_bytes``: one slot of the envelope-layout Mamba pool (bf16 conv, fp32
    temporal), the entry ``MambaPool(envelope_layout=True)`` allocates ``size + 1`` of."""
    import torch
    from sglang.srt.mem_cache.layout.token_major import mamba_entry_bytes

    return {
        "entry": mamba_entry_bytes(
            layer_num=req["layers"],
            conv_state_shapes=[tuple(s) for s in req["conv"]],
            conv_dtype=torch.bfloat16,
            temporal_state_shape=tuple(req["temporal"]),
            temporal_dtype=torch.float32,
        )
    }
