"""Which layers and heads one rank holds, with SGLang's splitting rules."""

from __future__ import annotations

from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.values import ModelSpec, Serving


def pp_layer_range(
    num_layers: int, pp_rank: int, pp_size: int, partition: tuple[int, ...] | None = None
) -> tuple[int, int]:
    """``[start, end)`` layers of one pipeline stage (SGLang's ``get_pp_indices``).

    An explicit partition (SGLang's ``SGLANG_PP_LAYER_PARTITION``) wins;
    otherwise layers split evenly and the *last* ``num_layers % pp_size``
    stages take one extra layer each.
    """
    if pp_size > 1 and partition is not None:
        if len(partition) != pp_size or sum(partition) != num_layers or min(partition) < 0:
            raise ConfigError(
                f"{option('pp_layer_partition')} {','.join(map(str, partition))} must have {pp_size} non-negative "
                f"entries summing to the model's {num_layers} layers."
            )
        start = sum(partition[:pp_rank])
        return start, start + partition[pp_rank]
    base, extra = divmod(num_layers, pp_size)
    first_big = pp_size - extra
    if pp_rank < first_big:
        return pp_rank * base, (pp_rank + 1) * base
    start = first_big * base + (pp_rank - first_big) * (base + 1)
    return start, start + base + 1


def rank_layer_range(model: ModelSpec, serving: Serving) -> tuple[int, int]:
    """The layer range of the rank the plan is for."""
    return pp_layer_range(model.num_layers, serving.pp_rank, serving.pp_size, serving.pp_layer_partition)


def kv_heads_per_rank(total_kv_heads: int, tp_size: int, dcp_size: int = 1) -> int:
    """KV heads one rank stores: ``max(1, total // (tp / dcp))``.

    When TP exceeds the KV heads, heads are replicated and every rank keeps one;
    decode context parallelism shards tokens instead of heads, so each of its
    ranks keeps ``dcp`` times the heads of plain TP.
    """
    return max(1, total_kv_heads // max(1, tp_size // dcp_size))
