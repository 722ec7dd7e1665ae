"""The platform contract: traits (page-size rules, raw MLA rows, index dtype) and workspaces.

A toy platform plugin, registered beside the installed ones, declares each
trait; the tests check that the core and the architectures obey it without
naming the platform, and that plans and builds charge its workspaces exactly.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from kvpools_core import Plan, Serving, build, hookimpl, plan
from kvpools_core.errors import InvalidValueError, PluginResultError, UnsupportedCombinationError
from kvpools_core.registry import Registry
from kvpools_core.values import KVDtypeRule, ModelSpec, PageSizeRule, PlatformTraits, PoolSizing, Workspace, to_dict

GiB = 1 << 30
TOY = "toy"


class ToyPlatform:
    """A vendor's platform: page rules, raw-row backends, int32 slots, and workspaces per request and once."""

    def __init__(self, traits: PlatformTraits | None = None, workspaces: list[Workspace] | None = None) -> None:
        self.traits = traits or PlatformTraits(platform=TOY)
        self.spaces = workspaces or []

    @hookimpl
    def platforms(self) -> dict[str, str]:
        return {TOY: "a test platform"}

    @hookimpl(tryfirst=True)
    def platform_traits(self, serving: Serving) -> PlatformTraits | None:
        return self.traits if serving.platform == TOY else None

    @hookimpl
    def workspaces(self, model: ModelSpec, serving: Serving) -> list[Workspace] | None:
        return self.spaces if serving.platform == TOY else None


def registry_with(platform: ToyPlatform) -> Registry:
    return Registry(extra_plugins={"toyplat": platform})


WORKSPACES = [
    Workspace(name="toy_indices", purpose="page indices", bytes_per_request=4096 * 4, dtype="int32"),
    Workspace(name="toy_scratch", purpose="a fixed scratch", fixed_bytes=1 << 20),
]


# -- values ---------------------------------------------------------------------------


def test_page_size_rules_describe_and_check() -> None:
    rule = PageSizeRule(kernels=("dsa",), sizes=(1,), multiple_of=16, reason="its kernels say so")
    assert rule.describe() == "1 or a multiple of 16"
    assert [p for p in (1, 8, 16, 48, 64) if rule.allows(p)] == [1, 16, 48, 64]
    assert rule.problem(8, "toy") == (
        "DSA models need page_size 1 or a multiple of 16 on toy: its kernels say so; got page_size 8."
    )
    assert PageSizeRule(sizes=(128,), reason="r", engine_message="use 128").problem(1, "toy") == (
        "Every model needs page_size 128 on toy: r (SGLang: 'use 128'); got page_size 1."
    )
    with pytest.raises(InvalidValueError, match="allows no page size"):
        PageSizeRule(reason="nothing")
    with pytest.raises(InvalidValueError, match="positive integers"):
        PageSizeRule(reason="r", sizes=(0,))


def test_traits_select_rules_by_kernel() -> None:
    every = PageSizeRule(sizes=(128,), reason="all")
    dsa = PageSizeRule(kernels=("dsa",), sizes=(64,), reason="dsa")
    traits = PlatformTraits(platform=TOY, page_size_rules=(every, dsa))
    assert len(traits.page_size_problems(64)) == 1  # only the every-model rule: 64 is not 128
    assert traits.page_size_problems(128, kernel="dsa") == [dsa.problem(128, TOY)]
    assert traits.page_size_problems(64, kernel="mla") == []  # no rule about the MLA kernels


def test_traits_and_workspaces_round_trip_through_json() -> None:
    traits = PlatformTraits(
        platform=TOY,
        page_size_rules=[PageSizeRule(kernels=("dsa",), sizes=(1,), multiple_of=16, reason="r")],
        raw_mla_row_backends=["b", "a"],
        slot_index_dtype="int32",
    )
    serving = Serving(platform=TOY, platform_traits=traits, workspaces=WORKSPACES)
    data = to_dict(serving)
    assert data["platform_traits"]["raw_mla_row_backends"] == ["a", "b"]  # plain JSON, sorted
    assert Serving.from_dict(data) == serving


def test_a_workspace_is_whole_elements() -> None:
    with pytest.raises(InvalidValueError, match="whole int32 elements"):
        Workspace(name="w", purpose="p", bytes_per_request=6, dtype="int32")


# -- traits in the pipeline ------------------------------------------------------------


def test_the_plan_records_the_platform_traits() -> None:
    traits = PlatformTraits(platform=TOY, slot_index_dtype="int32")
    result = plan("llama-3.1-8b", Serving(platform=TOY), memory="8GiB", registry=registry_with(ToyPlatform(traits)))
    assert result.serving.platform_traits == traits
    assert result.provenance["platform_traits"] == ("toyplat",)
    assert Plan.from_json(result.to_json()) == result
    cuda = plan("llama-3.1-8b", Serving(), memory="8GiB")
    assert cuda.serving.traits.slot_index_dtype == "int64"


def test_a_page_rule_for_every_model_is_checked_by_the_core() -> None:
    traits = PlatformTraits(platform=TOY, page_size_rules=[PageSizeRule(sizes=(128,), reason="its backend")])
    registry = registry_with(ToyPlatform(traits))
    with pytest.raises(UnsupportedCombinationError, match=r"Every model needs page_size 128 on toy.*\[toyplat\]"):
        plan("llama-3.1-8b", Serving(platform=TOY, page_size=64), memory="8GiB", registry=registry)
    assert plan("llama-3.1-8b", Serving(platform=TOY, page_size=128), memory="8GiB", registry=registry)


def test_a_page_rule_about_dsa_kernels_binds_dsa_models_only() -> None:
    rule = PageSizeRule(kernels=("dsa",), multiple_of=32, reason="its sparse kernels")
    registry = registry_with(ToyPlatform(PlatformTraits(platform=TOY, page_size_rules=[rule])))
    with pytest.raises(UnsupportedCombinationError, match=r"DSA models need page_size a multiple of 32 on toy"):
        plan("deepseek-v3.2", Serving(platform=TOY, page_size=16), memory="8GiB", registry=registry)
    assert plan("deepseek-v3.2", Serving(platform=TOY, page_size=32), memory="8GiB", registry=registry)
    assert plan("llama-3.1-8b", Serving(platform=TOY, page_size=16), memory="8GiB", registry=registry)
    # no rule of CUDA's reaches another platform: page 16 is fine for DSA on a platform without DSA rules
    assert plan(
        "deepseek-v3.2", Serving(platform=TOY, page_size=16), memory="8GiB", registry=registry_with(ToyPlatform())
    )


def test_kv_dtype_rules_describe_and_check() -> None:
    rule = KVDtypeRule(
        reason="no fp8 latent kernels",
        refused=("fp8_e4m3",),
        kernels=("mla",),
        instead=("bf16", "fp32"),
        engine_message="fp8 MLA unsupported.",
    )
    assert rule.problem("bf16", TOY) is None
    assert rule.problem("fp8_e4m3", TOY) == (
        "MLA models cannot store kv_cache_dtype fp8_e4m3 on toy: no fp8 latent kernels "
        "(SGLang: 'fp8 MLA unsupported.'); use kv_cache_dtype bf16 or fp32."
    )
    assert KVDtypeRule(reason="r", refused=["fp4_e2m1"]).problem("fp4_e2m1", TOY) == (
        "No model can store kv_cache_dtype fp4_e2m1 on toy: r."
    )
    with pytest.raises(InvalidValueError, match="at least one"):
        KVDtypeRule(reason="refuses nothing", refused=())
    traits = PlatformTraits(platform=TOY, kv_dtype_rules=[rule])
    assert traits.kv_dtype_problems("fp8_e4m3") == []  # a rule about MLA kernels binds no other model
    assert traits.kv_dtype_problems("fp8_e4m3", kernel="mla") == [rule.problem("fp8_e4m3", TOY)]
    assert PlatformTraits.from_dict(to_dict(traits)) == traits


def test_a_kv_dtype_rule_for_every_model_is_checked_by_the_core() -> None:
    rule = KVDtypeRule(reason="no fp8 kernels at all", refused=("fp8_e4m3",), instead=("bf16",))
    registry = registry_with(ToyPlatform(PlatformTraits(platform=TOY, kv_dtype_rules=[rule])))
    with pytest.raises(UnsupportedCombinationError, match=r"No model can store .*fp8_e4m3 on toy.*\[toyplat\]"):
        plan("llama-3.1-8b", Serving(platform=TOY, kv_cache_dtype="fp8_e4m3"), memory="8GiB", registry=registry)
    assert plan("llama-3.1-8b", Serving(platform=TOY, kv_cache_dtype="bf16"), memory="8GiB", registry=registry)


def test_a_kv_dtype_rule_about_mla_kernels_is_asked_by_every_latent_architecture() -> None:
    """MLA, DSA and the MLA-latent hybrids refuse it, attributed to themselves; MHA models are untouched."""
    rule = KVDtypeRule(reason="no fp8 latent kernels", refused=("fp8_e4m3",), kernels=("mla",))
    registry = registry_with(ToyPlatform(PlatformTraits(platform=TOY, kv_dtype_rules=[rule])))
    fp8 = Serving(platform=TOY, kv_cache_dtype="fp8_e4m3", page_size=64)
    for preset, plugin in (
        ("deepseek-v3", "mla"),
        ("deepseek-v3.2", "dsa"),
        ("kimi-linear-48b-a3b-instruct-nvfp4", "mamba"),
    ):
        with pytest.raises(UnsupportedCombinationError, match=rf"MLA models cannot store .* on toy.*\[{plugin}\]"):
            plan(preset, fp8, memory="80GiB", registry=registry)
    assert plan("llama-3.1-8b", fp8, memory="8GiB", registry=registry)
    assert plan("deepseek-v3", fp8, memory="80GiB", registry=registry_with(ToyPlatform()))  # no rule, no refusal


def test_raw_row_backends_come_from_the_platform() -> None:
    """fp8 DSA: FlashMLA's packed 656-byte row, unless the platform says its backend reads the raw 576-byte row."""
    fp8 = Serving(platform=TOY, kv_cache_dtype="fp8_e4m3", page_size=64)
    packed = plan("deepseek-v3.2", fp8, memory="8GiB", registry=registry_with(ToyPlatform()))
    raw_traits = PlatformTraits(platform=TOY, raw_mla_row_backends=[fp8.dsa_decode_backend])
    raw = plan("deepseek-v3.2", fp8, memory="8GiB", registry=registry_with(ToyPlatform(raw_traits)))
    layers = 61
    assert packed.cell.bytes_per_token - raw.cell.bytes_per_token == (656 - 576) * layers


def test_traits_for_another_platform_are_refused() -> None:
    class Liar(ToyPlatform):
        @hookimpl(tryfirst=True)
        def platform_traits(self, serving: Serving) -> PlatformTraits | None:
            return PlatformTraits(platform="cuda")

    with pytest.raises(PluginResultError, match=r"answered platform_traits for 'cuda' when asked about 'toy'"):
        plan("llama-3.1-8b", Serving(platform=TOY), memory="8GiB", registry=registry_with(Liar()))


# -- workspaces ------------------------------------------------------------------------

ARCHITECTURES = [
    ("llama-3.1-8b", {}),  # the core's sizing
    ("deepseek-v3", {}),  # MLA through the core's sizing
    ("gpt-oss-20b", {}),  # the swa plugin's two token spaces
    ("qwen3-next-80b-a3b-thinking", {}),  # the mamba plugin's state slots
    ("deepseek-v4-flash", {"page_size": 256}),  # the dsv4 plugin
]


@pytest.mark.parametrize(("model", "options"), ARCHITECTURES)
def test_every_sizing_charges_the_workspaces(model: str, options: dict[str, Any]) -> None:
    registry = registry_with(ToyPlatform(workspaces=WORKSPACES))
    serving = Serving(platform=TOY, max_running_requests=48, **options)
    with_ws = plan(model, serving, memory="40GiB", registry=registry)
    requests = with_ws.max_running_requests
    assert with_ws.provenance["workspaces"] == ("toyplat",)
    indices, scratch = with_ws.pool("toy_indices"), with_ws.pool("toy_scratch")
    assert (indices.kind, indices.bytes, indices.padding_slots) == ("workspace", requests * 4096 * 4, 0)
    assert scratch.bytes == 1 << 20 and not indices.sglang_charged
    assert with_ws.cost.bytes_for(**with_ws.counts) == with_ws.planned_bytes <= with_ws.budget.budget_bytes
    without = plan(
        model,
        Serving(platform=TOY, max_running_requests=48, **options),
        memory="40GiB",
        registry=registry_with(ToyPlatform()),
    )
    assert with_ws.max_total_num_tokens <= without.max_total_num_tokens  # the workspace came out of the KV
    pools = build(with_ws, "meta", registry=registry)
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in with_ws.pools}
    assert pools.allocated_bytes == with_ws.planned_bytes
    assert pools.workspaces["toy_indices"].dtype.__repr__() == "torch.int32"
    assert tuple(pools.workspaces["toy_indices"].shape) == (requests * 4096,)


def test_sglang_accounting_leaves_workspaces_out_of_its_token_count() -> None:
    """SGLang allocates backend buffers after sizing the KV pool: its token count ignores them."""
    serving = Serving(platform=TOY, accounting="sglang", max_running_requests=48)
    with_ws = plan("llama-3.1-8b", serving, memory="20GiB", registry=registry_with(ToyPlatform(workspaces=WORKSPACES)))
    without = plan("llama-3.1-8b", serving, memory="20GiB", registry=registry_with(ToyPlatform()))
    assert with_ws.max_total_num_tokens == without.max_total_num_tokens
    assert with_ws.pool("toy_indices").bytes == 48 * 4096 * 4


def test_a_sizing_that_forgets_the_workspaces_is_named() -> None:
    class Forgetful:
        @hookimpl(tryfirst=True)
        def size_pools(self, model: ModelSpec, serving: Serving, cell: Any, budget: Any) -> PoolSizing | None:
            from kvpools_core.parts.sizing import default_size_pools

            sizing = default_size_pools(model, serving, cell, budget, owner="forgetful")
            return attrs.evolve(sizing, pools=[p for p in sizing.pools if p.kind != "workspace"])

    registry = Registry(extra_plugins={"toyplat": ToyPlatform(workspaces=WORKSPACES), "forgetful": Forgetful()})
    with pytest.raises(PluginResultError, match=r"forgetful.*without the workspace\(s\) 'toy_indices', 'toy_scratch'"):
        plan("llama-3.1-8b", Serving(platform=TOY), memory="8GiB", registry=registry)


def test_two_workspaces_of_one_name_conflict() -> None:
    twice = [WORKSPACES[0], attrs.evolve(WORKSPACES[0], purpose="again")]
    with pytest.raises(PluginResultError, match=r"Workspace 'toy_indices' is declared twice"):
        plan(
            "llama-3.1-8b", Serving(platform=TOY), memory="8GiB", registry=registry_with(ToyPlatform(workspaces=twice))
        )


def test_a_workspace_answer_that_is_not_a_list_is_blamed() -> None:
    class Garbage(ToyPlatform):
        @hookimpl
        def workspaces(self, model: ModelSpec, serving: Serving) -> Any:
            return "lots"

    with pytest.raises(PluginResultError, match=r"toyplat.*workspaces"):
        plan("llama-3.1-8b", Serving(platform=TOY), memory="8GiB", registry=registry_with(Garbage()))


@pytest.mark.parametrize("requests", [1, 7, 256])
@pytest.mark.parametrize("extra_slots", [0, 3])
@pytest.mark.parametrize("speculative", [False, True])
def test_request_pools_bytes_are_the_built_request_pools_bytes(
    requests: int, extra_slots: int, speculative: bool
) -> None:
    """``request_pools_bytes`` (a search's probe, issue 37) is ``sum(p.bytes for p in request_pools(...))``: the
    request table (padding row, a decode node's extra rows, a speculative page's extra columns) and every
    platform workspace."""
    from kvpools_core.parts.sizing import request_pools, request_pools_bytes

    options: dict[str, Any] = {"page_size": 16, "workspaces": tuple(WORKSPACES)}
    if extra_slots:
        options |= {"disaggregation_mode": "decode", "disaggregation_decode_extra_slots": extra_slots}
    if speculative:
        options |= {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
        }
    serving = Serving(**options)
    built = request_pools(requests, 4096, serving)
    assert len(built) == 1 + len(WORKSPACES)
    assert request_pools_bytes(requests, 4096, serving) == sum(p.bytes for p in built)


def test_a_plan_without_workspaces_keeps_its_serving() -> None:
    """Issue 37: ``resolve_workspaces`` rebuilt the serving (a full ``Serving`` validation, about a tenth of a
    llama plan) even when no plugin declares a workspace; now the serving it would become is the one it has, so it
    is returned as it is.  A declared workspace still gives a serving that carries it."""
    from kvpools_core.models import load_model
    from kvpools_core.pipeline.platforms import resolve_workspaces
    from kvpools_core.registry import get_registry

    registry = get_registry()
    spec, _ = load_model("llama-3.1-8b", registry)
    serving = Serving()
    assert resolve_workspaces(spec, serving, registry) is serving

    @hookimpl
    def workspaces(model: ModelSpec, serving: Serving) -> list[Workspace]:
        return [Workspace(name="scratch", purpose="a test kernel's scratch", bytes_per_request=64)]

    import types

    module = types.ModuleType("declares")
    module.workspaces = workspaces  # type: ignore[attr-defined]
    declaring = Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"declares": module})
    resolved = resolve_workspaces(spec, serving, declaring)
    assert [(w.name, w.owner) for w in resolved.workspaces] == [("scratch", "declares")]
