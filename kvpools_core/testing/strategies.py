"""Hypothesis strategies for plugin tests: models, configs, serving options and budgets.

Every strategy draws from the values real deployments use (powers of two,
SGLang's page sizes, the kv dtypes the CLI offers), so a failure shrinks to a
case a person can read and replay with ``kvpools plan``.  They compose:
``servings(model)`` only draws parallelism that splits ``model``'s heads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from kvpools_core.registry import Registry
from kvpools_core.values import LayerSpec, ModelSpec, PlatformTraits, Serving

__all__ = [
    "KV_DTYPES",
    "PAGE_SIZES",
    "GiB",
    "budgets",
    "mha_models",
    "page_sizes",
    "plugin_presets",
    "preset_configs",
    "servings",
    "tp_sizes",
]

GiB = 1 << 30
PAGE_SIZES = (1, 16, 64, 128, 256)
"""Page sizes SGLang's backends use (1, FlashInfer/Triton 16, FlashMLA/DSA 64, Ascend 128, DeepSeek-V4 256)."""
KV_DTYPES = ("auto", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
SPECULATIVE = (None, None, None, "EAGLE", "NEXTN")


def tp_sizes(model: ModelSpec, limit: int = 16) -> list[int]:
    """TP sizes whose ranks split ``model``'s heads as SGLang's QKV projection does.

    Query heads divide evenly; every layer's KV heads divide evenly or are
    replicated (the ranks a multiple of the KV heads).
    """
    sizes = []
    for tp in (1, 2, 4, 8, 16):
        if tp > limit or model.num_attention_heads % tp:
            continue
        if all(layer.num_kv_heads % tp == 0 or tp % layer.num_kv_heads == 0 for layer in model.layers):
            sizes.append(tp)
    return sizes


def page_sizes(traits: PlatformTraits | None = None) -> list[int]:
    """The page sizes a platform's every-model rules accept (all of :data:`PAGE_SIZES` without rules)."""
    if traits is None:
        return list(PAGE_SIZES)
    return [p for p in PAGE_SIZES if not traits.page_size_problems(p)] or list(PAGE_SIZES)


@st.composite
def servings(
    draw: st.DrawFn,
    model: ModelSpec,
    *,
    platform: str = "cpu",
    traits: PlatformTraits | None = None,
    accounting: str = "exact",
    speculative: bool = True,
) -> Serving:
    """Serving options for ``model`` on ``platform``: TP that splits its heads, pages the platform accepts (or the
    page left unset, so that the engine's per-model default applies).

    Draws kv dtype, page size, TP (optionally with DP attention), request and
    context caps, and speculative decoding; combinations a plugin refuses are
    the plugin's to refuse (``validate``), with a message naming an option.
    """
    tp = draw(st.sampled_from(tp_sizes(model)), label="tp_size")
    dp_attention = tp > 1 and draw(st.booleans(), label="enable_dp_attention")
    algorithm = draw(st.sampled_from(SPECULATIVE), label="speculative_algorithm") if speculative else None
    options: dict[str, Any] = dict(
        platform=platform,
        accounting=accounting,
        kv_cache_dtype=draw(st.sampled_from(KV_DTYPES), label="kv_cache_dtype"),
        tp_size=tp,
        dp_size=tp if dp_attention else 1,
        enable_dp_attention=dp_attention,
        max_running_requests=draw(
            st.one_of(st.none(), st.sampled_from([tp if dp_attention else 1, 16, 64, 256, 1024])),
            label="max_running_requests",
        ),
        context_length=draw(
            st.one_of(st.none(), *[st.just(c) for c in (2048, 8192, 32768) if c <= model.context_len]),
            label="context_length",
        ),
    )
    page = draw(st.one_of(st.none(), st.sampled_from(page_sizes(traits))), label="page_size")
    if page is not None:  # unset: the engine's default page for the model (DeepSeek-V4's 256, a DSA model's 64)
        options["page_size"] = page
    if algorithm is not None:
        options.update(
            speculative_algorithm=algorithm,
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            speculative_draft_num_layers=1,
        )
    return Serving(**options)


def budgets(low: int = 1 * GiB, high: int = 160 * GiB) -> st.SearchStrategy[int]:
    """KV budgets between ``low`` and ``high``: whole GiB, shrinking towards small round numbers."""
    return st.integers(max(1, low // GiB), max(1, high // GiB)).map(lambda n: n * GiB)


@st.composite
def mha_models(draw: st.DrawFn, *, architecture: str = "mha", max_layers: int = 96) -> ModelSpec:
    """MHA/GQA model specs of real shapes (heads and dims SGLang serves), for plugins that take specs."""
    num_layers = draw(st.integers(1, max_layers), label="layers")
    kv_heads = draw(st.sampled_from([1, 2, 4, 8, 16, 32]), label="kv_heads")
    head_dim = draw(st.sampled_from([64, 96, 128, 192, 256]), label="head_dim")
    layers = [
        LayerSpec(index=i, kind="attention", num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=head_dim)
        for i in range(num_layers)
    ]
    return ModelSpec(
        name="generated",
        architecture=architecture,
        layers=layers,
        context_len=draw(st.sampled_from([4096, 32768, 131072]), label="context_len"),
        dtype=draw(st.sampled_from(["bfloat16", "float16"]), label="dtype"),
        num_attention_heads=max(16, kv_heads * draw(st.sampled_from([1, 2, 4, 8]), label="group")),
    )


def plugin_presets(plugin: str, registry: Registry) -> dict[str, dict[str, Any]]:
    """The ``config.json`` dictionaries of the presets ``plugin`` ships (``presets`` hook), by preset name."""
    offered = registry.call_named("presets", "Preset")
    return {
        name: json.loads(Path(path).read_text()) for name, (owner, path) in sorted(offered.items()) if owner == plugin
    }


def preset_configs(configs: Mapping[str, Mapping[str, Any]] | Sequence[tuple[str, Mapping[str, Any]]]) -> Any:
    """One of ``configs`` (name → config dict), as ``(name, config)``; shrinks towards the first."""
    items = list(configs.items()) if isinstance(configs, Mapping) else list(configs)
    if not items:
        raise ValueError("preset_configs needs at least one config")
    return st.sampled_from(items)
