"""Small MHA models and plans for the pool tests (plans go through the real pipeline and registry)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvpools_core import LayerSpec, ModelSpec, Plan, Serving, plan


def build_mha_model(
    *,
    layers: int = 4,
    kv_heads: int = 4,
    head_dim: int = 64,
    v_head_dim: int | None = None,
    dtype: str = "bfloat16",
    context_len: int = 256,
) -> ModelSpec:
    return ModelSpec(
        name="test-mha",
        architecture="mha",
        layers=[
            LayerSpec(
                index=i, kind="attention", num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head_dim or head_dim
            )
            for i in range(layers)
        ],
        context_len=context_len,
        dtype=dtype,
        num_attention_heads=max(16, kv_heads * 2),  # every TP size the tests use (up to 16) splits them
    )


def build_small_plan(memory: int = 4 << 20, *, model: ModelSpec | None = None, **serving: Any) -> Plan:
    """A plan of a few MiB (cheap to build on the CPU) through the real pipeline."""
    return plan(model or build_mha_model(), Serving(**serving), memory=memory)


@pytest.fixture(scope="session")
def mha_model() -> Callable[..., ModelSpec]:
    return build_mha_model


@pytest.fixture(scope="session")
def small_plan() -> Callable[..., Plan]:
    return build_small_plan
