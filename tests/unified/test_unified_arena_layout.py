"""The arena through the platform's buffer layout (issue 31): ``build_arena`` asks ``buffer_layout`` as every build
does, and the layout carves each sub-pool's views from the one ``uint8`` arena (``BufferLayout.carve_arena``).

SGLang 0.5.23 builds the same token-major ``UnifiedKVPool`` on every in-tree platform: ``kv_cache_configurator.py``
``_init_pools`` refuses only an out-of-tree platform (``reject_out_of_tree_path``), and
``UnifiedMHATokenToKVPool.__init__`` passes ``kv_cache_layout="page_major"``, which ``MHATokenToKVPool`` lets
"win over the platform default" (``memory_pool.py``: the AITER ``vectorized_5d`` branch and HND are skipped).  So
the ascend and rocm layouts keep the core's carving, and only the build's provenance says they were asked.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import Tensor

import kvpools_core as kv
import kvpools_core.cli as cli
from kvpools_core import Registry, hookimpl
from kvpools_core.errors import BufferLayoutError
from kvpools_core.pools.arena_carving import ArenaRequest, carve_token_major
from kvpools_core.pools.layout import PER_LAYER, BufferLayout, PerLayerLayout
from kvpools_core.values import Plan, Serving
from tests.unified.peer import Peer

QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"
ROCM_5D = {"rocm.kv_cache_layout": "vectorized_5d"}


def _plan(model: str, memory: str, registry: Registry | None = None, **serving: Any) -> Plan:
    return kv.plan(model, Serving(enable_unified_memory=True, **serving), memory=memory, registry=registry)


PLATFORMS = [
    ("cpu", {}, None),
    ("cuda", {}, None),
    ("rocm", {}, None),
    ("rocm", {"plugin_options": ROCM_5D, "page_size": 16}, "rocm"),
    ("ascend", {"page_size": 128}, "ascend"),
]


@pytest.mark.parametrize(("platform", "extra", "chooser"), PLATFORMS)
@pytest.mark.parametrize(
    ("model", "serving", "memory"), [(QWEN3_NEXT, {"tp_size": 4}, "20GiB"), ("gpt-oss-20b", {}, "60GiB")]
)
def test_every_platform_builds_the_arena_on_meta_to_the_byte(
    platform: str, extra: dict[str, Any], chooser: str | None, model: str, serving: dict[str, Any], memory: str
) -> None:
    """Per platform: the layout its plugin answers carves the arena, and every pool measures the plan's bytes."""
    p = _plan(model, memory, platform=platform, **{**serving, **extra})
    pools = kv.build(p, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools if pool.arena is None}
    assert pools.allocated_bytes == p.planned_bytes
    assert pools.kv_pool.nbytes == p.sizing.arenas[0].bytes
    assert pools.provenance.get("buffer_layout") == (None if chooser is None else (chooser,))
    assert pools.kv_pool.layout is pools.layout


@pytest.mark.parametrize(
    ("platform", "extra"), [("ascend", ["--page-size", "128"]), ("cpu", []), ("cuda", []), ("rocm", [])]
)
def test_build_cli_on_meta_per_platform(platform: str, extra: list[str]) -> None:
    args = [*("build", QWEN3_NEXT, "--tp-size", "4", "--memory", "20GiB", "--enable-unified-memory"), *extra]
    result = CliRunner().invoke(cli.main, [*args, "--platform", platform, "--device", "meta", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["matches_plan"] is True and data["allocated_bytes"] == data["planned_bytes"]


def test_the_state_views_are_part_major() -> None:
    """Qwen3-Next at TP 4 (``plugins/mamba/state.py``: GDN conv ``(2,048, 3)`` bf16 = 12,288 B, temporal
    ``(8, 128, 128)`` fp32 = 524,288 B, 36 state layers on the rank): a 19,316,736 B entry in which layer 5's conv
    row lies at 5 x 12,288 = 61,440 and its temporal row at 36 x 12,288 + 5 x 524,288 = 3,063,808
    (``build_mamba_entry_views``: ``[conv[0] x L | temporal x L]``).  Before issue 31's fix the state was one
    opaque 536,576 B row per layer at ``5 x 536,576``."""
    p = _plan(QWEN3_NEXT, "3GiB", tp_size=4, page_size=16)
    sub = p.sizing.arenas[0].sub_pool("mamba_state")
    assert (sub.entry_bytes, sub.layer_num, sub.row_bytes, sub.row_order) == (19_316_736, 36, (12_288, 524_288), "part")
    conv, temporal = kv.build(p, "meta").kv_pool.layer_views("mamba_state", 5)
    assert [_geo(conv), _geo(temporal)] == [[61_440, sub.max_slots, 19_316_736], [3_063_808, sub.max_slots, 19_316_736]]
    assert (conv.shape[1], temporal.shape[1]) == (12_288, 524_288)


def test_arena_rows_are_checked() -> None:
    """A part-major row order is a state entry's only, and rows must fit the entry (the values' contract)."""
    from kvpools_core.errors import InvalidValueError
    from kvpools_core.values import ArenaSubPool

    base = {"pool": "s", "entry_bytes": 64, "page_size": 1, "max_slots": 4, "min_slot_index": 1, "grows": "up"}
    part = ArenaSubPool(kind="state", layer_num=2, row_bytes=(8, 24), row_order="part", **base)
    layer = ArenaSubPool(kind="kv", layer_num=2, row_bytes=(8, 24), **base)
    # part-major [a0 a1 | b0 b1]: a1 at 8, b0 at 16, b1 at 40; layer-major [a0 b0 | a1 b1]: b0 at 8, a1 at 32
    assert [part.row_offset(1, 0), part.row_offset(0, 1), part.row_offset(1, 1)] == [8, 16, 40]
    assert [layer.row_offset(1, 0), layer.row_offset(0, 1), layer.row_offset(1, 1)] == [32, 8, 40]
    with pytest.raises(InvalidValueError, match="row_order 'part'"):
        ArenaSubPool(kind="kv", layer_num=2, row_bytes=(8, 24), row_order="part", **base)
    with pytest.raises(InvalidValueError, match="more than the entry's 64 B"):
        ArenaSubPool(kind="state", layer_num=3, row_bytes=(8, 24), row_order="part", **base)


def test_ascend_carves_the_arena_as_sglangs_npu_does() -> None:
    """On ``ascend`` (a CPU build of an ascend plan) the views are SGLang's token-major ones, not the NPU's
    page-major ``(layers, pages, page, heads, dim)`` pools: slot ``s`` of layer ``l``'s V row of gpt-oss-20b at
    ``s x 24,576 + l x 2,048 + 1,024`` (12 layers of K and V rows of 8 heads x 64 x 2 B)."""
    from kvpools_ascend.layouts import ASCEND_LAYOUT

    pools = kv.build(_plan("gpt-oss-20b", "1GiB", platform="ascend", page_size=128), "cpu")
    arena = pools.kv_pool
    assert arena.layout is ASCEND_LAYOUT and pools.provenance["buffer_layout"] == ("ascend",)
    _, v = arena.layer_views("kv_full", 3)
    assert v[5].data_ptr() - arena.buffer.data_ptr() == 5 * 24_576 + 3 * 2_048 + 1_024
    assert v.stride() == (24_576, 1)


class _ReversedLayers(PerLayerLayout):
    """A platform carving of its own: each slot's entry holds the layers in reverse order."""

    name = "reversed_layers"

    def carve_arena(self, request: ArenaRequest) -> list[list[Tensor]]:
        views = carve_token_major(request)
        return views[::-1]


class _Defect(PerLayerLayout):
    name = "defect"

    def __init__(self, defect: str) -> None:
        self.defect = defect

    def carve_arena(self, request: ArenaRequest) -> list[list[Tensor]]:
        views = carve_token_major(request)
        if self.defect == "fresh":
            return [[torch.zeros_like(v) for v in layer] for layer in views]
        if self.defect == "missing_layer":
            return views[1:]
        if self.defect == "short":
            return [[v[:-1] for v in layer] for layer in views]
        if self.defect == "wide":
            return [[v.view(torch.int8) for v in layer] for layer in views]
        raise RuntimeError("kaput")


def _registry(layout: BufferLayout) -> Registry:
    @hookimpl(tryfirst=True)
    def buffer_layout(plan: Plan, device: str) -> BufferLayout | None:
        return layout

    module = types.ModuleType("vendor_plugin")
    module.buffer_layout = buffer_layout  # type: ignore[attr-defined]
    return Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"vendor": module})


def test_a_platform_carving_decides_the_views() -> None:
    """A layout that overrides ``carve_arena`` is asked (before the fix the core carved every arena itself)."""
    registry = _registry(_ReversedLayers())
    p = _plan("gpt-oss-20b", "1GiB", registry)
    pools = kv.build(p, "cpu", registry=registry)
    arena = pools.kv_pool
    k, _ = arena.layer_views("kv_full", 0)
    assert k[2].data_ptr() - arena.buffer.data_ptr() == 2 * 24_576 + 11 * 2_048  # layer 0 is the entry's last
    assert pools.provenance["buffer_layout"] == ("vendor",)
    assert kv.build(p, "meta", registry=registry).allocated_bytes == p.planned_bytes


@pytest.mark.parametrize(
    ("defect", "device", "message"),
    [
        ("fresh", "cpu", "a view of other memory than the arena's buffer"),
        ("missing_layer", "meta", "11 layer(s) for 12"),
        ("short", "meta", "a (6302, 1024) view, not 6303 rows of 1024 B"),  # one row short of the sub-pool's
        ("wide", "meta", "not a uint8 view"),
        ("raise", "meta", "failed to carve the sub-pool 'kv_full' of arena 'unified_arena'"),
    ],
)
def test_a_platform_carving_is_checked(defect: str, device: str, message: str) -> None:
    registry = _registry(_Defect(defect))
    p = _plan("gpt-oss-20b", "1GiB", registry)
    with pytest.raises(BufferLayoutError, match="defect") as info:
        kv.build(p, device, registry=registry)
    assert message in str(info.value), str(info.value)


def test_the_core_carving_is_the_default_of_every_layout() -> None:
    """``PER_LAYER`` (the core's answer) and a layout that does not override ``carve_arena`` carve alike."""
    pools = kv.build(_plan("gpt-oss-20b", "1GiB"), "meta")
    assert pools.layout is PER_LAYER and "buffer_layout" not in pools.provenance


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


def _geo(view: Tensor) -> list[int]:
    return [view.storage_offset() * view.element_size(), view.shape[0], view.stride(0) * view.element_size()]


@pytest.mark.parametrize(
    ("model", "serving", "memory", "specs", "pools"),
    [
        (
            QWEN3_NEXT,
            {"tp_size": 4, "page_size": 16},
            "3GiB",
            [
                {"kind": "mha", "name": "full", "grow": "down", "layers": 12, "heads": 1, "head_dim": 256},
                {
                    "kind": "mamba",
                    "name": "mamba",
                    "grow": "up",
                    "layers": 36,
                    "conv": [[2048, 3]],
                    "temporal": [8, 128, 128],
                },
            ],
            ("kv", "mamba_state"),
        ),
        (
            "gpt-oss-20b",
            {"page_size": 64},
            "2GiB",
            [
                {"kind": "mha", "name": "full", "grow": "down", "layers": 12, "heads": 8, "head_dim": 64},
                {"kind": "mha", "name": "swa", "grow": "up", "layers": 12, "heads": 8, "head_dim": 64},
            ],
            ("kv_full", "kv_swa"),
        ),
        (  # the tri-pool; Inkling's short-conv state (InklingModelConfig: six (3, width) bf16 windows, no temporal)
            "inkling-defaults",
            {},
            "2GiB",
            [
                {"kind": "mha", "name": "full", "grow": "down", "layers": 4, "heads": 4, "head_dim": 128},
                {"kind": "mha", "name": "swa", "grow": "float", "layers": 12, "heads": 4, "head_dim": 128},
                {
                    "kind": "mamba",
                    "name": "mamba",
                    "grow": "up",
                    "layers": 16,
                    "conv": [[3, 512]] * 4 + [[3, 1_536]] * 2,
                    "temporal": [0, 0, 0],
                },
            ],
            ("kv_full", "kv_swa", "mamba_state"),
        ),
    ],
)
def test_the_core_carving_is_sglangs_views(
    peer: Peer, model: str, serving: dict[str, Any], memory: str, specs: list[dict[str, Any]], pools: tuple[str, ...]
) -> None:
    """Every view of the core's carving starts at the byte, strides by the entry and spans the rows of SGLang
    0.5.23's ``UnifiedKVPool`` views for the same arena (``build_dense_views``: ``max_slots // page x page`` rows),
    built on ``meta`` in the peers venv; a state sub-pool's views are SGLang's part-major ones
    (``build_mamba_entry_views``: each conv tensor's and the temporal state's row of every layer, with its bytes)."""
    p = _plan(model, memory, **serving)
    (arena,) = p.sizing.arenas
    reply = peer.call("views", total=arena.bytes, page=p.serving.page_size, specs=specs)
    ours = kv.build(p, "meta").kv_pool
    for spec, pool in zip(specs, pools, strict=True):
        width = [] if spec["kind"] != "mamba" else [None]
        got = [[_geo(v) + [v.shape[1] * v.element_size()] * len(width) for v in layer] for layer in ours.views[pool]]
        theirs = [[g for g in layer if g[-1]] for layer in reply[spec["name"]]] if width else reply[spec["name"]]
        assert got == theirs, pool  # an empty temporal state (Inkling's) has no view of ours: its width is 0 B
