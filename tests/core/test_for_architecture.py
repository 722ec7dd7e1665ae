"""``for_architecture``: a hook implementation answers for its own architecture(s) and declines the rest."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from kvpools_core import (
    CellPart,
    CellSize,
    LayerSpec,
    ModelSpec,
    NoProviderError,
    Plan,
    Registry,
    Serving,
    for_architecture,
    hookimpl,
)
from kvpools_core import plan as make_plan


def model(architecture: str) -> ModelSpec:
    layers = [LayerSpec(index=i, kind="attention", num_kv_heads=2, head_dim=8, v_head_dim=8) for i in range(2)]
    return ModelSpec(name="toy", architecture=architecture, layers=layers, context_len=256, dtype="bfloat16")


def cell(per_token: int = 64) -> CellSize:
    return CellSize(parts=[CellPart("kv", per_token)], sglang_bytes_per_token=per_token, num_layers=2)


def toy_plan(architecture: str) -> Plan:
    """A real plan of a model of ``architecture``, through a registry with an in-process plugin."""

    class Toy:
        @staticmethod
        @hookimpl
        def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
            return cell() if model.architecture == architecture else None

    registry = Registry(autoload=False, plugins=["cpu"], extra_plugins={"toy": Toy()})
    return make_plan(model(architecture), Serving(platform="cpu"), memory="1MiB", registry=registry)


def test_answers_for_its_architecture_and_declines_another() -> None:
    @for_architecture("toy")
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize:
        return cell()

    assert estimate_cell_size(model("toy"), Serving()) == cell()
    assert estimate_cell_size(model("other"), Serving()) is None


def test_several_architectures() -> None:
    @for_architecture("a", "b")
    def validate(model: ModelSpec, serving: Serving) -> list[str]:
        return [model.architecture]

    assert validate(model("a"), Serving()) == ["a"]
    assert validate(model("b"), Serving()) == ["b"]
    assert validate(model("c"), Serving()) is None


def test_positional_and_keyword_calls() -> None:
    @for_architecture("toy")
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> str:
        return "answered"

    for args, kwargs in [
        ((model("toy"), Serving()), {}),
        ((model("toy"),), {"serving": Serving()}),
        ((), {"model": model("toy"), "serving": Serving()}),
        ((), {"serving": Serving(), "model": model("toy")}),
    ]:
        assert estimate_cell_size(*args, **kwargs) == "answered"
    assert estimate_cell_size(serving=Serving(), model=model("else")) is None


def test_model_need_not_be_the_first_argument() -> None:
    @for_architecture("toy")
    def size_pools(serving: Serving, model: ModelSpec) -> str:
        return "sized"

    assert size_pools(Serving(), model("toy")) == "sized"
    assert size_pools(Serving(), model("other")) is None
    assert size_pools(Serving(), model=model("toy")) == "sized"


def test_a_plan_argument() -> None:
    @for_architecture("toy")
    def build_pool(plan: Plan, device: str) -> str:
        return f"built on {device}"

    toy, other = toy_plan("toy"), toy_plan("other")
    assert build_pool(toy, "meta") == "built on meta"
    assert build_pool(plan=toy, device="meta") == "built on meta"
    assert build_pool(device="meta", plan=toy) == "built on meta"
    assert build_pool(other, "meta") is None
    assert build_pool(plan=other, device="meta") is None


def test_keeps_the_name_signature_and_docstring() -> None:
    def build_allocator(plan: Plan, pool: Any, device: str) -> None:
        """Doc."""

    guarded = for_architecture("toy")(build_allocator)
    assert guarded.__name__ == "build_allocator"
    assert guarded.__doc__ == "Doc."
    assert list(inspect.signature(guarded).parameters) == ["plan", "pool", "device"]


def test_refuses_a_function_with_neither_model_nor_plan() -> None:
    def available_memory(device: str, serving: Serving) -> None:
        return None

    with pytest.raises(TypeError, match=r"takes neither 'model' nor 'plan'"):
        for_architecture("toy")(available_memory)


@pytest.mark.parametrize("names", [(), ("",), ("toy", ""), (None,), (3,)])
def test_refuses_missing_or_bad_names(names: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError, match="one or more architecture names"):
        for_architecture(*names)


class Recording:
    """A plugin whose guarded implementations take only some of a hook's arguments, and record what they got."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @hookimpl
    @for_architecture("toy")
    def estimate_cell_size(self, model: ModelSpec) -> CellSize:  # the hook also passes serving
        self.calls.append(("estimate_cell_size", {"model": model}))
        return cell(96)

    @hookimpl
    @for_architecture("toy")
    def validate(self, serving: Serving, model: ModelSpec) -> list[str]:  # declared out of the spec's order
        self.calls.append(("validate", {"serving": serving, "model": model}))
        return []

    @hookimpl
    @for_architecture("toy")
    def build_pool(self, plan: Plan) -> Any:  # the hook also passes device
        self.calls.append(("build_pool", {"plan": plan}))
        return None


def test_pluggy_passes_exactly_the_declared_arguments() -> None:
    recording = Recording()
    registry = Registry(autoload=False, plugins=["cpu"], extra_plugins={"recording": recording})
    serving = Serving(platform="cpu")

    toy = make_plan(model("toy"), serving, memory="1MiB", registry=registry)
    assert toy.cell.bytes_per_token == 96
    assert toy.provenance["estimate_cell_size"] == ("recording",)
    assert [name for name, _ in recording.calls] == ["validate", "estimate_cell_size"]
    validate_args, cell_args = (kwargs for _, kwargs in recording.calls)
    assert set(validate_args) == {"serving", "model"} and validate_args["model"].architecture == "toy"
    assert validate_args["serving"] == toy.serving  # the serving options as resolved (platform traits)
    assert set(cell_args) == {"model"}

    recording.calls.clear()
    spec = registry.plugin_manager.hook.build_pool.spec
    arguments = {name: None for name in spec.argnames} | {"plan": toy, "device": "meta"}  # every declared argument
    result, by = registry.call("build_pool", **arguments)
    assert by == ("core",) and type(result).__name__ == "BytePool"  # the recording plugin declined; the core built
    assert recording.calls == [("build_pool", {"plan": toy})]

    # another architecture: every guarded implementation declines without running
    recording.calls.clear()
    with pytest.raises(NoProviderError, match="estimate_cell_size"):
        make_plan(model("other"), serving, memory="1MiB", registry=registry)
    assert recording.calls == []
