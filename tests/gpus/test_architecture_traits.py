"""SGLang's per-class GPU memory defaults come from the architecture plugins (``architecture_traits``, issue 30).

``kvpools_core.pipeline.gpus`` kept SGLang's list of MLA-backend classes and of classes whose breakable prefill graph is
off; the plugins that parse those models now name them, and the core names no class.  The lists below are
SGLang 0.5.23's, as the core held them before (``srt/configs/model_config.py`` lines 1366-1397 and the
``elif`` branches after them; ``cuda_graph_hook.py`` lines 170-240): the plugins' union must be exactly them.
"""

from __future__ import annotations

import types

import pytest

from kvpools_core import Serving, hookimpl
from kvpools_core.errors import PluginResultError
from kvpools_core.models import load_model
from kvpools_core.pipeline.gpus import (
    MAMBAISH_STATE,
    MLA_BACKEND,
    NO_BREAKABLE_PREFILL_GRAPH,
    NO_POST_CAPTURE_KV_SIZING,
    architecture_traits,
    model_traits,
    sglang_memory_defaults,
)
from kvpools_core.registry import get_registry
from kvpools_core.testing.registries import isolated_registry

SGLANG_MLA_BACKEND = {
    "DeepseekV2ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "Glm4MoeLiteForCausalLM",
    "Glm4MoeLiteForCausalLMNextN",
    "GlmMoeDsaForCausalLM",
    "GlmMoeDsaForCausalLMNextN",
    "Glm5NextForConditionalGeneration",
    "Glm5NextForConditionalGenerationNextN",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
    "DotsVLMForCausalLM",
    "Dots3NoteForCausalLM",
    "Dots3NoteForCausalLMNextN",
    "MistralLarge3ForCausalLM",
    "MistralLarge3ForCausalLMEagle",
    "KimiK25ForConditionalGeneration",
    "Eagle3DeepseekV2ForCausalLM",
    "GigaChat35ForCausalLM",
    "GigaChat35ForCausalLMNextN",
    "MiniCPM3ForCausalLM",
    "KimiVLForConditionalGeneration",
    "KimiLinearForCausalLM",
    "KimiK3LinearForCausalLM",
    "KimiK3ForConditionalGeneration",
}
SGLANG_NO_PREFILL_GRAPH = {"DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark"}


def test_the_plugins_name_exactly_sglangs_classes() -> None:
    traits = architecture_traits()
    assert {arch for arch, names in traits.items() if MLA_BACKEND in names} == SGLANG_MLA_BACKEND
    assert {arch for arch, names in traits.items() if NO_BREAKABLE_PREFILL_GRAPH in names} == SGLANG_NO_PREFILL_GRAPH


@pytest.mark.parametrize(
    ("preset", "traits"),
    [
        ("deepseek-v3", {MLA_BACKEND}),
        ("deepseek-v3.2", {MLA_BACKEND}),
        ("kimi-linear-48b-a3b-instruct-nvfp4", {MLA_BACKEND, MAMBAISH_STATE}),
        ("qwen3-next-80b-a3b-thinking", {MAMBAISH_STATE}),
        ("minimax-m3", {NO_POST_CAPTURE_KV_SIZING}),
        ("deepseek-v4-flash", {NO_BREAKABLE_PREFILL_GRAPH}),
        ("llama-3.1-8b", set()),
    ],
)
def test_a_models_traits_are_its_classes(preset: str, traits: set[str]) -> None:
    model = load_model(preset, get_registry())[0]
    assert model_traits(model) == traits


def test_the_mla_backend_reserves_its_prefill_graph() -> None:
    """DeepSeek-V3 on 81559 MiB (h100), chunk 8192, TP 1: 512 + 1.5 x 8192 + 128 + 2 x 256 + 1536 (the MLA
    backend's prefill graph) = 14976 MiB reserved, fraction round((81559 - 14976) / 81559, 3) = 0.816."""
    model = load_model("deepseek-v3", get_registry())[0]
    defaults = sglang_memory_defaults(81559, model, Serving(chunked_prefill_size=8192))
    assert "prefill graph, MLA backend: 1536 MiB" in defaults.terms
    assert defaults.reserved_mb == 512 + 1.5 * 8192 + 128 + 2 * 256 + 1536 == 14976
    assert defaults.mem_fraction_static == round((81559 - 14976) / 81559, 3) == 0.816


def test_without_the_plugin_that_names_it_a_class_has_no_trait() -> None:
    """The traits are the registry's: a registry without mla and dsa gives DeepSeek-V3's class none."""
    model = load_model("deepseek-v3", get_registry())[0]
    assert model_traits(model, isolated_registry(["mha"])) == frozenset()
    assert model_traits(model, isolated_registry(["mla"])) == {MLA_BACKEND}


def test_an_unknown_trait_is_blamed_on_its_plugin() -> None:
    plugin = types.ModuleType("typo")

    @hookimpl
    def architecture_traits() -> dict[str, list[str]]:
        return {"MyForCausalLM": ["mla_bakend"]}

    plugin.architecture_traits = architecture_traits  # type: ignore[attr-defined]
    from kvpools_core.pipeline.gpus import architecture_traits as collect

    with pytest.raises(PluginResultError, match=r"typo.*'MyForCausalLM' the unknown trait\(s\) 'mla_bakend'"):
        collect(isolated_registry([], objects={"typo": plugin}))


def test_a_third_party_class_gets_the_mla_reserve_from_its_plugin() -> None:
    plugin = types.ModuleType("mine")

    @hookimpl
    def architecture_traits() -> dict[str, list[str]]:
        return {"LlamaForCausalLM": [MLA_BACKEND]}

    plugin.architecture_traits = architecture_traits  # type: ignore[attr-defined]
    registry = isolated_registry(["mha", "cuda"], objects={"mine": plugin})
    model = load_model("llama-3.1-8b", get_registry())[0]
    defaults = sglang_memory_defaults(81559, model, Serving(chunked_prefill_size=8192), registry=registry)
    assert "prefill graph, MLA backend: 1536 MiB" in defaults.terms


def test_the_old_lists_are_deprecated_but_answer() -> None:
    import kvpools_core.pipeline.gpus as gpus

    with pytest.warns(DeprecationWarning, match="MLA_ARCHITECTURES is deprecated"):
        assert gpus.MLA_ARCHITECTURES == SGLANG_MLA_BACKEND
    with pytest.warns(DeprecationWarning, match="PREFILL_GRAPH_INCOMPATIBLE is deprecated"):
        assert gpus.PREFILL_GRAPH_INCOMPATIBLE == SGLANG_NO_PREFILL_GRAPH
