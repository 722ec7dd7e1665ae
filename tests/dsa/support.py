"""A small GLM-style DSA config (4 layers, R 128, r 32, index_head_dim 128), for the DSA, layout and Ascend tests."""

from __future__ import annotations

from typing import Any

SMALL_DSA: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "kv_lora_rank": 128,
    "qk_rope_head_dim": 32,
    "index_topk": 64,
    "index_head_dim": 128,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
}
