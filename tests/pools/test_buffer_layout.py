"""The ``buffer_layout`` hook: one override point for how a platform carves every store's buffers.

A stand-in platform plugin (registered in-process) answers ``LAYER_MAJOR``:
every built-in preset then builds on ``meta`` with exactly the plan's bytes,
every token-indexed pool asks the layout for its buffers, and on the CPU the
stores read back bit for bit what the default per-layer layout reads back,
while the per-layer views share one tensor.  A layout that would change the
bytes is refused before anything is allocated; a plugin answering garbage is
named.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest
import torch
from torch import Tensor

from kvpools_core import Plan, Registry, Serving, build, get_registry, hookimpl, plan
from kvpools_core.errors import BufferLayoutError, KvpoolsError, PluginResultError, PoolPlanMismatchError
from kvpools_core.models import registry_presets
from kvpools_core.pools import MHATokenToKVPool
from kvpools_core.pools.layout import (
    CORE_LAYOUTS,
    LAYER_MAJOR,
    PER_LAYER,
    BufferLayout,
    BufferRequest,
    LayerMajorLayout,
    PageMajorLayout,
    RowIndexedBuffer,
    allocate,
    allocate_buffers,
    allocate_layer_buffers,
    allocate_page_major,
    allocate_rows_by_layer,
    allocate_split_by_layer,
)
from tests.dsa.support import SMALL_DSA

from ..mla.oracle_support import parse
from .conftest import build_small_plan

MiB = 1 << 20
MAPPING_POOL = "full_to_swa"  # the SWA index table: one table written by the allocator, not a layout buffer
PRESETS = sorted(registry_presets(get_registry()))


class RecordingLayout(LayerMajorLayout):
    """``layer_major``, remembering every request and the views it returned."""

    name = "layer_major"

    def __init__(self) -> None:
        self.allocated: list[tuple[BufferRequest, list[Tensor]]] = []

    def allocate(self, request: BufferRequest) -> list[Tensor]:
        views = super().allocate(request)
        self.allocated.append((request, views))
        return views


def platform_registry(layout: BufferLayout, devices: Sequence[str] = ("meta", "cpu")) -> Registry:
    """The installed plugins plus a stand-in platform that answers ``layout`` for its devices only."""

    @hookimpl(tryfirst=True)
    def buffer_layout(plan: Plan, device: str) -> BufferLayout | None:
        return layout if torch.device(device).type in devices else None

    return _registry("vendor", buffer_layout)


def _registry(name: str, *impls: Callable[..., Any]) -> Registry:
    module = types.ModuleType(f"{name}_plugin")
    for impl in impls:
        setattr(module, impl.__name__, impl)
    return Registry(autoload=True, plugins=None, disabled=(), extra_plugins={name: module})


def _servings() -> list[Serving]:
    return [
        Serving(page_size=64),
        Serving(
            page_size=64,
            kv_cache_dtype="fp8_e4m3",
            max_running_requests=32,
            speculative_algorithm="EAGLE",
            speculative_draft_num_layers=1,
            speculative_num_steps=2,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=3,
        ),
        # DeepSeek-V4 pages its SWA rows by 256 (SGLang asserts it); at SGLang's own SWA ratio (0.1) 20 GiB leaves
        # deepseek-v4-pro's SWA pool less than a page, so the layouts are proven at the generic 0.8
        Serving(page_size=256, tp_size=8, swa_full_tokens_ratio=0.8),
    ]


# -- every preset, layer-major, on meta ----------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_builds_layer_major_on_meta_with_the_planned_bytes(preset: str) -> None:
    built = 0
    for serving in _servings():
        try:
            planned = plan(preset, serving, memory="20GiB")
        except KvpoolsError:
            continue  # a combination the preset's plugin refuses (the first serving always plans)
        layout = RecordingLayout()
        pools = build(planned, "meta", registry=platform_registry(layout))
        built += 1
        assert pools.layout is layout and pools.provenance["buffer_layout"] == ("vendor",)
        by_pool = pools.kv_pool.nbytes_by_pool()
        assert by_pool == {name: planned.pool(name).bytes for name in by_pool}
        assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
        # every token-indexed KV buffer went through the layout, and the request table's state tensors
        # (mamba's conv and SSM state), and nothing else did
        state_pools = {"mamba_state"} & set(pools.allocated_by_pool())
        carved = {k: v for k, v in by_pool.items() if k != MAPPING_POOL}
        carved |= {name: planned.pool(name).bytes for name in state_pools}
        requested: Counter[str] = Counter()
        for request, views in layout.allocated:
            requested[request.pool] += request.nbytes
            assert [tuple(v.shape) for v in views] == [request.shape] * request.num_layers
            if views:
                assert len({id(v._base) for v in views}) == 1 and views[0]._base.shape[0] == request.num_layers
        assert +requested == +Counter(carved)
    assert built >= 1


def test_the_core_answers_per_layer_and_stays_out_of_provenance() -> None:
    planned = build_small_plan()
    pools = build(planned, "cpu")
    assert pools.layout is PER_LAYER and "buffer_layout" not in pools.provenance
    buffers = pools.kv_pool.kv.k_buffer
    assert len({t.untyped_storage().data_ptr() for t in buffers}) == len(buffers) == 4
    assert CORE_LAYOUTS == {"per_layer": PER_LAYER, "layer_major": LAYER_MAJOR}


def test_a_platform_declines_other_devices() -> None:
    registry = platform_registry(LAYER_MAJOR, devices=("npu",))
    pools = build(build_small_plan(), "meta", registry=registry)
    assert pools.layout is PER_LAYER and "buffer_layout" not in pools.provenance


# -- bit for bit on the CPU ----------------------------------------------------


def _small_mla(kv: str) -> Plan:
    config = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 16,
        "max_position_embeddings": 128,
        "torch_dtype": "bfloat16",
    }
    return plan(parse(config), Serving(kv_cache_dtype=kv, page_size=16), memory=1 * MiB)


def _small_dsa() -> Plan:
    config = dict(SMALL_DSA)
    return plan(parse(config), Serving(page_size=64, kv_cache_dtype="fp8_e4m3"), memory=4 * MiB)


def _swa() -> Plan:
    serving = Serving(page_size=4, kv_cache_dtype="fp8_e4m3", max_running_requests=4, context_length=64)
    return plan("gpt-oss-20b", serving, memory=64 * MiB)


def _random(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _slots(pool: Any, n: int = 8) -> Tensor:
    return torch.randperm(pool.size, generator=torch.Generator().manual_seed(0))[:n] + pool.page_size


def _raw(t: Tensor) -> Tensor:
    return t.contiguous().view(torch.uint8)


def _mha_round_trip(pools: Any) -> tuple[list[Tensor], list[Tensor]]:
    pool = pools.kv_pool
    loc, reads = _slots(pool), []
    for layer in range(pool.start_layer, pool.end_layer):
        g = pool.kv.layers[layer - pool.start_layer]
        k, v = _random(8, g.heads, g.head_dim, seed=layer), _random(8, g.heads, g.v_head_dim, seed=-layer)
        pool.set_kv_buffer(layer, loc, k, v)
        reads += pool.get_kv(layer, loc)
    return reads, pool.kv.k_buffer + pool.kv.v_buffer + pool.kv.k_scale_buffer


def _mla_round_trip(pools: Any) -> tuple[list[Tensor], list[Tensor]]:
    pool = pools.kv_pool
    loc, reads = _slots(pool), []
    for layer in range(pool.start_layer, pool.end_layer):
        pool.set_kv_buffer(layer, loc, _random(8, 1, pool.dims.kv_cache_dim, seed=layer))
        reads += pool.get_mla_kv(layer, loc)
    return reads, pool.kv_buffer + pool.kv_scale_buffer


def _dsa_round_trip(pools: Any) -> tuple[list[Tensor], list[Tensor]]:
    pool = pools.kv_pool
    loc, reads = _slots(pool), []
    for layer in range(pool.start_layer, pool.end_layer):
        pool.set_mla_kv_buffer(layer, loc, _random(8, 1, 128, seed=layer), _random(8, 1, 32, seed=-layer))
        pool.set_index_k(layer, loc, _random(8, 128, seed=100 + layer))
        reads += [*pool.get_mla_kv(layer, loc), pool.get_index_k(layer, loc).view(torch.uint8)]
        reads.append(pool.get_index_k_scale(layer, loc))
    return reads, pool.kv_buffer + pool.index_k_with_scale_buffer


def _swa_round_trip(pools: Any) -> tuple[list[Tensor], list[Tensor]]:
    pool, alloc = pools.kv_pool, pools.allocator
    loc = alloc.alloc_extend(torch.tensor([0]), torch.tensor([6]), torch.tensor([-1]), 6)
    reads = []
    for layer in sorted(pool.layers_mapping):
        pool.set_kv_buffer(layer, loc, _random(6, 8, 64, seed=layer), _random(6, 8, 64, seed=-layer))
        reads += pool.get_kv(layer, loc)
    full, swa = pool.full_kv_pool, pool.swa_kv_pool
    return reads, full.k_buffer + full.v_buffer + swa.k_buffer + swa.v_buffer


CPU_CASES: dict[str, tuple[Callable[[], Plan], Callable[[Any], tuple[list[Tensor], list[Tensor]]]]] = {
    "mha-bf16": (build_small_plan, _mha_round_trip),
    "mha-fp4_e2m1": (lambda: build_small_plan(kv_cache_dtype="fp4_e2m1"), _mha_round_trip),
    "mla-bf16": (lambda: _small_mla("bf16"), _mla_round_trip),
    "mla-fp8_e4m3": (lambda: _small_mla("fp8_e4m3"), _mla_round_trip),
    "mla-fp4_e2m1": (lambda: _small_mla("fp4_e2m1"), _mla_round_trip),
    "dsa-fp8_e4m3": (_small_dsa, _dsa_round_trip),
    "swa-fp8_e4m3": (_swa, _swa_round_trip),
}


@pytest.mark.parametrize("case", CPU_CASES)
def test_layer_major_reads_back_bit_for_bit_what_per_layer_does(case: str) -> None:
    make_plan, round_trip = CPU_CASES[case]
    planned = make_plan()
    layout = RecordingLayout()
    per_layer, layer_major = build(planned, "cpu"), build(planned, "cpu", registry=platform_registry(layout))
    assert per_layer.layout is PER_LAYER and layer_major.layout is layout
    assert layer_major.allocated_by_pool() == per_layer.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    expected, plain_buffers = round_trip(per_layer)
    got, major_buffers = round_trip(layer_major)
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype and torch.equal(_raw(a), _raw(b))
    for a, b in zip(major_buffers, plain_buffers, strict=True):  # the stored bytes, padding page and all
        assert torch.equal(_raw(a), _raw(b))
    # per layer: one tensor each; layer-major: one tensor per request, the layers' buffers are views of it
    assert len({t.untyped_storage().data_ptr() for t in plain_buffers}) == len(plain_buffers)
    storages = []
    for request, views in layout.allocated:
        assert len({v.untyped_storage().data_ptr() for v in views}) == 1, request.describe()
        assert views[0]._base is not None and views[0].untyped_storage().nbytes() == request.nbytes
        storages.append(views[0].untyped_storage().data_ptr())
    assert len(set(storages)) == len(storages)  # one tensor per request, none shared between requests
    viewed = {id(v) for _, views in layout.allocated for v in views}
    assert all(id(t) in viewed for t in major_buffers if t.shape[0])  # the stores keep the layout's views


# -- refusals ------------------------------------------------------------------


class PaddedLayout(LayerMajorLayout):
    """A layout that would pad each request by one page of rows: bytes the plan never charged."""

    name = "padded_pages"

    def __init__(self) -> None:
        self.calls = 0

    def nbytes(self, request: BufferRequest) -> int:
        return request.nbytes + request.page_size * request.layer_nbytes // max(request.rows, 1)

    def allocate(self, request: BufferRequest) -> list[Tensor]:
        self.calls += 1
        return super().allocate(request)


@pytest.mark.parametrize("case", ["mha-bf16", "mla-fp4_e2m1", "dsa-fp8_e4m3", "swa-fp8_e4m3"])
def test_a_layout_that_changes_the_bytes_is_refused_before_allocating(case: str) -> None:
    planned = CPU_CASES[case][0]()
    layout = PaddedLayout()
    with pytest.raises(PoolPlanMismatchError, match=r"pool would allocate \d+ B for its '\w+' buffers") as info:
        build(planned, "cpu", registry=platform_registry(layout))
    assert "'padded_pages' (tests.pools.test_buffer_layout.PaddedLayout)" in str(info.value)
    assert any(f"The {p.name!r} pool" in str(info.value) for p in planned.pools)
    assert layout.calls == 0  # not one tensor


def test_the_refusal_comes_before_the_draft_pool_is_allocated() -> None:
    planned = build_small_plan(speculative_algorithm="EAGLE", speculative_draft_num_layers=1)
    assert any(p.name == "draft_kv" for p in planned.pools)
    layout = PaddedLayout()
    with pytest.raises(PoolPlanMismatchError, match="'padded_pages'"):
        MHATokenToKVPool.from_plan(planned, "cpu", layout=layout)
    assert layout.calls == 0


class _Wrong(BufferLayout):
    name = "wrong"

    def __init__(self, answer: Callable[[BufferRequest], Any]) -> None:
        self.answer = answer

    def allocate(self, request: BufferRequest) -> Any:
        return self.answer(request)


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (lambda r: allocate(r.shape, r.dtype, r.device), "a Tensor, not a list of tensors"),
        (lambda r: [allocate(r.shape, r.dtype, r.device)], r"1 buffer\(s\) for 4 layer\(s\)"),
        (lambda r: [allocate((r.rows + 1, *r.row_shape), r.dtype, r.device)] * 4, r"a \(\d+, 4, 64\)"),
        (lambda r: [allocate(r.shape, torch.float32, r.device) for _ in r.layers], "torch.float32 buffer"),
        (lambda r: [allocate(r.shape, r.dtype, "meta") for _ in r.layers], "a buffer on meta"),
        (lambda r: [allocate(r.shape, r.dtype, r.device)] * 4, "overlapping buffers for layers 0 and 1"),
        (lambda r: 1 / 0, "failed to allocate .* ZeroDivisionError"),
    ],
)
def test_what_a_layout_returns_is_checked(answer: Callable[[BufferRequest], Any], problem: str) -> None:
    with pytest.raises(BufferLayoutError, match=rf"Buffer layout 'wrong' \(tests\..*_Wrong\).*{problem}"):
        build(build_small_plan(), "cpu", registry=platform_registry(_Wrong(answer)))


def test_a_plugin_answering_garbage_for_buffer_layout_is_named() -> None:
    @hookimpl(tryfirst=True)
    def buffer_layout(plan: Plan, device: str) -> Any:
        return "layer_major"

    with pytest.raises(PluginResultError, match=r'"garbage" \(<in-process> -\).*\bbuffer_layout\b') as info:
        build(build_small_plan(), "meta", registry=_registry("garbage", buffer_layout))
    assert "str 'layer_major': not a BufferLayout" in str(info.value)

    nameless = LayerMajorLayout()
    nameless.name = ""

    @hookimpl(tryfirst=True)
    def buffer_layout_nameless(plan: Plan, device: str) -> Any:
        return nameless

    buffer_layout_nameless.__name__ = "buffer_layout"
    with pytest.raises(PluginResultError, match=r'"nameless".*buffer_layout.*its name is'):
        build(build_small_plan(), "meta", registry=_registry("nameless", buffer_layout_nameless))


def test_a_build_pool_without_the_layout_argument_still_builds() -> None:
    """pluggy passes only the arguments an implementation names: third-party ``build_pool``s keep working."""

    @hookimpl(tryfirst=True)
    def build_pool(plan: Plan, device: str) -> Any:
        return MHATokenToKVPool.from_plan(plan, device)

    planned = build_small_plan()
    pools = build(planned, "meta", registry=_registry("old_builder", build_pool))
    assert pools.provenance["build_pool"] == ("old_builder",)
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}


def test_a_buffer_request_is_typed_data() -> None:
    request = BufferRequest(
        pool="kv",
        role="k",
        rows=17,
        page_size=16,
        layers=range(2),
        row_shape=[4, 64],
        dtype=torch.bfloat16,
        device="cpu",
    )
    assert request.layers == (0, 1) and request.shape == (17, 4, 64) and request.device == torch.device("cpu")
    assert request.nbytes == 2 * 17 * 4 * 64 * 2 and LAYER_MAJOR.nbytes(request) == request.nbytes
    with pytest.raises(KvpoolsError, match="rows and row_shape must be integers >= 0"):
        BufferRequest(
            pool="kv", role="k", rows=-1, page_size=1, layers=(), row_shape=(), dtype=torch.uint8, device="cpu"
        )
    with pytest.raises(KvpoolsError, match="page_size must be a positive integer"):
        BufferRequest(
            pool="kv", role="k", rows=1, page_size=0, layers=(), row_shape=(), dtype=torch.uint8, device="cpu"
        )


# -- column groups: a layout may store a grouped row as one tensor per group ------


def _grouped(rows: int = 8, layers: int = 2, device: str = "cpu") -> BufferRequest:
    """An MLA latent request (``nope`` 12 + ``rope`` 4 columns of bf16), as ``MLATokenToKVPool`` declares it."""
    return BufferRequest(
        pool="kv",
        role="latent",
        rows=rows,
        page_size=4,
        layers=range(layers),
        row_shape=(1, 16),
        dtype=torch.bfloat16,
        device=device,
        column_groups=(("nope", 12), ("rope", 4)),
    )


def test_column_groups_are_checked_and_give_each_group_its_shape() -> None:
    request = _grouped()
    assert request.column_groups == (("nope", 12), ("rope", 4))
    assert request.group_shapes == ((8, 1, 12), (8, 1, 4)) and request.nbytes == 2 * 8 * 16 * 2
    base = dict(pool="kv", role="latent", rows=8, page_size=4, layers=(0,), dtype=torch.bfloat16, device="cpu")
    for shape, groups, problem in [
        ((1, 16), (("nope", 12), ("rope", 5)), "widths sum to 17"),
        ((1, 16), (("nope", 12), ("nope", 4)), "distinct non-empty names"),
        ((1, 16), (("nope", 16), ("rope", 0)), "integers >= 1"),
        ((), (("nope", 1),), "must split the last dimension"),
    ]:
        with pytest.raises(KvpoolsError, match=problem):
            BufferRequest(row_shape=shape, column_groups=groups, **base)  # type: ignore[arg-type]


def test_page_major_splits_grouped_requests_and_pages_the_rest() -> None:
    """SGLang NPU: ``k_buffer (L, S//P + 1, P, 1, R)`` and ``v_buffer (L, S//P + 1, P, 1, r)`` (§3.3)."""
    layout = PageMajorLayout()
    split = allocate_layer_buffers(layout, _grouped())
    assert all(isinstance(layer, tuple) and len(layer) == 2 for layer in split)
    nope, rope = zip(*split, strict=True)
    assert [tuple(t.shape) for t in nope] == [(8, 1, 12)] * 2 and [tuple(t.shape) for t in rope] == [(8, 1, 4)] * 2
    assert tuple(nope[0]._base.shape) == (2, 2, 4, 1, 12) and tuple(rope[1]._base.shape) == (2, 2, 4, 1, 4)
    assert nope[0]._base is nope[1]._base and nope[0]._base is not rope[0]._base
    whole = allocate_buffers(layout, attrs.evolve(_grouped(), column_groups=()))  # no groups: one view per layer
    assert [tuple(t.shape) for t in whole] == [(8, 1, 16)] * 2 and tuple(whole[0]._base.shape) == (2, 2, 4, 1, 16)
    unpaged = allocate_page_major(attrs.evolve(_grouped(rows=6), column_groups=()))  # rows that are not whole pages
    assert tuple(unpaged[0]._base.shape) == (2, 6, 1, 16)
    assert allocate_page_major(_grouped(), split_columns=False)[0]._base.shape == (2, 2, 4, 1, 16)


def test_a_split_is_refused_where_the_store_reads_whole_rows() -> None:
    with pytest.raises(BufferLayoutError, match=r"split the 'latent' buffers .* allocate_split_by_layer"):
        allocate_buffers(PageMajorLayout(), _grouped())
    assert set(allocate_split_by_layer(PageMajorLayout(), [_grouped()])["latent"]) == {0, 1}


def _split_of(request: BufferRequest, widths: Sequence[int]) -> tuple[Tensor, ...]:
    return tuple(allocate((request.rows, 1, w), request.dtype, request.device) for w in widths)


def _aliased_split(request: BufferRequest) -> tuple[Tensor, ...]:
    """A split whose rope is the first columns of its nope: writes to one would overwrite the other."""
    nope = allocate((request.rows, 1, 12), request.dtype, request.device)
    return nope, nope[..., :4]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (lambda r: [_split_of(r, (12, 4)) for _ in r.layers], None),
        (lambda r: [_split_of(r, (12, 4)), allocate(r.shape, r.dtype, r.device)], "a column split for some layers"),
        (lambda r: [_split_of(r, (16,)) for _ in r.layers], r"a split of 1 tensor\(s\) for layer 0"),
        (lambda r: [_split_of(r, (4, 12)) for _ in r.layers], r"a \(8, 1, 4\) torch.bfloat16 buffer for layer 0"),
        (lambda r: [_split_of(r, (12, 4))] * 2, "overlapping buffers for layers 0 and 1"),
        (lambda r: [_aliased_split(r) for _ in r.layers], "buffers that share memory"),
    ],
)
def test_what_a_splitting_layout_returns_is_checked(
    answer: Callable[[BufferRequest], Any], problem: str | None
) -> None:
    layout, request = _Wrong(answer), _grouped()
    if problem is None:
        assert len(allocate_layer_buffers(layout, request)) == 2
        return
    with pytest.raises(BufferLayoutError, match=rf"'wrong' .*{problem}.*or \(all layers\) a split of"):
        allocate_layer_buffers(layout, request)


def test_a_request_without_groups_is_never_split() -> None:
    request = attrs.evolve(_grouped(), column_groups=())
    with pytest.raises(BufferLayoutError, match=r"a column split .* for a request without column groups"):
        allocate_layer_buffers(_Wrong(lambda r: [_split_of(r, (12, 4)) for _ in r.layers]), request)


class SplittingLayout(PageMajorLayout):
    """A stand-in platform's page-major layout that splits the stores' grouped rows (SGLang NPU's carving)."""

    name = "npu_like"

    def __init__(self) -> None:
        self.allocated: list[tuple[BufferRequest, list[Any]]] = []

    def allocate(self, request: BufferRequest) -> list[Any]:
        buffers = super().allocate(request)
        self.allocated.append((request, buffers))
        return buffers


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_builds_page_major_and_split_on_meta_with_the_planned_bytes(preset: str) -> None:
    planned = None
    for serving in (Serving(page_size=64), _servings()[-1]):  # DeepSeek-V4 pages by 256
        try:
            planned = plan(preset, serving, memory="20GiB")
            break
        except KvpoolsError:
            continue
    assert planned is not None
    layout = SplittingLayout()
    pools = build(planned, "meta", registry=platform_registry(layout))
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    for request, buffers in layout.allocated:
        if request.column_groups:  # the MLA stores' plain rows: split, as SGLang NPU's k_buffer / v_buffer
            assert request.role == "latent" and [name for name, _ in request.column_groups] == ["nope", "rope"]
            assert all(tuple(tuple(t.shape) for t in b) == request.group_shapes for b in buffers)
        else:
            assert all(tuple(b.shape) == request.shape for b in buffers)


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_a_split_mla_store_reads_back_bit_for_bit_what_a_whole_row_store_does(kv: str) -> None:
    planned = _small_mla(kv)
    whole, split = build(planned, "cpu"), build(planned, "cpu", registry=platform_registry(SplittingLayout()))
    a, b = whole.kv_pool, split.kv_pool
    assert not a.split and b.split and b.kv_buffer == [] and len(b.nope_buffer) == len(b.rope_buffer) == 3
    assert split.allocated_by_pool() == whole.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    loc = _slots(a)
    for layer in range(3):
        rows = _random(8, 1, 48, seed=layer)
        nope, rope = _random(8, 1, 32, seed=10 + layer), _random(8, 1, 16, seed=20 + layer).float()
        for pool in (a, b):
            pool.set_kv_buffer(layer, loc, rows)
            pool.set_mla_kv_buffer(layer, loc + 1, nope, rope)  # the rope cast as the whole-row path casts it
        for x, y in zip((*a.get_mla_kv(layer, loc), *a.get_mla_kv(layer, loc + 1)),
                        (*b.get_mla_kv(layer, loc), *b.get_mla_kv(layer, loc + 1)), strict=True):  # fmt: skip
            assert x.dtype == y.dtype and torch.equal(_raw(x), _raw(y))
        # the stored bytes, padding page and all; the whole row of a split store is a concatenated copy
        assert torch.equal(_raw(b.get_key_buffer(layer)), _raw(a.get_key_buffer(layer)))
        assert torch.equal(_raw(b.get_value_buffer(layer)), _raw(a.get_value_buffer(layer)))
        got, expected = b.get_nope_rope_buffers(layer), a.get_nope_rope_buffers(layer)
        assert all(torch.equal(_raw(x), _raw(y)) for x, y in zip(got, expected, strict=True))
        assert got[0].untyped_storage().data_ptr() == b.nope_buffer[layer].untyped_storage().data_ptr()
    b.get_nope_rope_buffers(0)[1][loc[0]] = 0  # the parts are views: a write through them is stored
    assert not b.get_mla_kv(0, loc[:1])[1].any()


def test_rows_with_scales_or_packed_are_never_grouped() -> None:
    """fp4 rows (packed pairs + scales) and DSA's packed fp8 row have no latent / rope columns to split."""
    for planned in (_small_mla("fp4_e2m1"), _small_dsa()):
        layout = SplittingLayout()
        pools = build(planned, "cpu", registry=platform_registry(layout))
        assert not any(request.column_groups for request, _ in layout.allocated) and not pools.kv_pool.split
        with pytest.raises(ValueError, match="no separate latent and rope columns"):
            pools.kv_pool.get_nope_rope_buffers(0)


# -- row-indexed buffers: rows permuted within a native tensor, for stores that read rows by index ------


def _reversed_rows(request: BufferRequest, *, rows: int | None = None, dtype: torch.dtype | None = None) -> Any:
    """A layer's rows stored last-first: row ``r`` is ``native[rows - 1 - r]`` (no tensor view reverses rows)."""
    total = request.rows if rows is None else rows
    native = allocate((total, *request.row_shape), dtype or request.dtype, request.device)
    return RowIndexedBuffer(native, request.shape, lambda r: (total - 1 - r,), request.row_shape)


class RowReversingLayout(BufferLayout):
    """A toy platform layout: every ``row_indexed_ok`` request's rows reversed per layer, the rest per layer."""

    name = "row_reversing"

    def allocate(self, request: BufferRequest) -> list[Any]:
        if not request.row_indexed_ok:
            return list(PER_LAYER.allocate(request))
        return [_reversed_rows(request) for _ in request.layers]


def _native(buffers: Sequence[Any]) -> list[Tensor]:
    return [b.native if isinstance(b, RowIndexedBuffer) else b for b in buffers]


@pytest.mark.parametrize("case", ["mha-bf16", "mha-fp4_e2m1", "swa-fp8_e4m3", "mla-bf16"])
def test_a_row_indexed_layout_serves_the_k_v_stores_and_reads_back_what_per_layer_does(case: str) -> None:
    """K / V (``row_indexed_ok``) get row-indexed buffers; scales and the MLA latent (not ok) get views."""
    make_plan, round_trip = CPU_CASES[case]
    planned = make_plan()
    per_layer, reversing = (
        build(planned, "cpu"),
        build(planned, "cpu", registry=platform_registry(RowReversingLayout())),
    )
    assert reversing.allocated_by_pool() == per_layer.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    expected, plain_buffers = round_trip(per_layer)
    got, reversed_buffers = round_trip(reversing)
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype and torch.equal(_raw(a), _raw(b))
    row_indexed = [b for b in reversed_buffers if isinstance(b, RowIndexedBuffer)]
    assert len(row_indexed) == (0 if case.startswith("mla") else len(planned_kv_buffers(per_layer)))
    for a, b in zip(_native(reversed_buffers), plain_buffers, strict=True):  # the same bytes, rows last-first
        assert torch.equal(_raw(a.flip(0) if any(a is r.native for r in row_indexed) else a), _raw(b))
    if case == "mha-fp4_e2m1":
        assert reversing.kv_pool.kv.k_scale_buffer and all(
            type(t) is Tensor for t in reversing.kv_pool.kv.k_scale_buffer
        )


def planned_kv_buffers(pools: Any) -> list[Tensor]:
    """The K / V buffers of an MHA or SWA pool (not the scales)."""
    kv = pools.kv_pool
    stores = [kv.kv] if hasattr(kv, "kv") else [s for s in (kv.full_kv_pool, kv.swa_kv_pool) if s is not None]
    return [t for store in stores for t in (*store.k_buffer, *store.v_buffer)]


def test_get_key_buffer_returns_the_native_tensor_kernels_read() -> None:
    pools = build(build_small_plan(kv_cache_dtype="fp8_e4m3"), "cpu", registry=platform_registry(RowReversingLayout()))
    kv = pools.kv_pool.kv
    assert isinstance(kv.k_buffer[0], RowIndexedBuffer)
    key = pools.kv_pool.get_key_buffer(0)
    assert key.dtype == torch.float8_e4m3fn and key.data_ptr() == kv.k_buffer[0].native.data_ptr()


def test_the_default_layout_keeps_plain_tensors_and_marks_only_k_v_row_indexed() -> None:
    pools = build(build_small_plan(kv_cache_dtype="fp4_e2m1"), "cpu")
    kv = pools.kv_pool.kv
    assert all(type(t) is Tensor for t in (*kv.k_buffer, *kv.v_buffer, *kv.k_scale_buffer, *kv.v_scale_buffer))
    requests = kv.buffer_requests(
        name="kv", rows=kv.rows, layers=kv.layers, start_layer=0, codec=kv.codec, device="cpu", page_size=16
    )
    assert {(r.role, r.row_indexed_ok) for r in requests} == {
        ("k", True),
        ("v", True),
        ("k_scale", False),
        ("v_scale", False),
    }


@pytest.mark.parametrize(
    ("make_plan", "role"),
    [(lambda: build_small_plan(kv_cache_dtype="fp4_e2m1"), "k_scale"), (lambda: _small_mla("bf16"), "latent")],
)
def test_a_row_indexed_buffer_is_refused_for_requests_that_read_views(make_plan: Callable[[], Plan], role: str) -> None:
    everything = _Wrong(lambda r: [_reversed_rows(r) for _ in r.layers])
    with pytest.raises(
        BufferLayoutError, match=rf"a row-indexed buffer for layer 0, whose store reads views.*'{role}'"
    ):
        build(make_plan(), "cpu", registry=platform_registry(everything))


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (lambda r: [_reversed_rows(r, rows=r.rows + 1) for _ in r.layers], r"native \(\d+, 4, 64\) tensor holds"),
        (lambda r: [_reversed_rows(r, dtype=torch.float16) for _ in r.layers], "row-indexed .* torch.float16 buffer"),
        (
            lambda r: [
                RowIndexedBuffer(
                    allocate((r.rows - 1, *r.row_shape), r.dtype, r.device),
                    (r.rows - 1, *r.row_shape),
                    lambda x: (x,),
                    r.row_shape,
                )
                for _ in r.layers
            ],
            r"row-indexed \(\d+, 4, 64\) torch.bfloat16 buffer for layer 0",
        ),
        (lambda r: [_reversed_rows(r)] * r.num_layers, "overlapping buffers for layers 0 and 1"),
    ],
)
def test_what_a_row_indexed_layout_returns_is_checked(answer: Callable[[BufferRequest], Any], problem: str) -> None:
    with pytest.raises(BufferLayoutError, match=rf"Buffer layout 'wrong' .*{problem}.*or a RowIndexedBuffer"):
        build(build_small_plan(), "cpu", registry=platform_registry(_Wrong(answer)))


def _row_request(**changes: Any) -> BufferRequest:
    request = BufferRequest(
        pool="kv",
        role="k",
        rows=8,
        page_size=4,
        layers=(0, 1),
        row_shape=(2, 4),
        dtype=torch.bfloat16,
        device="cpu",
        row_indexed_ok=True,
    )
    return attrs.evolve(request, **changes)


def test_row_indexed_buffers_go_only_to_stores_that_read_rows() -> None:
    request = _row_request()
    with pytest.raises(BufferLayoutError, match=r"returned row-indexed buffers .* allocate_rows_by_layer"):
        allocate_buffers(RowReversingLayout(), request)
    with pytest.raises(BufferLayoutError, match=r"reads views and column splits: allocate it with allocate_rows"):
        allocate_split_by_layer(RowReversingLayout(), [request])
    rows = allocate_rows_by_layer(RowReversingLayout(), [request, _row_request(role="k_scale", row_indexed_ok=False)])
    assert all(isinstance(b, RowIndexedBuffer) for b in rows["k"].values())
    assert all(type(b) is Tensor for b in rows["k_scale"].values())
    with pytest.raises(KvpoolsError, match="row_indexed_ok must be a bool"):
        _row_request(row_indexed_ok="yes")


def test_a_row_indexed_buffer_indexes_like_a_tensor() -> None:
    """Reads gather canonical rows, writes scatter them, whatever the index; ``view`` keeps the row order."""
    buffer = _reversed_rows(_row_request())
    canonical = torch.arange(8 * 2 * 4, dtype=torch.bfloat16).reshape(8, 2, 4)
    buffer[torch.arange(8)] = canonical
    assert torch.equal(buffer.native, canonical.flip(0))  # row r stored at native[7 - r]
    assert torch.equal(buffer[3], canonical[3]) and torch.equal(buffer[2:5], canonical[2:5])
    mask = torch.tensor([True, False] * 4)
    assert torch.equal(buffer[mask], canonical[mask])
    assert torch.equal(buffer[torch.tensor([[1, 6], [0, 7]])], canonical[torch.tensor([[1, 6], [0, 7]])])
    buffer[torch.tensor([5])] = 0.0  # broadcast, like a tensor
    assert not buffer.native[2].any() and buffer.native[1].all()
    as_int = buffer.view(torch.int16)
    assert isinstance(as_int, RowIndexedBuffer) and torch.equal(as_int[6], canonical[6].view(torch.int16))
    assert (buffer.shape, buffer.nbytes, buffer.numel(), buffer.element_size()) == ((8, 2, 4), 128, 64, 2)
    with pytest.raises(KvpoolsError, match=r"view\(torch.float32\).* same size \(2 B\)"):
        buffer.view(torch.float32)
    with pytest.raises(KvpoolsError, match=r"native rows of \(3,\) do not hold canonical rows of \(2, 4\)"):
        RowIndexedBuffer(buffer.native, (8, 2, 4), lambda r: (r,), (3,))
