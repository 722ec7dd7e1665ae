"""What the dsv4 plugin records for capacity answers: the compressed spaces' ratios and the SWA space's window
terms (``PoolSizing.compression`` / ``PoolSizing.windows``), their JSON round trip and their validation."""

from __future__ import annotations

import attrs
import pytest

from kvpools_core.errors import InvalidValueError
from kvpools_core.parts.sizing import sliding_window_terms
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan, Serving

FLASH = Serving(page_size=256, tp_size=8)


@pytest.fixture(scope="module")
def flash() -> Plan:
    return plan("deepseek-v4-flash", FLASH, memory="60GiB")


def test_ratios_and_window_are_recorded(flash: Plan) -> None:
    """c4 rows are full // 4, c128 full // 128 (246,592 x 4 = 7,706 x 128 = 986,368); the SWA window is 128 +
    eviction interval 128 x 1 + page 256 + decode page 256 = 768, two chunks of 8,192 in flight, a page reserved."""
    tokens = flash.counts["tokens"]
    assert dict(flash.compression) == {"c4": 4, "c128": 128}
    assert tokens["c4"] * 4 == tokens["c128"] * 128 == tokens["full"]
    (window,) = flash.windows
    assert window == sliding_window_terms("swa", 128, flash.serving)
    assert (window.per_request, window.prefills_in_flight, window.reserved) == (768, 2, 256)


def test_round_trip(flash: Plan) -> None:
    again = Plan.from_json(flash.to_json())
    assert again.compression == flash.compression and again.windows == flash.windows
    assert flash.to_dict()["sizing"]["compression"] == {"c4": 4, "c128": 128}


def test_hisparse_leaves_c4_out() -> None:
    serving = attrs.evolve(FLASH, enable_hisparse=True, disable_radix_cache=True, accounting="sglang")
    assert dict(plan("deepseek-v4-flash", serving, memory="60GiB").compression) == {"c128": 128}


def test_decode_node_window() -> None:
    """A decode node prefills nothing and keeps (window 128 + page 256) per pre-allocated slot: 3 x 384."""
    serving = attrs.evolve(
        FLASH, disaggregation_mode="decode", disaggregation_decode_extra_slots=3, max_running_requests=64
    )
    (window,) = plan("deepseek-v4-flash", serving, memory="60GiB").windows
    assert (window.prefills_in_flight, window.reserved) == (0, 1_152)


@pytest.mark.parametrize(
    "compression",
    [{"full": 4}, {"c4": 0}, {"c4": True}, {"swa": 4}, {"c8": 8}],
    ids=["full", "zero", "bool", "windowed", "uncounted"],
)
def test_compression_is_validated(flash: Plan, compression: dict[str, int]) -> None:
    with pytest.raises(InvalidValueError, match="compression"):
        attrs.evolve(flash.sizing, compression=compression)
