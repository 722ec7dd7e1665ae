"""Hypothesis strategies for models, serving options and budgets (shared by property tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from kvpools_core import LayerSpec, ModelSpec, Serving

GiB = 1 << 30


@st.composite
def mha_models(draw: st.DrawFn) -> ModelSpec:
    num_layers = draw(st.integers(3, 96))  # at least one layer per pipeline stage (pp <= 3)
    kv_heads = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    head_dim = draw(st.sampled_from([64, 96, 128, 192, 256]))
    v_head_dim = draw(st.sampled_from([head_dim, 64, 128]))
    layers = [
        LayerSpec(index=i, kind="attention", num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head_dim)
        for i in range(num_layers)
    ]
    return ModelSpec(
        name="generated",
        architecture="mha",
        layers=layers,
        context_len=draw(st.sampled_from([512, 4096, 32768, 131072])),
        dtype=draw(st.sampled_from(["bfloat16", "float16", "float32"])),
        # powers of two from 16: every TP size of ``servings`` splits them, as real deployments do
        num_attention_heads=max(16, kv_heads * draw(st.sampled_from([1, 2, 4, 8]))),
        num_nextn_predict_layers=draw(st.integers(0, 2)),
    )


@st.composite
def servings(draw: st.DrawFn, accounting: str | None = None) -> Serving:
    tp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    pp = draw(st.sampled_from([1, 1, 2, 3]))
    dp_attention = draw(st.booleans()) and tp > 1
    spec = draw(st.sampled_from([None, None, "EAGLE", "DFLASH", "STANDALONE"]))
    return Serving(
        kv_cache_dtype=draw(st.sampled_from(["auto", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"])),
        page_size=draw(st.sampled_from([1, 16, 64])),
        tp_size=tp,
        pp_size=pp,
        pp_rank=draw(st.integers(0, pp - 1)),
        dp_size=tp if dp_attention else 1,
        enable_dp_attention=dp_attention,
        # at least one request per DP-attention worker (fewer is refused)
        max_running_requests=draw(st.one_of(st.none(), st.integers(tp if dp_attention else 1, 8192))),
        max_total_tokens=draw(st.one_of(st.none(), st.integers(1, 5_000_000))),
        speculative_algorithm=spec,
        speculative_draft_num_layers=draw(st.integers(1, 4)) if spec else None,
        **_draft_shape(draw, spec),
        accounting=accounting or draw(st.sampled_from(["exact", "sglang"])),
    )


def _draft_shape(draw: st.DrawFn, spec: str | None) -> dict[str, int | None]:
    """Draft parameters SGLang 0.5.23 runs as given (issue 32): EAGLE / STANDALONE all unset (its auto choice) or
    steps with top-k 1 and steps + 1 draft tokens; DFLASH its draft tokens (steps and top-k 1 when unset)."""
    if spec == "DFLASH":
        return {"speculative_num_draft_tokens": draw(st.integers(1, 8))}
    steps = draw(st.one_of(st.none(), st.integers(1, 7))) if spec else None
    if steps is None:
        return {}
    return {"speculative_num_steps": steps, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1}


budgets = st.integers(1 << 20, 200 * GiB)
