"""Plugin answers are checked where they leave the plugin, and a wrong one names that plugin and the hook.

Each test installs an in-process plugin (``Registry(extra_plugins=...)``) that
returns one kind of garbage and drives the real pipeline (``plan`` / ``build``),
so it proves what a user sees: a ``PluginResultError`` naming the plugin that
returned the value, never the wrapper or core step that would trip over it.
"""

from __future__ import annotations

import io
import sys
import textwrap
import types
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import (
    CellPart,
    CellSize,
    LayerSpec,
    ModelSpec,
    NoProviderError,
    PluginHookError,
    Registry,
    Serving,
    build,
    hookimpl,
    hookspecs,
    plan,
)
from kvpools_core.errors import PluginResultError

EAGLE = Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=1)


def plugin(*impls: Callable[..., Any]) -> types.ModuleType:
    """An in-process plugin module made of hook implementations."""
    module = types.ModuleType("fake_plugin")
    for impl in impls:
        setattr(module, impl.__name__, impl)
    return module


def registry_with(name: str, *impls: Callable[..., Any], **kwargs: Any) -> Registry:
    return Registry(autoload=True, plugins=None, disabled=(), extra_plugins={name: plugin(*impls)}, **kwargs)


def raises_blaming(plugin_name: str, hook: str) -> Any:
    """``pytest.raises`` for a result error that names the in-process plugin ``plugin_name`` and ``hook``."""
    return pytest.raises(PluginResultError, match=rf'"{plugin_name}" \(<in-process> -\).*\b{hook}\b')


def assert_mentions(error: BaseException, *phrases: str, absent: tuple[str, ...] = ()) -> None:
    text = str(error)
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} not in {text!r}"
    for phrase in absent:
        assert phrase not in text, f"{phrase!r} in {text!r}"


class _Opaque:
    """An object the core cannot measure."""


class _Measured:
    def __init__(self, nbytes: Any, by_pool: Any = None) -> None:
        self.nbytes = nbytes
        if by_pool is not None:
            self.nbytes_by_pool = by_pool


# -- every hook has a contract -------------------------------------------------


def test_every_hook_declares_what_it_must_return() -> None:
    assert set(hookspecs.RESULTS) == set(Registry(autoload=False).hook_names())


def test_a_result_error_is_a_hook_error() -> None:
    assert issubclass(PluginResultError, PluginHookError)


# -- planning hooks ------------------------------------------------------------


def test_a_wrong_cell_size_is_blamed_on_its_plugin_not_on_the_speculative_wrapper() -> None:
    @hookimpl(tryfirst=True)
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> Any:
        return {"bytes_per_token": 128}

    registry = registry_with("badarch", estimate_cell_size)
    with raises_blaming("badarch", "estimate_cell_size") as info:
        plan("llama-3.1-8b", EAGLE, memory="1GiB", registry=registry)
    assert_mentions(
        info.value,
        "with dict with keys ['bytes_per_token']: not a CellSize",
        "Expected a CellSize",
        absent=("speculative", "core", "AttributeError"),
    )


def test_a_cell_size_with_foreign_parts_is_blamed_on_its_plugin() -> None:
    @hookimpl(tryfirst=True)
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> Any:
        return CellSize(parts=[("kv", 128)], sglang_bytes_per_token=128.0, num_layers=model.num_layers)

    with raises_blaming("badarch", "estimate_cell_size") as info:
        plan("llama-3.1-8b", EAGLE, memory="1GiB", registry=registry_with("badarch", estimate_cell_size))
    assert_mentions(info.value, "its parts[0] is tuple of 2 item(s), not a CellPart", absent=("speculative",))


def test_a_cell_size_that_is_deeply_wrong_is_refused_by_the_value_itself() -> None:
    """Field values (negative bytes) are validated by the frozen values when the plugin builds them."""
    with pytest.raises(Exception, match=r"bytes_per_token must be a non-negative integer, got -1"):
        CellPart("kv", -1)


def test_a_wrong_pool_sizing_is_blamed_on_its_plugin_not_on_core() -> None:
    @hookimpl(tryfirst=True)
    def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Any) -> Any:
        return 42

    with raises_blaming("sizer", "size_pools") as info:
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry_with("sizer", size_pools))
    assert_mentions(info.value, "with 42: not a PoolSizing", "Expected a PoolSizing", absent=('"core"',))


def test_a_retraction_host_pool_answer_that_is_not_a_bool_is_blamed_on_its_plugin() -> None:
    @hookimpl(tryfirst=True)
    def retraction_host_pool(plan: Any) -> Any:
        return "yes"

    serving = Serving(disaggregation_mode="decode")
    with raises_blaming("backup", "retraction_host_pool") as info:
        plan("llama-3.1-8b", serving, memory="1GiB", registry=registry_with("backup", retraction_host_pool))
    assert_mentions(info.value, "not True or False", absent=('"core"',))


def test_a_plugin_vouching_for_its_pool_gets_the_retraction_host_pool() -> None:
    """The contract, not a name: a third-party answer True makes an MLA plan's host_pool backup plannable."""

    @hookimpl(tryfirst=True)
    def retraction_host_pool(plan: Any) -> bool:
        return True

    serving = Serving(disaggregation_mode="decode", disaggregation_decode_retraction_backup="host_pool", tp_size=8)
    registry = registry_with("vouch", retraction_host_pool)
    result = plan("deepseek-v3", serving, memory="40GiB", host_memory="1TiB", registry=registry)
    assert result.host is not None and result.host.retraction_backup


def test_a_claim_that_is_not_a_model_spec_is_blamed_on_its_plugin() -> None:
    @hookimpl
    def parse_model_config(config: Any, source: str) -> Any:
        return "llama"

    with raises_blaming("claimer", "parse_model_config") as info:
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry_with("claimer", parse_model_config))
    assert_mentions(info.value, "with str 'llama': not a ModelSpec")


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (["llama-3.1-8b"], "list of 1 item(s): not a mapping"),
        ({"toy": 5}, "'toy' maps to 5, not a path"),
        ({3: "/x/config.json"}, "key 3 is not a str"),
    ],
)
def test_wrong_presets_are_blamed_on_their_plugin(answer: Any, problem: str) -> None:
    @hookimpl
    def presets() -> Any:
        return answer

    with raises_blaming("shelf", "presets") as info:
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry_with("shelf", presets))
    assert_mentions(info.value, problem, "config.json path (str or os.PathLike)")


def test_presets_may_be_paths(tmp_path: Path) -> None:
    config = tmp_path / "toy.json"
    config.write_text(
        '{"model_type": "toy-latent", "num_hidden_layers": 2, "latent_dim": 8, "max_position_embeddings": 64}'
    )

    @hookimpl
    def presets() -> Any:
        return {"toy-from-path": config}

    result = plan("toy-from-path", Serving(), memory="1MiB", registry=registry_with("shelf", presets))
    assert result.provenance["parse_model_config"] == ("example",)


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("--page-size 3 is odd", "one string, not a list of messages (it would be read one character at a time)"),
        (["fine", 7], "item 1 is 7, not a str"),
        ({"problem": "x"}, "not a list of messages"),
    ],
)
def test_wrong_validation_answers_are_blamed_on_their_plugin(answer: Any, problem: str) -> None:
    @hookimpl
    def validate(model: ModelSpec, serving: Serving) -> Any:
        return answer

    with raises_blaming("checker", "validate") as info:
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry_with("checker", validate))
    assert_mentions(info.value, problem)


def test_validation_messages_may_be_a_tuple() -> None:
    @hookimpl
    def validate(model: ModelSpec, serving: Serving) -> Any:
        return ("no, thanks",)

    with pytest.raises(Exception, match=r"no, thanks \[checker\]"):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry_with("checker", validate))


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"free": 1 << 30, "total": 1 << 31}, "'free_bytes' is missing"),
        (1 << 30, "with 1073741824: not a mapping"),
        ({"free_bytes": "4GiB", "total_bytes": 1 << 33}, "'free_bytes' is str '4GiB', not an int >= 0"),
        ({"free_bytes": 1 << 30, "total_bytes": -1}, "'total_bytes' is -1, not an int >= 0"),
        ({"free_bytes": True, "total_bytes": 1}, "'free_bytes' is True, not an int >= 0"),
    ],
)
def test_wrong_memory_readings_are_blamed_on_their_platform(answer: Any, problem: str) -> None:
    @hookimpl(tryfirst=True)
    def available_memory(device: str, serving: Serving) -> Any:
        return answer

    with raises_blaming("vendor", "available_memory") as info:
        plan("llama-3.1-8b", Serving(), device="cpu", registry=registry_with("vendor", available_memory))
    assert_mentions(info.value, problem, 'a mapping with ints "free_bytes" and "total_bytes" >= 0')


def test_a_distribution_plugin_is_named_with_its_distribution_and_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fake_badarch.py").write_text(
        textwrap.dedent(
            """
            from kvpools_core import hookimpl

            @hookimpl(tryfirst=True)
            def estimate_cell_size(model, serving):
                return [128]
            """
        )
    )
    info = tmp_path / "kvpools_badarch-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvpools-badarch\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kvpools]\nbadarch = fake_badarch\n")
    sys.modules.pop("fake_badarch", None)
    with pytest.raises(
        PluginResultError,
        match=r'Plugin "badarch" \(kvpools-badarch 0\.1\) answered hook estimate_cell_size with list of 1 item\(s\)',
    ):
        plan("llama-3.1-8b", EAGLE, memory="1GiB", registry=Registry())


# -- build hooks ---------------------------------------------------------------


@pytest.fixture(scope="module")
def small_plan(registry: Registry) -> Any:
    return plan("llama-3.1-8b", Serving(max_total_tokens=64), memory="64MiB", registry=registry)


@pytest.mark.parametrize(
    ("hook", "answer", "problem"),
    [
        ("build_pool", _Opaque(), "_Opaque object: it has no nbytes"),
        ("build_pool", _Measured(1024), "it has no nbytes_by_pool() (measured bytes per plan pool)"),
        ("build_pool", _Measured(1024, lambda: {"kv": -1}), "its nbytes_by_pool() returned dict with keys ['kv']"),
        ("build_pool", _Measured(1024, "kv"), "its nbytes_by_pool is str 'kv', not a method"),
        ("build_req_to_token_pool", _Opaque(), "it has no nbytes"),
        ("build_req_to_token_pool", _Measured(-5), "its nbytes is -5, not an int >= 0"),
        ("build_allocator", _Measured("12"), "its nbytes is str '12', not an int >= 0"),
    ],
)
def test_wrong_built_objects_are_blamed_on_their_plugin(small_plan: Any, hook: str, answer: Any, problem: str) -> None:
    def impl(plan: Any, device: str) -> Any:
        return answer

    impl.__name__ = hook
    with raises_blaming("builder", hook) as info:
        build(small_plan, "meta", registry=registry_with("builder", hookimpl(tryfirst=True)(impl)))
    assert_mentions(info.value, problem)


def test_a_tensor_answer_is_summarised_not_dumped(small_plan: Any) -> None:
    import torch

    @hookimpl(tryfirst=True)
    def build_pool(plan: Any, device: str) -> Any:
        return torch.zeros(4, 4)

    with raises_blaming("builder", "build_pool") as info:
        build(small_plan, "meta", registry=registry_with("builder", build_pool))
    assert_mentions(info.value, "torch.Tensor object: it has no nbytes_by_pool()", absent=("tensor(",))


def test_a_raising_measurement_is_blamed_on_the_plugin(small_plan: Any) -> None:
    class Broken:
        @property
        def nbytes(self) -> int:
            raise RuntimeError("tensor freed")

    @hookimpl(tryfirst=True)
    def build_allocator(plan: Any, pool: Any, device: str) -> Any:
        return Broken()

    with raises_blaming("builder", "build_allocator") as info:
        build(small_plan, "meta", registry=registry_with("builder", build_allocator))
    assert_mentions(info.value, "checking it raised RuntimeError: tensor freed")


# -- wrappers ------------------------------------------------------------------


def test_a_wrapper_that_swaps_the_result_is_blamed() -> None:
    @hookimpl(wrapper=True)
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> Generator[None, Any, Any]:
        yield
        return "a bigger cell"

    with pytest.raises(PluginResultError) as info:
        plan("llama-3.1-8b", EAGLE, memory="1GiB", registry=registry_with("swapper", estimate_cell_size))
    assert_mentions(
        info.value,
        'Wrapper "swapper" (<in-process> -) replaced the answer of mha to hook estimate_cell_size',
        "with str 'a bigger cell': not a CellSize",
    )


def test_a_wrapper_that_forgets_to_return_is_blamed() -> None:
    @hookimpl(wrapper=True)
    def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Any) -> Generator[None, Any, Any]:
        sizing = yield
        assert sizing is not None  # ... and then no return

    with pytest.raises(PluginResultError) as info:
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry_with("forgetful", size_pools))
    assert_mentions(
        info.value,
        'Wrapper "forgetful" (<in-process> -) of hook size_pools returned None, discarding the answer of core',
        "return (yield)",
    )


def test_an_old_style_hookwrapper_that_forces_garbage_is_blamed() -> None:
    @hookimpl(hookwrapper=True)
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> Iterator[None]:
        outcome = yield
        outcome.force_result(3.5)

    with pytest.raises(PluginResultError) as info:
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry_with("oldstyle", estimate_cell_size))
    assert_mentions(
        info.value, 'Wrapper(s) "oldstyle" (<in-process> -) of hook estimate_cell_size', "as 3.5: not a CellSize"
    )


def test_a_wrapper_of_a_collecting_hook_may_not_add_answers() -> None:
    @hookimpl(wrapper=True)
    def validate(model: ModelSpec, serving: Serving) -> Generator[None, Any, Any]:
        problems = yield
        return [*problems, ["an extra problem"]]

    with pytest.raises(PluginResultError) as info:
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry_with("adder", validate))
    assert_mentions(info.value, 'Wrapper "adder" (<in-process> -) of collecting hook validate', "not add or drop them")


def test_a_wrapper_that_breaks_an_answer_in_place_is_blamed() -> None:
    @hookimpl(wrapper=True)
    def available_memory(device: str, serving: Serving) -> Generator[None, Any, Any]:
        reading = yield
        reading["free_bytes"] = "plenty"
        return reading

    with pytest.raises(PluginResultError) as info:
        plan("llama-3.1-8b", Serving(), device="cpu", registry=registry_with("mutator", available_memory))
    assert_mentions(
        info.value, 'Wrapper(s) "mutator" (<in-process> -) of hook available_memory', "'free_bytes' is str 'plenty'"
    )


def test_a_wrapper_that_changes_nothing_is_not_blamed_or_credited() -> None:
    @hookimpl(wrapper=True)
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> Generator[None, Any, Any]:
        return (yield)

    result = plan("llama-3.1-8b", EAGLE, memory="1GiB", registry=registry_with("bystander", estimate_cell_size))
    assert result.provenance["estimate_cell_size"] == ("mha", "speculative")


# -- what users see beside the error -------------------------------------------


def test_the_trace_shows_the_failing_call() -> None:
    @hookimpl(tryfirst=True)
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> Any:
        return 7

    stream = io.StringIO()
    registry = registry_with("badarch", estimate_cell_size, trace=True, trace_stream=stream)
    with pytest.raises(PluginResultError):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry)
    line = [ln for ln in stream.getvalue().splitlines() if "estimate_cell_size(" in ln][-1]
    assert "badarch > " in line.split("asked [")[1]
    assert 'raised PluginResultError: Plugin "badarch"' in line


def test_a_valid_answer_from_an_in_process_plugin_is_used() -> None:
    @hookimpl(tryfirst=True)
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> Any:
        return CellSize(parts=[CellPart("kv", 1000)], sglang_bytes_per_token=1000.0, num_layers=model.num_layers)

    result = plan("llama-3.1-8b", Serving(), memory="1GiB", registry=registry_with("flat", estimate_cell_size))
    assert result.cell.bytes_per_token == 1000
    assert result.provenance["estimate_cell_size"] == ("flat",)


def test_no_answer_is_still_no_provider(registry: Registry) -> None:
    toy = ModelSpec(
        name="toy",
        architecture="nobody-owns-this",
        layers=[LayerSpec(index=0, kind="none")],
        context_len=16,
        dtype="bfloat16",
    )
    with pytest.raises(NoProviderError, match="No plugin answered estimate_cell_size"):
        plan(toy, Serving(), memory="1MiB", registry=registry)
