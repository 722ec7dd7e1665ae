"""Tiny seeded transformers models and left-padded prompt batches (nothing is downloaded: weights are random)."""

from __future__ import annotations

from typing import Any

import torch

PROMPT_LENGTHS = (5, 9, 13, 17, 21, 25, 29, 3)
"""Eight prompts of different lengths (the issue asks for at least eight)."""
NEW_TOKENS = 64


def left_padded(lengths: tuple[int, ...], vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of ``lengths`` (token ids 3.., so no pad / bos / eos), left-padded, and their mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(3, vocab, (n,), generator=generator)
        mask[i, width - n :] = 1
    return ids, mask


def greedy(model: Any, ids: torch.Tensor, mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Exactly ``NEW_TOKENS`` greedy tokens per prompt (EOS does not stop them: every step is compared)."""
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        **kwargs,
    )


def seeded(model_class: Any, config: Any, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Any:
    """``model_class(config)`` with weights drawn from ``seed``, in ``dtype``, in eval mode."""
    torch.manual_seed(seed)
    return model_class(config).to(dtype).eval()


def llama(dtype: str = "bfloat16") -> Any:
    """A 2-layer Llama with grouped-query attention (4 query heads share 2 KV heads), hidden 64."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        dtype=dtype,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return seeded(LlamaForCausalLM, config, getattr(torch, dtype))


SLIDING_WINDOW = 8


def gemma3(attn_implementation: str = "sdpa") -> Any:
    """A 4-layer Gemma-3 text model, sliding and full layers alternating, window 8 (far below the sequences)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        dtype="bfloat16",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation=attn_implementation,
    )
    return seeded(Gemma3ForCausalLM, config)


def deepseek_v3() -> Any:
    """A 2-layer DeepSeek-V3 (MLA latent 32 + rope 16; the second layer MoE with 4 routed experts), hidden 64."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        q_lora_rank=32,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        max_position_embeddings=256,
        dtype="bfloat16",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return seeded(DeepseekV3ForCausalLM, config)


def mistral() -> Any:
    """A 2-layer Mistral whose every layer slides (window 8): the all-SWA form, one SWA pool and no mapping."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        sliding_window=SLIDING_WINDOW,
        dtype="bfloat16",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return seeded(MistralForCausalLM, config)


def qwen3_next() -> Any:
    """A 4-layer Qwen3-Next: gated-delta-net (linear attention) and full attention layers alternating, MoE MLPs.

    transformers runs its mixers on CPU through their torch fallbacks (it says so on stderr).
    """
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        max_position_embeddings=256,
        dtype="bfloat16",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return seeded(Qwen3NextForCausalLM, config)
