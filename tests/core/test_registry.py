"""Plugin discovery, load controls, provenance, blame and conflicts.

Fake distributions are written as ``*.dist-info`` folders on ``sys.path`` so
the registry finds them through the real entry-point machinery, as it finds an
installed vendor plugin.
"""

from __future__ import annotations

import io
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from kvpools_core import (
    ConfigError,
    NoProviderError,
    PluginConflictError,
    PluginHookError,
    PluginLoadError,
    PluginValidationError,
    Registry,
    Serving,
    UnknownPluginError,
    plan,
)
from kvpools_core.registry import KvpoolsPluginWarning, get_registry

MakeDist = Callable[..., None]


@pytest.fixture
def make_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MakeDist:
    """Write a fake installed distribution exposing ``module`` under entry point ``name``."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(
        name: str, source: str, *, dist: str | None = None, version: str = "1.2.3", module: str | None = None
    ) -> None:
        module = module or f"fake_{name}"
        dist = dist or f"kvpools-{name}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[kvpools]\n{name} = {module}\n")
        sys.modules.pop(module, None)

    return make


TOY_CLAIM = """
    from kvpools_core import hookimpl, ModelSpec, LayerSpec

    @hookimpl
    def parse_model_config(config, source):
        if config.get("model_type") != "llama":
            return None
        layers = [LayerSpec(index=i, kind="attention", num_kv_heads=1, head_dim=8, v_head_dim=8) for i in range(2)]
        return ModelSpec(name=source, architecture="other", layers=layers, context_len=128, dtype="bfloat16")
"""


def test_no_plugin_manager_at_import() -> None:
    import kvpools_core.registry as registry_module

    assert registry_module._DEFAULT is None
    first = get_registry()
    assert get_registry() is first


def test_builtins_and_example_distribution_are_discovered(registry: Registry) -> None:
    infos = {info.name: info for info in registry.plugins()}
    assert {"core", "mha", "speculative", "cpu", "cuda", "example"} <= set(infos)
    example = infos["example"]
    assert (example.distribution, example.version, example.status) == ("kvpools-example", "0.3.0", "loaded")
    assert set(example.hooks) == {"parse_model_config", "estimate_cell_size"}
    assert infos["mha"].distribution == "kvpools"


def test_example_distribution_answers_estimate_cell_size(registry: Registry, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        '{"model_type": "toy-latent", "num_hidden_layers": 4, "latent_dim": 64, "max_position_embeddings": 4096}'
    )
    result = plan(str(config), Serving(), memory="1MiB", registry=registry)
    assert result.cell.bytes_per_token == 4 * 64
    assert result.provenance["parse_model_config"] == ("example",)
    assert result.provenance["estimate_cell_size"] == ("example",)
    assert result.provenance["size_pools"] == ("core",)


def test_a_plugin_that_fails_to_import_is_named(make_dist: MakeDist) -> None:
    make_dist("boom", "raise ImportError('libfoo.so not found')\n", version="0.9")
    with pytest.raises(
        PluginLoadError, match=r'Error loading plugin "boom" \(kvpools-boom 0\.9\): ImportError: libfoo\.so not found'
    ):
        Registry()


def test_plugin_errors_warn_mode_skips_the_broken_plugin(make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch) -> None:
    make_dist("boom", "raise RuntimeError('nope')\n")
    monkeypatch.setenv("KVPOOLS_PLUGIN_ERRORS", "warn")
    with pytest.warns(KvpoolsPluginWarning, match='"boom"'):
        registry = Registry()
    assert registry.plugin("boom").status == "failed"
    assert registry.plugin("mha").status == "loaded"


def test_a_misspelt_hook_fails_loudly(make_dist: MakeDist) -> None:
    make_dist(
        "typo",
        """
        from kvpools_core import hookimpl

        @hookimpl
        def estimate_cel_size(model, serving):
            return None
    """,
    )
    with pytest.raises(
        PluginValidationError, match=r'"typo" \(kvpools-typo 1\.2\.3\) implements unknown hook\(s\) estimate_cel_size'
    ):
        Registry()


def test_a_wrong_signature_is_rejected_with_the_plugin_named(make_dist: MakeDist) -> None:
    make_dist(
        "sig",
        """
        from kvpools_core import hookimpl

        @hookimpl
        def estimate_cell_size(model, serving, bogus):
            return None
    """,
    )
    with pytest.raises(PluginValidationError, match='"sig"'):
        Registry()


def test_a_raising_hook_is_blamed_on_its_plugin(make_dist: MakeDist) -> None:
    make_dist(
        "raiser",
        """
        from kvpools_core import hookimpl

        @hookimpl(tryfirst=True)
        def estimate_cell_size(model, serving):
            raise ZeroDivisionError("bad arithmetic")
    """,
        version="2.0",
    )
    registry = Registry()
    with pytest.raises(
        PluginHookError, match=r'"raiser" \(kvpools-raiser 2\.0\) failed in hook estimate_cell_size: ZeroDivisionError'
    ):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry)


def test_a_raising_wrapper_is_blamed_on_its_plugin(make_dist: MakeDist) -> None:
    make_dist(
        "wrapboom",
        """
        from kvpools_core import hookimpl

        @hookimpl(wrapper=True)
        def estimate_cell_size(model, serving):
            cell = yield
            raise KeyError("after the inner call")
    """,
    )
    with pytest.raises(PluginHookError, match=r'"wrapboom".*KeyError'):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=Registry())


def test_two_plugins_claiming_one_model_are_both_named(make_dist: MakeDist) -> None:
    make_dist("rival", TOY_CLAIM)
    registry = Registry()
    with pytest.raises(PluginConflictError, match=r'"rival" \(kvpools-rival 1\.2\.3\) and "mha" \(kvpools 0\.1\.0\)'):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry)


def test_blocking_resolves_a_conflict(make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch) -> None:
    make_dist("rival", TOY_CLAIM)
    monkeypatch.setenv("KVPOOLS_DISABLED_PLUGINS", "rival")
    registry = Registry()
    assert registry.plugin("rival").status == "blocked"
    assert plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry).provenance["parse_model_config"] == (
        "mha",
    )


def test_preset_name_conflict(make_dist: MakeDist) -> None:
    make_dist(
        "shadow",
        """
        from kvpools_core import hookimpl

        @hookimpl
        def presets():
            return {"llama-3.1-8b": "/nowhere/config.json"}
    """,
    )
    with pytest.raises(PluginConflictError, match=r"Preset 'llama-3\.1-8b' is offered by two plugins"):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=Registry())


def test_autoload_off_loads_only_the_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOLS_DISABLE_PLUGIN_AUTOLOAD", "1")
    bare = Registry()
    assert [i.name for i in bare.plugins() if i.status == "loaded"] == ["core"]
    preset = Path(__file__).parents[2] / "plugins" / "mha" / "presets" / "llama-3.1-8b.json"
    with pytest.raises(
        NoProviderError, match=r"No plugin answered parse_model_config: no architecture plugin recognises"
    ):
        plan(str(preset), Serving(), memory="1GiB", registry=bare)
    monkeypatch.setenv("KVPOOLS_PLUGINS", "mha")
    allowed = Registry()
    assert sorted(i.name for i in allowed.plugins() if i.status == "loaded") == ["core", "mha"]
    assert allowed.plugin("speculative").status == "not-loaded"


def test_the_same_controls_as_arguments() -> None:
    registry = Registry(autoload=False, plugins=["mha", "cpu"], disabled=["cpu"])
    loaded = sorted(i.name for i in registry.plugins() if i.status == "loaded")
    assert loaded == ["core", "mha"]
    assert registry.plugin("cpu").status == "blocked"


def test_allow_list_naming_a_missing_plugin() -> None:
    with pytest.raises(UnknownPluginError, match="not installed: nosuch"):
        Registry(plugins=["nosuch"])


def test_core_cannot_be_disabled() -> None:
    with pytest.raises(Exception, match="cannot be disabled"):
        Registry(disabled=["core"])


def test_no_answer_lists_the_plugins_asked() -> None:
    registry = Registry(autoload=False, plugins=["mha"])
    with pytest.raises(NoProviderError, match=r"No plugin answered available_memory.*Plugins asked: none"):
        plan("llama-3.1-8b", Serving(), device="tpu:0", registry=registry)


def test_tracing_records_the_answering_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    registry = Registry(trace=True, trace_stream=stream)
    plan(
        "llama-3.1-8b",
        Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=1),
        memory="8GiB",
        registry=registry,
    )
    text = stream.getvalue()
    assert "estimate_cell_size(model=ModelSpec(llama-3.1-8b), serving=Serving) asked [" in text
    assert "answered by mha; wrapped by speculative" in text
    assert "size_pools(" in text and "answered by core" in text


def test_provenance_names_wrappers_only_when_they_change_the_result(registry: Registry) -> None:
    plain = plan("llama-3.1-8b", Serving(), memory="8GiB", registry=registry)
    assert plain.provenance["estimate_cell_size"] == ("mha",)
    eagle = plan(
        "llama-3.1-8b",
        Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=2),
        memory="8GiB",
        registry=registry,
    )
    assert eagle.provenance["estimate_cell_size"] == ("mha", "speculative")


def test_dispatch_order_platform_first_core_last(make_dist: MakeDist) -> None:
    make_dist(
        "vendor",
        """
        from kvpools_core import hookimpl

        @hookimpl(tryfirst=True)
        def available_memory(device, serving):
            return {"free_bytes": 1 << 34, "total_bytes": 1 << 35} if device == "cpu" else None

        @hookimpl
        def size_pools(model, serving, cell, budget):
            return None
    """,
    )
    registry = Registry()
    order = registry.implementers("available_memory")
    assert order.index("vendor") < order.index("cuda") and order.index("vendor") < order.index("cpu")
    assert registry.implementers("size_pools")[-1] == "core"
    result = plan("qwen3-8b", Serving(), device="cpu", registry=registry)
    assert result.provenance["available_memory"] == ("vendor",)
    assert result.budget.free_bytes == 1 << 34
    assert result.provenance["size_pools"] == ("core",)


def test_unsupported_combinations_are_collected_before_sizing(registry: Registry) -> None:
    with pytest.raises(Exception, match=r"--speculative-algorithm EAGLE charges the draft model's KV cache.*\[core\]"):
        plan("llama-3.1-8b", Serving(speculative_algorithm="EAGLE"), memory="8GiB", registry=registry)
    with pytest.raises(Exception, match=r"not supported on the CPU platform.*\[cpu\]"):
        plan("llama-3.1-8b", Serving(kv_cache_dtype="fp4_e2m1", platform="cpu"), memory="8GiB", registry=registry)


def test_bad_plugin_error_mode() -> None:
    with pytest.raises(Exception, match="KVPOOLS_PLUGIN_ERRORS must be"):
        Registry(on_plugin_error="ignore")


def test_config_error_is_not_wrapped_as_a_hook_error(registry: Registry, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "num_hidden_layers": 0, "num_attention_heads": 8, "hidden_size": 64}')
    with pytest.raises(ConfigError, match=r"field 'num_hidden_layers' must be an integer >= 1, got 0"):
        plan(str(config), Serving(), memory="1GiB", registry=registry)
