"""What each hook's answer must be (``RESULTS``), declared once; the registry checks every answer against it."""

from __future__ import annotations

import itertools
import numbers
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from kvpools_core.errors import short_repr

# ---------------------------------------------------------------------------
# Result contracts: what each hook's answer must be, declared once, here.
#
# The registry checks every implementation's own non-None answer, and every
# wrapper's replacement of it, against the hook's contract where the value
# leaves the plugin, so a wrong value is blamed on the plugin that returned it
# (``PluginResultError``), not on the wrapper or core step that trips over it.
# The frozen values validate their fields when constructed; a contract checks
# what they cannot: the type of the answer and of its items.
# ``tests/core/test_plugin_answers.py`` keeps the table complete.
# ---------------------------------------------------------------------------


class ResultContract(NamedTuple):
    """What one answer of a hook must be; ``problem(value)`` says what is wrong with it, or None."""

    expected: str
    problem: Callable[[Any], str | None]


def describe_value(value: Any, limit: int = 60) -> str:
    """A short description of a returned value for error messages (never a tensor dump)."""
    if value is None or isinstance(value, numbers.Number):
        return short_repr(value, limit)
    if isinstance(value, (str, bytes)):
        return f"{type(value).__name__} {short_repr(value, limit)}"
    if isinstance(value, Mapping):
        keys = [short_repr(key, 24) for key in itertools.islice(value, 4)]
        more = ", ..." if len(value) > 4 else ""
        if not keys:
            return f"empty {type(value).__name__}"
        return f"{type(value).__name__} with keys [{', '.join(keys)}{more}]"
    if isinstance(value, (list, tuple, set, frozenset)):
        return f"{type(value).__name__} of {len(value)} item(s)"
    cls = type(value)
    where = "" if cls.__module__ == "builtins" or cls.__module__.startswith("kvpools_core.") else f"{cls.__module__}."
    return f"{where}{cls.__qualname__} object"


def _is_count(value: Any) -> bool:
    """An integer >= 0 (numpy integers too, not bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return False
    return int(value) >= 0


def _items_of(items: Any, cls: type, field: str) -> str | None:
    for index, item in enumerate(items):
        if not isinstance(item, cls):
            return f"its {field}[{index}] is {describe_value(item)}, not a {cls.__name__}"
    return None


def _value_of(cls_name: str, **item_fields: str) -> Callable[[Any], str | None]:
    """The contract of a frozen value (``values.<cls_name>``) whose tuple fields hold frozen values
    (``field=item class name``); the classes are looked up when checked, so importing the specs
    imports no values."""

    def problem(value: Any) -> str | None:
        from kvpools_core import values

        if not isinstance(value, getattr(values, cls_name)):
            return f"not a {cls_name}"
        for field, item_cls in item_fields.items():
            found = _items_of(getattr(value, field), getattr(values, item_cls), field)
            if found:
                return found
        return None

    return problem


def _name_mapping(value_types: tuple[type, ...], value_name: str) -> Callable[[Any], str | None]:
    def problem(value: Any) -> str | None:
        if not isinstance(value, Mapping):
            return "not a mapping"
        for key, item in value.items():
            if not isinstance(key, str):
                return f"key {describe_value(key)} is not a str"
            if not isinstance(item, value_types):
                return f"{short_repr(key, 40)} maps to {describe_value(item)}, not {value_name}"
        return None

    return problem


def _platform_name(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return "not a non-empty str"
    return None


def _host_mirrors(value: Any) -> str | None:
    from kvpools_core.values import PackedInto

    if not isinstance(value, Mapping):
        return f"got {describe_value(value)}, not a mapping"
    for key, anchor in value.items():
        if not isinstance(key, str) or not (anchor is None or isinstance(anchor, (str, PackedInto))):
            return (
                f"entry {describe_value(key)}: {describe_value(anchor)} is not pool name -> None, a pool name or "
                f"PackedInto"
            )
        if isinstance(anchor, PackedInto):
            if anchor.pool not in value or isinstance(value[anchor.pool], PackedInto):
                return f"pool {key!r} is packed into {anchor.pool!r}, which is not a mirrored pool with host rows"
        elif anchor is not None and (anchor not in value or value[anchor] is not None):
            return f"pool {key!r} rides on {anchor!r}, which is not a mirrored pool of its own"
    return None


def _boolean_answer(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"got {describe_value(value)}, not True or False"


def _host_pools(value: Any) -> str | None:
    from kvpools_core.values import HostPool

    if not isinstance(value, (list, tuple)):
        return f"got {describe_value(value)}, not a list of HostPool"
    for index, pool in enumerate(value):
        if not isinstance(pool, HostPool):
            return f"item {index} is {describe_value(pool)}, not a HostPool"
    return None


def _messages(value: Any) -> str | None:
    if isinstance(value, (str, bytes)):
        return "one string, not a list of messages (it would be read one character at a time)"
    if not isinstance(value, (list, tuple)):
        return "not a list of messages"
    for index, message in enumerate(value):
        if not isinstance(message, str):
            return f"item {index} is {describe_value(message)}, not a str"
    return None


def _feature_lists(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return "not a mapping"
    for key, features in value.items():
        if not isinstance(key, str):
            return f"key {describe_value(key)} is not a str"
        problem = _messages(features)
        if problem:
            return f"{short_repr(key, 40)} maps to {problem}"
    return None


def _weights_estimate(value: Any) -> str | None:
    from kvpools_core.parts.weights import WeightsEstimate

    return None if isinstance(value, WeightsEstimate) else f"{describe_value(value)} is not a WeightsEstimate"


def _workspaces(value: Any) -> str | None:
    from kvpools_core.values import Workspace

    if not isinstance(value, (list, tuple)):
        return "not a list of Workspace values"
    return _items_of(value, Workspace, "item")


def _engine_defaults(value: Any) -> str | None:
    if not isinstance(value, (list, tuple)):
        return "not a list of EngineDefault values"
    from kvpools_core.values import EngineDefault

    return _items_of(value, EngineDefault, "item")


def _accelerators(value: Any) -> str | None:
    from kvpools_core.values import GPU

    if not isinstance(value, (list, tuple)):
        return "not a list of GPU values"
    return _items_of(value, GPU, "item")


def _buffer_layout(value: Any) -> str | None:
    from kvpools_core.pools.layout import BufferLayout  # imports torch: only once a plugin answers, at build

    if not isinstance(value, BufferLayout):
        return "not a BufferLayout (kvpools_core.pools.layout)"
    name = getattr(value, "name", None)
    if not isinstance(name, str) or not name:
        return f"its name is {describe_value(name)}, not a non-empty str"
    return None


def _memory_reading(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return "not a mapping"
    for key in ("free_bytes", "total_bytes"):
        if key not in value:
            return f"{key!r} is missing"
        if not _is_count(value[key]):
            return f"{key!r} is {describe_value(value[key])}, not an int >= 0"
    return None


def _measured(*, by_pool: bool) -> Callable[[Any], str | None]:
    """A built object as ``kvpools_core.building.Pools`` measures it: ``nbytes``, maybe ``nbytes_by_pool()``."""

    def problem(value: Any) -> str | None:
        nbytes = getattr(value, "nbytes", None)
        if nbytes is None:
            return "it has no nbytes (the bytes of its tensors)"
        if not _is_count(nbytes):
            return f"its nbytes is {describe_value(nbytes)}, not an int >= 0"
        method = getattr(value, "nbytes_by_pool", None)
        if method is None:
            return "it has no nbytes_by_pool() (measured bytes per plan pool)" if by_pool else None
        if not callable(method):
            return f"its nbytes_by_pool is {describe_value(method)}, not a method"
        measured = method()
        if not isinstance(measured, Mapping) or not all(
            isinstance(k, str) and _is_count(v) for k, v in measured.items()
        ):
            return f"its nbytes_by_pool() returned {describe_value(measured)}, not a mapping of pool name to int >= 0"
        return None

    return problem


def _vllm_specs(value: Any) -> str | None:
    from kvpools_core.parts.vllm.layers import layer_index
    from kvpools_core.parts.vllm.specs import KVCacheSpec

    if not isinstance(value, Mapping) or not value:
        return f"got {describe_value(value)}"
    for name, spec in value.items():
        if not isinstance(name, str) or layer_index(name) is None:
            return f"layer name {describe_value(name)} has no single integer part (the layer index)"
        if not isinstance(spec, KVCacheSpec):
            return f"{name!r} maps to {describe_value(spec)}, not a KVCacheSpec"
    return None


def _engines(value: Any) -> str | None:
    from kvpools_core.values.engine import Engine  # a foundation value: imports no engine

    if not isinstance(value, (list, tuple)):
        return "not a list of Engine values"
    return _items_of(value, Engine, "item")


def _layer_values(value: Any) -> str | None:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        return f"got {describe_value(value)}, not a non-empty list (or tuple) of the engine's per-layer values"
    return None


RESULTS: Mapping[str, ResultContract] = MappingProxyType(
    {
        "parse_model_config": ResultContract(
            "a ModelSpec whose layers are LayerSpecs (or None to decline the config)",
            _value_of("ModelSpec", layers="LayerSpec"),
        ),
        "presets": ResultContract(
            "a mapping of preset name (str) to config.json path (str or os.PathLike), or None",
            _name_mapping((str, os.PathLike), "a path"),
        ),
        "platforms": ResultContract(
            "a mapping of platform name (str) to a one-line description (str), or None",
            _name_mapping((str,), "a str"),
        ),
        "platform_aliases": ResultContract(
            "a mapping of alias (str) to a platform name (str) the same plugin provides, or None",
            _name_mapping((str,), "a str"),
        ),
        "detect_platform": ResultContract("a platform name (str) the plugin provides, or None", _platform_name),
        "platform_traits": ResultContract(
            "a PlatformTraits whose page_size_rules are PageSizeRules (or None to decline the platform)",
            _value_of("PlatformTraits", page_size_rules="PageSizeRule"),
        ),
        "accelerators": ResultContract(
            "a list (or tuple) of kvpools_core.values.GPU values; [] or None when there are none", _accelerators
        ),
        "workspaces": ResultContract(
            "a list (or tuple) of Workspace values; [] or None when there are none", _workspaces
        ),
        "plugin_options": ResultContract(
            "a mapping of option key (str) to one-line help (str), or None", _name_mapping((str,), "a str")
        ),
        "validate": ResultContract(
            "a list (or tuple) of problem messages (str); [] or None when there are none", _messages
        ),
        "engine_features": ResultContract(
            "a mapping of architecture (str) to a list (or tuple) of feature names (str), or None", _feature_lists
        ),
        "engine_defaults": ResultContract(
            "a list (or tuple) of EngineDefault values; [] or None when there are none", _engine_defaults
        ),
        "engine_accountings": ResultContract(
            "a list (or tuple) of kvpools_core.engines.base.Engine values; [] or None when there are none", _engines
        ),
        "engine_layer_specs": ResultContract(
            "a non-empty list (or tuple) of the engine's per-layer values, one per cached layer (or None to decline)",
            _layer_values,
        ),
        "architecture_traits": ResultContract(
            "a mapping of Hugging Face architecture (str) to a list (or tuple) of trait names (str), or None",
            _feature_lists,
        ),
        "available_memory": ResultContract(
            'a mapping with ints "free_bytes" and "total_bytes" >= 0 (or None to decline the device)',
            _memory_reading,
        ),
        "estimate_weights": ResultContract("a WeightsEstimate (or None to decline)", _weights_estimate),
        "estimate_cell_size": ResultContract(
            "a CellSize whose parts are CellParts (or None to decline)",
            _value_of("CellSize", parts="CellPart", draft_layer_parts="CellPart"),
        ),
        "vllm_kv_cache_specs": ResultContract(
            "a mapping of vLLM layer name (str with exactly one integer dotted part) to a kvpools_core.engines.vllm "
            "KVCacheSpec (or None to decline)",
            _vllm_specs,
        ),
        "size_pools": ResultContract(
            "a PoolSizing whose pools are PoolSpecs (or None to decline)", _value_of("PoolSizing", pools="PoolSpec")
        ),
        "host_mirrors": ResultContract(
            "a mapping of device pool name to None (its own host pool), the mirrored pool it rides on, or "
            "PackedInto(pool) (its rows packed into that pool's host rows)",
            _host_mirrors,
        ),
        "host_pools": ResultContract("a list (or tuple) of HostPool values (or None to decline)", _host_pools),
        "retraction_host_pool": ResultContract("True or False (or None to decline)", _boolean_answer),
        "build_req_to_token_pool": ResultContract(
            "a request table with nbytes (int >= 0) and optionally nbytes_by_pool() (or None to decline)",
            _measured(by_pool=False),
        ),
        "buffer_layout": ResultContract(
            "a kvpools_core.pools.layout.BufferLayout with a non-empty name (or None to decline the device)",
            _buffer_layout,
        ),
        "build_pool": ResultContract(
            "a KV pool with nbytes (int >= 0) and nbytes_by_pool() -> {pool name: int} (or None to decline)",
            _measured(by_pool=True),
        ),
        "build_allocator": ResultContract(
            "an allocator with nbytes (int >= 0) and optionally nbytes_by_pool() (or None to decline)",
            _measured(by_pool=False),
        ),
    }
)
"""Hook name → the contract of its answers (the registry checks each non-None answer)."""
