"""The values' converters decide their common cases by exact type first (issue 37): the same values as the rule
they shortcut, written out here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kvpools_core.values import GroupCost, PoolSpec
from kvpools_core.values._fields import frozen_mapping

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


def _reference(value: Any) -> Any:
    """``_freeze`` as the rule reads: mappings become read-only proxies, lists and tuples tuples, the rest kept."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _reference(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_reference(v) for v in value)
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return ("map", {k: _plain(v) for k, v in value.items()})
    if isinstance(value, tuple):
        return ("tuple", [_plain(v) for v in value])
    return (type(value).__name__, value)


@given(st.dictionaries(st.text(max_size=4), JSON, max_size=5))
def test_frozen_mapping_freezes_as_the_rule_says(data: dict[str, Any]) -> None:
    frozen = frozen_mapping(data)
    assert isinstance(frozen, MappingProxyType)
    assert _plain(frozen) == _plain(_reference(data))


def test_a_pool_cost_is_taken_as_given_or_read_from_a_mapping() -> None:
    cost = GroupCost(group="kv", token_bytes=2, token_block=4, fixed_bytes=8)

    def pool(recorded: Any) -> PoolSpec:
        return PoolSpec(name="kv", kind="kv", slots=8, bytes_per_slot=0, bytes=12, cost=recorded)

    assert pool(cost).cost is cost
    assert pool(None).cost is None
    assert pool({"group": "kv", "token_bytes": 2, "token_block": 4, "fixed_bytes": 8}).cost == cost
    assert pool(MappingProxyType({"group": "kv", "token_bytes": 2, "token_block": 4, "fixed_bytes": 8})).cost == cost
