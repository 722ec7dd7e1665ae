"""What DeepSeek-V4's exact plan no longer redoes (issue 37, sixth pass), and that nothing it keeps goes stale.

The plan's answers themselves are pinned by the sizing and exact-solve tests; these pin the shortcuts: a value
computed once per frozen object is the one computing it again gives, for every object (no answer of another
model or serving can come back)."""

from __future__ import annotations

import attrs
import pytest
from kvpools_plugins.dsv4.sizing import DSV4Shape, dsv4_shape

from kvpools_core.pipeline import plan_basis
from kvpools_core.values import Serving

EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
}


def _shape(model: str = "deepseek-v4-flash", options: dict[str, object] | None = None) -> DSV4Shape:
    basis = plan_basis(model, Serving(**(options or {})))  # type: ignore[arg-type]
    return dsv4_shape(basis.spec, basis.serving)


def test_the_flash_coefficient_by_hand() -> None:
    """deepseek-v4-flash (43 layers: 21 c4, 20 c128; rows of 448 + 2 x 64 + 8 = 584 B, indexer 128 + 4 = 132 B,
    c4 states 2 x 2 x 512 x 4 = 8,192 B and 2 x 2 x 128 x 4 = 2,048 B, ring 8 over window 128), SWA ratio 0.1:
    0.1 x 584 x 43 + 584 x 21 / 4 + 584 x 20 / 128 + 132 x 21 / 4 + 0.1 x 8 / 128 x (8,192 + 2,048) x 21
    = 2,511.2 + 3,066 + 91.25 + 693 + 1,075.2 + 268.8 = 7,705.45 B; with an EAGLE draft x 44 / 43."""
    plain = _shape()
    assert plain.bytes_per_full_token == pytest.approx(7705.45)
    assert plain.bytes_per_full_token == plain.raw_bytes_per_full_token
    eagle = _shape(options=EAGLE)
    assert eagle.bytes_per_full_token == pytest.approx(eagle.raw_bytes_per_full_token * 44 / 43)


@pytest.mark.parametrize(
    "options",
    [
        {},
        EAGLE,
        {"tp_size": 4, "swa_full_tokens_ratio": 0.5},
        {"pp_size": 2, "pp_rank": 1},
        {"enable_online_compress": True},
    ],
)
@pytest.mark.parametrize("model", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_the_stored_coefficient_is_the_computed_one(model: str, options: dict[str, object]) -> None:
    """The coefficient is computed when the frozen shape is built; any shape built from another (an ``evolve``
    of a field it reads) computes its own."""
    shape = _shape(model, options)
    assert shape.bytes_per_full_token == shape._coefficient()
    for changes in ({"speculative": not shape.speculative}, {"swa_ratio": 0.33}, {"num_c4": 0}, {"shrink": 2}):
        other = attrs.evolve(shape, **changes)
        assert other.bytes_per_full_token == other._coefficient()
        assert other.bytes_per_full_token != shape.bytes_per_full_token
        assert other != shape


def test_a_shape_of_no_layers_still_fails_where_it_is_read() -> None:
    """Dividing by no layers raised when the figure was read, not when the shape was built: still so (a stage of
    no layers is refused by ``dsv4_problems`` before any plan reads it)."""
    shape = attrs.evolve(_shape(options=EAGLE), num_layers=0)
    with pytest.raises(ZeroDivisionError):
        _ = shape.bytes_per_full_token
