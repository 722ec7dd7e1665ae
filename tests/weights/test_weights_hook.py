"""The weights estimate is the ``estimate_weights`` hook: architecture plugins answer, the core dispatches (issue 30).

The core's :func:`kvpools_core.estimate_weights` loads the config and asks the registry; each built-in
architecture plugin claims the ``model_type`` values it lays out (``plugins/<name>/weights.py``) from the parts
library (:mod:`kvpools_core.parts.weights`).  The numbers themselves are pinned by ``test_weights.py`` and
``test_hybrids_and_quantisation.py`` (hand-computed) and were compared before and after the move for every
preset and test config on several GPUs, TP sizes and DP attention (no number changed).
"""

from __future__ import annotations

import ast
import importlib
import json
import types
from pathlib import Path

import pytest

from kvpools_core import ConfigError, Serving, UnsupportedCombinationError, estimate_weights, hookimpl, plan
from kvpools_core.errors import PluginResultError
from kvpools_core.parts.weights import Builder, WeightsConfig, WeightsEstimate, estimate, llama_decoder
from kvpools_core.registry import get_registry
from kvpools_core.testing.registries import isolated_registry

CONFIGS = Path(__file__).parent / "configs"
ROOT = Path(__file__).parents[2]
BUILT_IN = ("mha", "mla", "dsa", "dsv4", "swa", "mamba", "minimax_sparse")

MODELLED_BEFORE = {
    "llama": "mha",
    "mistral": "mha",
    "qwen2": "mha",
    "qwen3": "mha",
    "qwen3_moe": "mha",
    "mimo": "mha",
    "minimax_m2": "mha",
    "gemma2": "swa",
    "gemma3_text": "swa",
    "gemma4_text": "swa",
    "gpt_oss": "swa",
    "mimo_v2_flash": "swa",
    "deepseek_v2": "mla",
    "deepseek_v3": "mla",
    "kimi_k2": "mla",
    "deepseek_v32": "dsa",
    "deepseek_v4": "dsv4",
    "minimax_m3": "minimax_sparse",
    "qwen3_next": "mamba",
    "qwen3_5_text": "mamba",
    "qwen3_5_moe_text": "mamba",
    "nemotron_h": "mamba",
    "jamba": "mamba",
}
"""The 23 model types the core's table (``kvpools_core.pipeline.weights.ARCHITECTURES``, before issue 30) modelled, and
the plugin that claims each now."""

ADDED_BY_ISSUE_34 = {
    "gemma": "mha",
    "granite": "mha",
    "phi3": "mha",
    "phi": "mha",
    "mixtral": "mha",
    "qwen2_moe": "mha",
    "llama4_text": "swa",
}
"""The families the start-up logs showed unestimated (issue 34), claimed by the plugin that parses their KV."""

DP_ATTENTION_BEFORE = {"deepseek_v2", "deepseek_v3", "kimi_k2", "deepseek_v32", "qwen3", "qwen3_moe", "gpt_oss"}
"""The core's former ``DP_ATTENTION_ARCHITECTURES``: the model types checked to shard attention over attention TP."""


def _claims() -> dict[str, list[str]]:
    claims: dict[str, list[str]] = {}
    for plugin in BUILT_IN:
        for model_type in importlib.import_module(f"kvpools_plugins.{plugin}.weights").DECODERS:
            claims.setdefault(model_type, []).append(plugin)
    return claims


def test_every_formerly_modelled_model_type_is_claimed_by_exactly_one_plugin() -> None:
    assert {model_type: owners for model_type, owners in _claims().items()} == {
        model_type: [owner] for model_type, owner in {**MODELLED_BEFORE, **ADDED_BY_ISSUE_34}.items()
    }


def test_dp_attention_is_allowed_exactly_where_it_was() -> None:
    allowed = set()
    for plugin in BUILT_IN:
        module = importlib.import_module(f"kvpools_plugins.{plugin}.weights")
        assert set(module.DP_ATTENTION) <= set(module.DECODERS)
        allowed |= set(module.DP_ATTENTION)
    assert allowed == DP_ATTENTION_BEFORE


@pytest.mark.parametrize(
    ("config", "plugin"),
    [
        ("meta-llama--Meta-Llama-3.1-8B", "mha"),
        ("deepseek-ai--DeepSeek-V3", "mla"),
        ("deepseek-ai--DeepSeek-V3.2", "dsa"),
        ("deepseek-ai--DeepSeek-V4-Flash", "dsv4"),
        ("openai--gpt-oss-20b", "swa"),
        ("Qwen--Qwen3-Next-80B-A3B-Thinking", "mamba"),
        ("MiniMaxAI--MiniMax-M3", "minimax_sparse"),
    ],
)
def test_the_claiming_plugin_answers_and_the_core_returns_its_answer(config: str, plugin: str) -> None:
    registry = get_registry()
    data = json.loads((CONFIGS / f"{config}.json").read_text())
    from kvpools_core.config import ConfigReader

    outer = ConfigReader(data, "config")
    reader = outer.text()
    request = WeightsConfig(
        reader=reader,
        outer=outer,
        source="config",
        model_type=reader.string("model_type", "") or outer.string("model_type", ""),
    )
    answer, by = registry.call("estimate_weights", config=request, serving=Serving(tp_size=8), ep_size=8)
    assert by == (plugin,)
    assert answer == estimate_weights(data, Serving(tp_size=8), ep_size=8)


def test_a_model_type_no_plugin_claims_is_refused_naming_the_field_and_the_plugins_asked() -> None:
    with pytest.raises(ConfigError, match=r"field 'model_type' is 'falcon_h1'.*asked: .*mha.*not guessed") as raised:
        estimate_weights({"model_type": "falcon_h1", "hidden_size": 1024})
    assert all(plugin in str(raised.value) for plugin in BUILT_IN)


def test_the_registry_given_is_the_one_asked() -> None:
    """An explicit registry of only ``mha``: Llama is estimated, DeepSeek-V3 is nobody's (mla is not loaded)."""
    registry = isolated_registry(["mha"])
    llama = json.loads((CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    assert estimate_weights(llama, registry=registry) == estimate_weights(llama)
    deepseek = json.loads((CONFIGS / "deepseek-ai--DeepSeek-V3.json").read_text())
    with pytest.raises(ConfigError, match=r"'deepseek_v3'. No installed architecture plugin .*\(asked: mha\)"):
        estimate_weights(deepseek, registry=registry)


def _tiny(model_type: str = "toy") -> dict[str, object]:
    return {
        "model_type": model_type,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 640,
        "torch_dtype": "bfloat16",
    }


def test_a_third_party_plugin_answers_for_its_model_type_from_the_parts_library() -> None:
    """A toy plugin claims ``toy`` with the Llama-shaped decoder: 2 layers x (4 x 128 x 128 + 3 x 256 x 128 +
    2 x 128) = 328,192, + 640 x 128 embedding + 640 x 128 head + 128 = 492,160 parameters, 2 B each."""
    plugin = types.ModuleType("toy_weights")

    def decoder(builder: Builder) -> list[str]:
        llama_decoder(builder)
        return ["toy note"]

    @hookimpl
    def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
        return estimate(config, serving, decoder, ep_size=ep_size) if config.model_type == "toy" else None

    plugin.estimate_weights = estimate_weights  # type: ignore[attr-defined]
    registry = isolated_registry(["mha"], objects={"toy": plugin})
    layer = 4 * 128 * 128 + 3 * 256 * 128 + 2 * 128
    result = kvpools_estimate(_tiny(), registry)
    assert result.parameters == 2 * layer + 2 * 640 * 128 + 128 == 492_160
    assert result.bytes_per_rank == 2 * 492_160
    assert result.notes == ("toy note",)


def kvpools_estimate(config: dict[str, object], registry: object) -> WeightsEstimate:
    from kvpools_core.pipeline.weights import estimate_weights as core_estimate

    return core_estimate(config, registry=registry)  # type: ignore[arg-type]


def test_an_answer_that_is_not_a_weights_estimate_is_blamed_on_its_plugin() -> None:
    plugin = types.ModuleType("wrong")

    @hookimpl
    def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> object:
        return 12345

    plugin.estimate_weights = estimate_weights  # type: ignore[attr-defined]
    registry = isolated_registry([], objects={"wrong": plugin})
    with pytest.raises(PluginResultError, match=r'"wrong".*estimate_weights.*not a WeightsEstimate'):
        kvpools_estimate(_tiny(), registry)


def test_dp_attention_is_refused_where_the_plugin_does_not_say_its_attention_shards_on_attention_tp() -> None:
    llama = json.loads((CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    with pytest.raises(UnsupportedCombinationError, match=r"enable_dp_attention only for .* model_type 'llama'"):
        estimate_weights(llama, Serving(tp_size=2, dp_size=2, enable_dp_attention=True))


def test_a_gpu_plan_asks_the_registry_it_plans_with() -> None:
    """``plan(..., gpu=, registry=)`` estimates the weights through that registry: without the mha plugin's
    weights nobody claims Llama, and the GPU budget asks for --weights-memory."""
    llama = str(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json")
    full = plan(llama, Serving(), gpu="h100", registry=isolated_registry(["mha", "cuda"]))
    assert full.budget.weights_bytes == estimate_weights(llama).bytes_per_rank
    mha = importlib.import_module("kvpools_plugins.mha")
    hooks = ("parse_model_config", "estimate_cell_size", "validate", "presets")
    without = type("MhaWithoutWeights", (), {name: staticmethod(getattr(mha, name)) for name in hooks})
    registry = isolated_registry(["cuda"], objects={"mha-no-weights": without})
    with pytest.raises(ConfigError, match=r"cannot estimate them .*No installed architecture plugin.*weights-memory"):
        plan(llama, Serving(), gpu="h100", registry=registry)


def test_the_parts_library_has_no_import_cycle_and_never_reaches_back_to_the_core_entry_point() -> None:
    """``weights._model <-> weights._quantisation`` was a cycle (issue 30): quantisation now imports no other
    weights part, tensors imports quantisation, and no part imports ``kvpools_core.pipeline.weights``."""
    folder = ROOT / "kvpools_core" / "parts" / "weights"
    imports: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        imports[path.stem] = names
    assert not {name for name in imports["quantisation"] if name.startswith("kvpools_core.parts.weights")}
    assert "kvpools_core.parts.weights.quantisation" in imports["tensors"]
    assert not any("kvpools_core.pipeline.weights" in names for names in imports.values())
