"""Plugin discovery, load controls, provenance, blame and conflicts.

Fake distributions are written as ``*.dist-info`` folders on ``sys.path`` so
the registry finds them through the real entry-point machinery, as it finds an
installed vendor plugin.
"""

from __future__ import annotations

import io
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import importlib_metadata
import pytest

import kvpools_core
from kvpools_core import (
    ConfigError,
    LayerSpec,
    ModelSpec,
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
from kvpools_core.models import registry_presets
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
    assert set(example.hooks) == {"parse_model_config", "estimate_cell_size", "plugin_options"}
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


def test_example_distribution_declares_its_plugin_option(registry: Registry, tmp_path: Path) -> None:
    """The out-of-tree plugin's own knob reaches it; a misspelt key is refused, naming the declared ones."""
    config = tmp_path / "config.json"
    config.write_text(
        '{"model_type": "toy-latent", "num_hidden_layers": 4, "latent_dim": 64, "max_position_embeddings": 4096}'
    )
    doubled = plan(str(config), Serving(plugin_options={"toy.latent_bytes": "2"}), memory="1MiB", registry=registry)
    assert doubled.cell.bytes_per_token == 2 * 4 * 64
    with pytest.raises(ConfigError, match=r"'toy\.latent_byte'.*toy\.latent_bytes \(example\)"):
        plan(str(config), Serving(plugin_options={"toy.latent_byte": "2"}), memory="1MiB", registry=registry)
    with pytest.raises(ConfigError, match=r"plugin_options toy\.latent_bytes=zero: must be a positive integer"):
        plan(str(config), Serving(plugin_options={"toy.latent_bytes": "zero"}), memory="1MiB", registry=registry)


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
    core = re.escape(kvpools_core.__version__)
    with pytest.raises(PluginConflictError, match=rf'"rival" \(kvpools-rival 1\.2\.3\) and "mha" \(kvpools {core}\)'):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry)


def test_blocking_resolves_a_conflict(make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch) -> None:
    make_dist("rival", TOY_CLAIM)
    monkeypatch.setenv("KVPOOLS_DISABLED_PLUGINS", "rival")
    registry = Registry()
    assert registry.plugin("rival").status == "blocked"
    assert plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry).provenance["parse_model_config"] == (
        "mha",
    )


MHA_FORK = """
    from kvpools_core import hookimpl

    @hookimpl
    def presets():
        return {"fork-only": "/nowhere/config.json"}
"""


def test_two_distributions_declaring_one_name_say_how_to_resolve_it(make_dist: MakeDist) -> None:
    make_dist("mha", MHA_FORK, dist="kvpools-mha-fork", version="2.0", module="fake_mha_fork")
    with pytest.raises(PluginConflictError, match='2 distributions declare the kvpools plugin "mha"') as info:
        Registry()
    text = str(info.value)
    assert f"kvpools {kvpools_core.__version__} (kvpools_plugins.mha)" in text
    assert "kvpools-mha-fork 2.0 (fake_mha_fork)" in text
    assert "Uninstall all but one, or disable the others by distribution: KVPOOLS_DISABLED_PLUGINS=" in text
    assert 'a plain mha disables every "mha"' in text


def test_disabling_a_conflicting_name_resolves_the_conflict(
    make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dist("mha", MHA_FORK, dist="kvpools-mha-fork", version="2.0", module="fake_mha_fork")
    monkeypatch.setenv("KVPOOLS_DISABLED_PLUGINS", "mha")
    both = Registry()
    assert sorted((i.distribution, i.status) for i in both.plugins() if i.name == "mha") == [
        ("kvpools", "blocked"),
        ("kvpools-mha-fork", "blocked"),
    ]

    monkeypatch.setenv("KVPOOLS_DISABLED_PLUGINS", "kvpools_mha_fork:mha")  # distribution names compare normalised
    builtin = Registry()
    assert (builtin.plugin("mha").distribution, builtin.plugin("mha").status) == ("kvpools", "loaded")
    assert builtin.plugin("kvpools-mha-fork:mha").status == "blocked"
    assert plan("llama-3.1-8b", Serving(), memory="1GiB", registry=builtin).provenance["parse_model_config"] == ("mha",)

    monkeypatch.setenv("KVPOOLS_DISABLED_PLUGINS", "kvpools:mha")
    fork = Registry()
    assert (fork.plugin("mha").distribution, fork.plugin("mha").status) == ("kvpools-mha-fork", "loaded")
    assert fork.plugin("kvpools:mha").status == "blocked"
    assert "fork-only" in registry_presets(fork) and "llama-3.1-8b" not in registry_presets(fork)


def test_a_conflict_between_plugins_that_do_not_load_is_no_error(
    make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dist("mha", MHA_FORK, dist="kvpools-mha-fork", version="2.0", module="fake_mha_fork")
    monkeypatch.setenv("KVPOOLS_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = Registry()
    assert (registry.plugin("mha").distribution, registry.plugin("mha").status) == ("kvpools", "loaded")
    assert registry.plugin("kvpools-mha-fork:mha").status == "not-loaded"


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
    with pytest.raises(PluginConflictError, match=r"Preset 'llama-3\.1-8b' comes from two plugins"):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=Registry())


TOY_LATENT = ModelSpec(
    name="toy",
    architecture="toy",
    layers=[LayerSpec(index=i, kind="toy-latent", params={"latent_dim": 8}) for i in range(2)],
    context_len=64,
    dtype="bfloat16",
)


def test_autoload_off_still_loads_the_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOLS_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = Registry()
    loaded = {i.name for i in registry.plugins() if i.status == "loaded"}
    assert {"core", "mha", "mla", "speculative", "cpu", "cuda"} <= loaded
    assert all(i.distribution == "kvpools" for i in registry.plugins() if i.status == "loaded")
    assert registry.plugin("example").status == "not-loaded"
    result = plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry)
    assert result.provenance["parse_model_config"] == ("mha",)


def test_nothing_answered_under_autoload_off_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOLS_DISABLE_PLUGIN_AUTOLOAD", "1")
    ascend, rocm = (re.escape(importlib_metadata.version(dist)) for dist in ("kvpools-ascend", "kvpools-rocm"))
    with pytest.raises(
        NoProviderError,
        match=r"No plugin answered estimate_cell_size: .*Plugins asked: .*\. Plugin autoload is off "
        r"\(KVPOOLS_DISABLE_PLUGIN_AUTOLOAD=1\), so only the built-in plugins load; installed but not loaded: "
        rf'"ascend" \(kvpools-ascend {ascend}\), "example" \(kvpools-example 0\.3\.0\), '
        rf'"example_parts" \(kvpools-example 0\.3\.0\), "rocm" \(kvpools-rocm {rocm}\), '
        r'"toy_engine" \(kvpools-toy-engine 0\.1\.0\)\. '
        r"Unset it, or name every plugin to load in KVPOOLS_PLUGINS",
    ):
        plan(TOY_LATENT, Serving(), memory="1MiB", registry=Registry())
    monkeypatch.setenv("KVPOOLS_PLUGINS", "example,mha,cpu,cuda")
    assert plan(TOY_LATENT, Serving(), memory="1MiB", registry=Registry()).provenance["estimate_cell_size"] == (
        "example",
    )


def test_the_allow_list_is_exact_builtins_included(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOLS_PLUGINS", "mha,cpu,cuda")
    registry = Registry()
    assert sorted(i.name for i in registry.plugins() if i.status == "loaded") == ["core", "cpu", "cuda", "mha"]
    assert registry.plugin("speculative").status == "not-loaded"
    assert registry.plugin("example").status == "not-loaded"
    with pytest.raises(NoProviderError, match=r"KVPOOLS_PLUGINS loads only mha, cpu, cuda \(and core\); .*example"):
        plan(TOY_LATENT, Serving(), memory="1MiB", registry=registry)


def test_the_same_controls_as_arguments() -> None:
    registry = Registry(autoload=False, plugins=["mha", "cpu"], disabled=["cpu"])
    loaded = sorted(i.name for i in registry.plugins() if i.status == "loaded")
    assert loaded == ["core", "mha"]
    assert registry.plugin("cpu").status == "blocked"


def test_allow_list_naming_a_missing_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnknownPluginError, match="not installed: nosuch"):
        Registry(plugins=["nosuch"])
    monkeypatch.setenv("KVPOOLS_PLUGINS", "mhaa")
    with pytest.raises(
        UnknownPluginError, match=r"KVPOOLS_PLUGINS names .* not installed: mhaa \(did you mean mha or mamba\?\)"
    ):
        Registry()


def test_disabling_an_unknown_plugin_names_the_installed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOLS_DISABLED_PLUGINS", "mah")
    with pytest.raises(
        UnknownPluginError,
        match=r"KVPOOLS_DISABLED_PLUGINS names plugin\(s\) that are not installed: mah \(did you mean mla or mha\?\)\. "
        r"Installed: ascend, cpu, cuda, .*example, .*mha, .*speculative",
    ):
        Registry()
    with pytest.raises(UnknownPluginError, match=r"Registry\(disabled=...\) names .*: nosuch\. Installed: "):
        Registry(disabled=["nosuch"])
    with pytest.raises(
        UnknownPluginError,
        match=r"kvpools:mah \(did you mean [^)]*kvpools:mha[^)]*\?\).*by distribution: .*kvpools-example:example",
    ):
        Registry(disabled=["kvpools:mah"])


def test_an_in_process_plugin_can_be_disabled_by_name() -> None:
    registry = Registry(disabled=["extra"], extra_plugins={"extra": object()})
    assert registry.plugin("extra").status == "blocked"


def test_core_cannot_be_disabled() -> None:
    with pytest.raises(Exception, match="cannot be disabled"):
        Registry(disabled=["core"])


def test_no_answer_lists_the_plugins_asked() -> None:
    registry = Registry(autoload=False)
    with pytest.raises(NoProviderError, match=r"No plugin answered available_memory.*Plugins asked: cuda, cpu\."):
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
    with pytest.raises(Exception, match=r"speculative_algorithm EAGLE charges the draft model's KV cache.*\[core\]"):
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
