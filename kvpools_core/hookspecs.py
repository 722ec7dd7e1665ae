"""Hook specifications: the whole contract between the core and its plugins.

Dispatch order (written once, in ``docs/dispatch.md``, and tested): within a
hook, pluggy calls ``tryfirst`` implementations first (platform plugins), then
plain ones (architecture plugins, later-registered first), then ``trylast``
ones (the core defaults).  Architecture plugins return ``None`` for models they
do not recognise.  Cross-cutting concerns (speculative-decoding draft scaling)
are new-style wrappers (``wrapper=True``) owned by the plugin of that concern.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from kvpools_core.values import Budget, CellSize, ModelSpec, Plan, PoolSizing, Serving

PROJECT = "kvpools"

_spec = pluggy.HookspecMarker(PROJECT)


@_spec
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    """Turn a Hugging Face ``config.json`` into a :class:`ModelSpec`.

    Every implementation is called; the results are collected.  Exactly one
    plugin may claim a config: an architecture returns ``None`` for configs it
    does not recognise, and two claims are reported as a conflict naming both.

    :param config: the parsed ``config.json`` (read-only).
    :param source: where it came from (a path or ``preset:NAME``), for errors.
    :returns: the model's per-layer description, or ``None`` to decline.
    """


@_spec
def presets() -> Mapping[str, str] | None:
    """Name the bundled model configs a plugin ships.

    Every implementation is called; the results are collected.  Two plugins
    offering the same preset name is a conflict naming both.

    :returns: preset name → path of a ``config.json`` file.
    """


@_spec
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    """Reject unsupported combinations before anything is sized or allocated.

    Every implementation is called; the results are collected.  Each plugin
    returns the problems it owns (one message each, naming the option and the
    supported alternatives), or ``None``/``[]`` when it has none.

    :param model: the parsed model.
    :param serving: the serving options.
    :returns: error messages.
    """


@_spec(firstresult=True)
def available_memory(device: str, serving: Serving) -> Mapping[str, int] | None:
    """Measure the memory a device offers the KV cache.

    Stops at the first non-None result; return None to decline.  The platform
    plugin that owns ``device`` (``cpu``, ``cuda:N``, ``npu:N``, ...) answers.

    :param device: the device string given by the user.
    :param serving: the serving options.
    :returns: ``{"free_bytes": ..., "total_bytes": ...}`` as measured now.
    """


@_spec(firstresult=True)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    """Compute what one token (and one request) of the KV cache costs on this rank.

    Stops at the first non-None result; return None to decline.  The
    architecture that parsed the model answers; wrappers of cross-cutting
    concerns (draft KV for speculative decoding) adjust the answer.

    :param model: the parsed model.
    :param serving: the serving options (parallelism decides the rank's share).
    :returns: the cell size, with SGLang's figure beside kvpools' exact one.
    """


@_spec(firstresult=True)
def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing | None:
    """Split a budget into token counts, request count and pools.

    Stops at the first non-None result; return None to decline.  The core's
    default (``trylast``) reproduces SGLang's ``DefaultPoolConfigurator`` and
    token constraints for single-pool models; hybrid architectures answer
    for their own models.

    :param model: the parsed model.
    :param serving: the serving options (``accounting`` picks SGLang's or exact sizing).
    :param cell: the cell size from :func:`estimate_cell_size`.
    :param budget: the KV budget.
    :returns: the sizing, whose pools ``build`` must allocate exactly.
    """


@_spec(firstresult=True)
def build_req_to_token_pool(plan: Plan, device: str) -> Any | None:
    """Build the request-to-token table of a plan.

    Stops at the first non-None result; return None to decline.  Hybrid and
    disaggregated-decode variants answer for their plans; the core's default
    (``trylast``) builds the plain table.

    :param plan: the plan.
    :param device: torch device string (``cpu``, ``cuda:0``, ``meta``, ...).
    :returns: the request table object.
    """


@_spec(firstresult=True)
def build_pool(plan: Plan, device: str) -> Any | None:
    """Build the KV pool (the token-indexed tensors) of a plan.

    Stops at the first non-None result; return None to decline.  Platform
    plugins (``tryfirst``) answer first for their devices, then the
    architecture that owns ``plan.model.architecture``.

    :param plan: the plan.
    :param device: torch device string.
    :returns: the KV pool object.
    """


@_spec(firstresult=True)
def build_allocator(plan: Plan, pool: Any, device: str) -> Any | None:
    """Build the slot allocator of a plan's KV pool.

    Stops at the first non-None result; return None to decline.  Platform
    plugins first, then architectures with their own allocators, then the
    core's token / paged allocator (``trylast``).

    :param plan: the plan.
    :param pool: the KV pool built by :func:`build_pool`.
    :param device: torch device string.
    :returns: the allocator object.
    """
