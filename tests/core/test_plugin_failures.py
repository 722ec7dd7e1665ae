"""Hostile and broken plugins (issue 29): each failure is a kvpools error naming the plugin, never a silent exit.

Fake distributions are ``*.dist-info`` folders on ``sys.path``, found through
the real entry-point machinery, as ``tests/core/test_registry.py`` does.
"""

from __future__ import annotations

import copy
import json
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from kvpools_core import (
    ConfigError,
    PluginHookError,
    PluginLoadError,
    Registry,
    Serving,
    build,
    plan,
)
from kvpools_core.models import parse_config
from kvpools_core.options import env_flag
from kvpools_core.readonly import ReadOnlyDict, ReadOnlyList, readonly_config
from kvpools_core.registry import KvpoolsPluginWarning

MakeDist = Callable[..., None]


@pytest.fixture
def make_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MakeDist:
    """Write a fake installed distribution whose entry point ``name`` is ``module`` (or ``module:attr``)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(name: str, source: str, *, version: str = "1.2.3", attr: str | None = None) -> None:
        module = f"fake_{name}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"kvpools_{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kvpools-{name}\nVersion: {version}\n")
        target = f"{module}:{attr}" if attr else module
        (info / "entry_points.txt").write_text(f"[kvpools]\n{name} = {target}\n")
        sys.modules.pop(module, None)

    return make


# -- defect 2: a BaseException that is not KeyboardInterrupt is a plugin failure -----------------


def test_system_exit_at_import_is_a_load_error_naming_the_plugin(make_dist: MakeDist) -> None:
    """Defect 2: ``SystemExit(0)`` at import used to end the process with status 0 and no word."""
    make_dist("quitter", "raise SystemExit(0)\n", version="0.4")
    with pytest.raises(
        PluginLoadError, match=r'Error loading plugin "quitter" \(kvpools-quitter 0\.4\): SystemExit: 0 .*must not exit'
    ):
        Registry()


def test_system_exit_at_import_is_skipped_under_warn(make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 2: ``KVPOOLS_PLUGIN_ERRORS=warn`` skips it like any other broken plugin, and the rest load."""
    make_dist("quitter", "import sys\nsys.exit(3)\n")
    monkeypatch.setenv("KVPOOLS_PLUGIN_ERRORS", "warn")
    with pytest.warns(KvpoolsPluginWarning, match=r'"quitter".*SystemExit: 3'):
        registry = Registry()
    assert registry.plugin("quitter").status == "failed"
    assert plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry).cell.bytes_per_token > 0


def test_system_exit_in_a_hook_is_a_hook_error_naming_the_plugin(make_dist: MakeDist) -> None:
    """Defect 2: ``SystemExit(0)`` raised in a hook is blamed on its plugin, not passed through as an exit."""
    make_dist(
        "exiter",
        """
        from kvpools_core import hookimpl

        @hookimpl(tryfirst=True)
        def estimate_cell_size(model, serving):
            raise SystemExit(0)
        """,
        version="2.1",
    )
    with pytest.raises(
        PluginHookError, match=r'"exiter" \(kvpools-exiter 2\.1\) failed in hook estimate_cell_size: SystemExit: 0'
    ):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=Registry())


def test_keyboard_interrupt_in_a_hook_propagates(make_dist: MakeDist) -> None:
    """Defect 2/4: Ctrl-C in a slow hook is the user's: it reaches the caller as KeyboardInterrupt, unwrapped."""
    make_dist(
        "slow",
        """
        from kvpools_core import hookimpl

        @hookimpl(tryfirst=True)
        def estimate_cell_size(model, serving):
            raise KeyboardInterrupt
        """,
    )
    with pytest.raises(KeyboardInterrupt):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=Registry())


def test_keyboard_interrupt_at_import_propagates(make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 2/4: not even ``KVPOOLS_PLUGIN_ERRORS=warn`` turns Ctrl-C during a plugin's import into a skip."""
    make_dist("slowimport", "raise KeyboardInterrupt\n")
    monkeypatch.setenv("KVPOOLS_PLUGIN_ERRORS", "warn")
    with pytest.raises(KeyboardInterrupt):
        Registry()


# -- defect 3: an entry point naming an object with no hooks -----------------------------------


@pytest.mark.parametrize(
    ("attr", "named"),
    [("helper", "the function fake_nohooks.helper,"), ("ANSWER", "42 (an int),")],
)
def test_an_entry_point_naming_a_non_plugin_is_refused(make_dist: MakeDist, attr: str, named: str) -> None:
    """Defect 3: ``name = module:function`` (or an int) used to load silently and never answer."""
    make_dist(
        "nohooks",
        """
        from kvpools_core import hookimpl

        ANSWER = 42

        def helper():
            return None

        @hookimpl
        def presets():
            return {}
        """,
        attr=attr,
    )
    with pytest.raises(PluginLoadError) as caught:
        Registry()
    message = str(caught.value)
    assert 'Plugin "nohooks" (kvpools-nohooks 1.2.3) registers no kvpools hooks' in message
    assert f"Its entry point nohooks = fake_nohooks:{attr} names {named}" in message
    assert "@kvpools_core.hookimpl" in message


def test_a_module_without_hookimpls_is_refused_and_skipped_under_warn(
    make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 3: a module that forgot ``@hookimpl`` registers no hooks: a load error, honouring warn."""
    make_dist("forgot", "def estimate_cell_size(model, serving):\n    return None\n")
    with pytest.raises(PluginLoadError, match=r'"forgot".*registers no kvpools hooks.*the module fake_forgot'):
        Registry()
    monkeypatch.setenv("KVPOOLS_PLUGIN_ERRORS", "warn")
    with pytest.warns(KvpoolsPluginWarning, match="registers no kvpools hooks"):
        registry = Registry()
    assert registry.plugin("forgot").status == "failed"


def test_an_object_with_hookimpl_attributes_is_a_plugin() -> None:
    """Defect 3 (the rule's other half): an object, not only a module, may carry the hooks, as pluggy allows."""
    from kvpools_core import hookimpl

    class Offers:
        @hookimpl
        def presets(self) -> dict[str, str]:
            return {}

    registry = Registry(extra_plugins={"offers": Offers()})
    assert registry.plugin("offers").hooks == ("presets",)
    with pytest.raises(PluginLoadError, match=r'"offers".*registers no kvpools hooks.*\(an object\)'):
        Registry(extra_plugins={"offers": object()})


# -- defect 5: plugins read the config, never write it ------------------------------------------

NESTED_LLAMA = {
    "model_type": "llava",
    "architectures": ["LlavaForConditionalGeneration"],
    "text_config": {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "hidden_size": 512,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    },
}


def test_a_declining_plugin_cannot_change_the_config_others_read(make_dist: MakeDist) -> None:
    """Defect 5: a plugin that writes into a nested dict is refused, naming it; the caller's dict is unchanged."""
    make_dist(
        "scribbler",
        """
        from kvpools_core import hookimpl

        @hookimpl(tryfirst=True)
        def parse_model_config(config, source):
            config["text_config"]["num_hidden_layers"] = 1
            return None
        """,
    )
    config = copy.deepcopy(NESTED_LLAMA)
    with pytest.raises(PluginHookError) as caught:
        parse_config(config, "toy.json", Registry())
    message = str(caught.value)
    assert '"scribbler"' in message and "parse_model_config" in message
    assert "TypeError" in message and "read-only" in message
    assert "config['text_config']['num_hidden_layers']" in message
    assert config == NESTED_LLAMA


def test_a_plugin_may_copy_and_serialise_the_config(make_dist: MakeDist) -> None:
    """Defect 5: what plugins do with a config they only read still works on the read-only view."""
    make_dist(
        "reader",
        """
        import copy, json
        from kvpools_core import hookimpl

        SEEN = {}

        @hookimpl(tryfirst=True)
        def parse_model_config(config, source):
            SEEN["json"] = json.loads(json.dumps(config))
            mine = copy.deepcopy(config)
            mine["text_config"]["num_hidden_layers"] = 1
            mine["architectures"].append("Mine")
            shallow = dict(config)
            shallow["extra"] = True
            SEEN["copies"] = (mine, shallow, isinstance(config["architectures"], list))
            return None
        """,
    )
    config = copy.deepcopy(NESTED_LLAMA)
    spec, plugin = parse_config(config, "toy.json", Registry())
    assert plugin == "mha" and len(spec.layers) == 4
    seen = sys.modules["fake_reader"].SEEN
    assert seen["json"] == NESTED_LLAMA
    mine, shallow, is_list = seen["copies"]
    assert mine["text_config"]["num_hidden_layers"] == 1 and mine["architectures"][-1] == "Mine"
    assert shallow["extra"] is True and is_list
    assert config == NESTED_LLAMA


def test_readonly_config_refuses_every_change() -> None:
    """Defect 5: each in-place change of a dict or list raises a TypeError naming where."""
    view = readonly_config({"a": {"b": [1, 2]}, "c": (3,)})
    inner, items = view["a"], view["a"]["b"]
    assert isinstance(inner, ReadOnlyDict) and isinstance(items, ReadOnlyList) and isinstance(view["c"], ReadOnlyList)
    changes: list[Callable[[], object]] = [
        lambda: view.__setitem__("x", 1),
        lambda: view.__delitem__("a"),
        lambda: view.update(x=1),
        lambda: view.setdefault("x", 1),
        lambda: view.pop("a"),
        lambda: view.popitem(),
        lambda: view.clear(),
        lambda: view.__ior__({"x": 1}),
        lambda: items.append(3),
        lambda: items.extend([3]),
        lambda: items.insert(0, 3),
        lambda: items.__setitem__(0, 3),
        lambda: items.__delitem__(0),
        lambda: items.pop(),
        lambda: items.remove(1),
        lambda: items.sort(),
        lambda: items.reverse(),
        lambda: items.clear(),
        lambda: items.__iadd__([3]),
        lambda: items.__imul__(2),
    ]
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change()
    with pytest.raises(TypeError, match=r"config\['a'\]\['b'\]\[0\]"):
        items[0] = 5
    assert view == {"a": {"b": [1, 2]}, "c": [3]}
    assert json.loads(json.dumps(view)) == {"a": {"b": [1, 2]}, "c": [3]}
    assert ReadOnlyList([1, 2]) == [1, 2] and ReadOnlyDict({"a": 1}) == {"a": 1}  # ``type(x)(items)`` copies
    thawed = copy.deepcopy(view)
    assert type(thawed) is dict and type(thawed["a"]["b"]) is list
    assert type(copy.copy(view)) is dict and type(view.copy()) is dict


def test_readonly_config_copies_deep_nesting_without_recursion() -> None:
    """Defect 5: a config nested as deep as the JSON parser allows is still copied (no RecursionError)."""
    deep: dict[str, object] = {}
    node = deep
    for _ in range(5000):
        node["n"] = {}
        node = node["n"]  # type: ignore[assignment]
    view = readonly_config(deep)
    depth = 0
    while view:
        view = view["n"]
        depth += 1
    assert depth == 5000


# -- defect 6: boolean environment controls ------------------------------------------------------


@pytest.mark.parametrize("raw", ["1", "true", "YES", " on "])
def test_env_flag_true_spellings(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOLS_TRACE_PLUGINS", raw)
    assert env_flag("KVPOOLS_TRACE_PLUGINS") is True


@pytest.mark.parametrize("raw", ["0", "false", "No", "OFF", ""])
def test_env_flag_false_spellings(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOLS_TRACE_PLUGINS", raw)
    assert env_flag("KVPOOLS_TRACE_PLUGINS") is False


@pytest.mark.parametrize("variable", ["KVPOOLS_DISABLE_PLUGIN_AUTOLOAD", "KVPOOLS_TRACE_PLUGINS"])
def test_a_boolean_control_that_is_no_boolean_is_refused(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 6: ``KVPOOLS_DISABLE_PLUGIN_AUTOLOAD=maybe`` used to be read as "disable"."""
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ConfigError, match=rf"{variable}='maybe' is not a boolean: use 1, true, yes or on .* 0, false"):
        Registry()


# -- defect 7: a preset of a disabled built-in plugin --------------------------------------------


def test_a_preset_of_a_disabled_plugin_says_which_and_how_to_enable_it() -> None:
    """Defect 7: with mha disabled, llama-3.1-8b used to be "an unknown model"."""
    with pytest.raises(ConfigError) as caught:
        plan("llama-3.1-8b", Serving(), memory="8GiB", registry=Registry(disabled=["mha"]))
    message = str(caught.value)
    assert 'a preset of the plugin "mha" (kvpools ' in message and "disabled" in message
    assert "remove mha from Registry(disabled=...)" in message
    with pytest.raises(ConfigError, match=r'"mha" .*not loaded.*add mha to Registry\(plugins=\.\.\.\)'):
        plan("llama-3.1-8b", Serving(platform="cpu"), memory="8GiB", registry=Registry(plugins=["cpu", "mla"]))


def test_a_truly_unknown_model_is_still_unknown() -> None:
    with pytest.raises(ConfigError, match="Unknown model 'no-such-model'"):
        plan("no-such-model", Serving(), memory="8GiB", registry=Registry(disabled=["mha"]))


# -- defect 8: building on a device nothing can build on -----------------------------------------


def test_build_on_a_device_torch_cannot_allocate_names_the_platforms() -> None:
    """Defect 8: ``build(plan, "xpu")`` used to surface torch's AssertionError wrapped as a core hook error."""
    import torch

    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        pytest.skip("this torch can allocate on xpu")
    registry = Registry()
    result = plan("llama-3.1-8b", Serving(platform="cpu"), memory="64MiB", registry=registry)
    with pytest.raises(ConfigError) as caught:
        build(result, "xpu", registry=registry)
    message = str(caught.value)
    assert not isinstance(caught.value, PluginHookError)
    assert "Cannot build on device 'xpu'" in message
    assert "Platforms that can build:" in message and "cpu (" in message and "cuda (" in message
    assert "'meta'" in message
