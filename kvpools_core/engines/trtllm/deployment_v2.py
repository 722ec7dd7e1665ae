"""``--accounting trtllm`` for models TensorRT-LLM keeps in a ``KVCacheManagerV2`` subclass (DeepSeek-V4's
``DeepseekV4CacheManager``): the budget ``KvCacheCreator`` hands it, the quota the manager derives, the runtime's
pool-ratio solve (:mod:`kvpools_core.engines.trtllm.manager_v2`) and what ``get_kv_cache_capacity()`` publishes.

Sources (``NVIDIA/TensorRT-LLM``, the code index's stored copies; commits where it names one):

- ``_torch/pyexecutor/_util.py`` ``KvCacheCreator.configure_kv_cache_capacity`` (stored copy): "For
  KVCacheManagerV2, KvCacheCreator controls capacity using max_gpu_total_bytes only. This leaves max_tokens as a
  user-defined constraint": ``max_tokens`` is restored to the user's value, the budget ``_cal_max_memory`` (the
  fraction of the memory free after warm-up) is capped by the user's ``max_gpu_total_bytes`` and written back as
  ``kv_cache_config.max_gpu_total_bytes``;
- ``_torch/pyexecutor/kv_cache_manager_v2.py`` ``KVCacheManagerV2.__init__`` (stored copy): ``quota =
  max_gpu_total_bytes`` when > 0; with ``max_tokens``, ``min(quota, ceil(quota_from_max_tokens /
  max_util_for_resume))`` (``max_util_for_resume`` 0.95, ``KvCacheConfig``); ``max_seq_len`` lowered to
  ``get_num_available_tokens(token_num_upper_bound=max_seq_len)`` (``clamp_max_seq_len_for_mem(1, ...)``, then the
  user's ``max_tokens``); ``blocks_in_primary_pool`` = ``get_page_index_upper_bound(0, KEY)``;
  ``get_kv_cache_stats`` sets ``allocated_bytes`` only;
- ``sparse/deepseek_v4/cache_manager.py``@``10ce7685``: ``_get_cache_quota`` (quota from ``max_tokens``), the typical
  step "1 context request + (max_batch_size - 1) generation requests" of ``max_seq_len`` (history ``max_seq_len -
  max_draft_len - 1``) and the constraint "one context request at max_seq_len" (``_build_cache_config``);
- ``_torch/pyexecutor/py_executor.py`` ``PyExecutor.get_kv_cache_capacity`` (stored copy): ``maxNumBlocks`` from
  ``KvCacheStats.max_num_blocks``, else ``blocks_in_primary_pool``; ``tokensPerBlock`` from the stats, else the
  manager's ``tokens_per_block``; ``maxNumTokens`` their product.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from kvpools_core.engines.trtllm.deployment import MANAGER_V2_PLANNER, TrtllmInputs, TrtllmPlanResult
from kvpools_core.engines.trtllm.manager import WindowPool, available_kv_memory
from kvpools_core.engines.trtllm.manager_v2 import (
    V2Solve,
    clamp_max_seq_len,
    page_index_upper_bound,
    round_up,
    solve,
)
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.trtllm import TrtllmLayer

MAX_UTIL_FOR_RESUME = 0.95
"""``KvCacheConfig.max_util_for_resume``'s default (``llm_args.py``)."""


@attrs.frozen(kw_only=True)
class TrtllmV2PlanResult(TrtllmPlanResult):
    """A ``trtllm-serve`` deployment whose KV cache is one ``KVCacheManagerV2`` subclass: ``pools`` are its pool
    groups (``window`` the largest life-cycle window, ``max_seq_len`` for a group without one; ``primary_blocks`` its
    slots, one block of every buffer of one life cycle each; ``share`` the typical step's ratio), ``v2`` the solve."""

    v2: V2Solve
    v2_manager: str
    first_buffer: tuple[int, str]
    """Manager layer id 0: the first layer's first buffer (``(layer index, kind)``), whose KEY page bound
    ``blocks_in_primary_pool`` reads."""
    quota_from_max_tokens: int | None = None
    estimated_bytes_per_token: int = 0

    @property
    def max_num_blocks(self) -> int | None:
        """``blocks_in_primary_pool``: the page-index upper bound of manager layer 0's KEY buffer (the first layer's
        first buffer), which PyExecutor publishes because ``KVCacheManagerV2.get_kv_cache_stats`` leaves
        ``max_num_blocks`` at 0.  It counts that buffer's pages: every layer's buffer of the same kind and size
        shares the pool, so it is ``slots x buffers in the pool``, not a count of token blocks."""
        layer, kind = self.first_buffer
        for group in self.v2.groups:
            if any((layer, kind) in pool.buffers for pools in group.pools for pool in pools):
                return page_index_upper_bound(group, self.v2.slots[group.index], layer, kind)
        raise AssertionError(f"no pool group holds manager layer 0 ({layer}, {kind})")

    @property
    def max_kv_tokens(self) -> int:
        """Tokens the pool groups without a window hold (every block of a sequence stays there): slots x
        ``tokens_per_block`` of the smallest such group; of the smallest group when every life cycle has a
        window."""
        full = [self.v2.slots[g.index] for g in self.v2.groups if None in g.windows] or list(self.v2.slots)
        return min(full) * self.tokens_per_block

    def concurrency_at(self, context_len: int) -> int | None:
        """Generation requests of ``context_len`` tokens the pool groups hold at once, at most ``max_batch_size``;
        None past ``max_seq_len``.  A request holds, in each group, ``ceil(L / tokens_per_block)`` blocks less the
        blocks behind each life cycle's window (``get_stale_range`` with ``L - 1`` tokens attended), as the typical
        step counts it (kvpools' reading: the scheduler's byte check, ``get_needed_resource_to_completion`` against
        the quota, and suspension above ``max_util_for_resume`` are not reproduced)."""
        if context_len <= 0:
            raise ConfigError(f"A context length must be positive, got {context_len}.")
        if context_len > self.max_seq_len:
            return None
        fits = min(
            self.v2.slots[group.index] // max(group.slots_for(context_len, context_len - 1, self.tokens_per_block), 1)
            for group in self.v2.groups
        )
        return min(fits, self.max_batch_size)

    @property
    def notes(self) -> tuple[str, ...]:
        base = [note for note in super().notes if "sliding-window layers" not in note]
        solve_ = self.v2
        groups = "; ".join(
            f"group {g.index} (windows {list(g.windows)}: {', '.join(g.kinds)}) ratio {solve_.ratios[g.index]:.6f}, "
            f"min {solve_.min_slots[g.index]:,} slots, {solve_.slots[g.index]:,} slots of {g.slot_bytes:,} B"
            for g in solve_.groups
        )
        base.append(
            f"{self.v2_manager} is a KVCacheManagerV2: KvCacheCreator hands it max_gpu_total_bytes only "
            f"({solve_.quota:,} B quota); the runtime splits the quota (rounded to {solve_.granularity:,} B grains) "
            f"among its pool groups by the bytes a typical step needs (1 context request + max_batch_size - 1 "
            f"generation requests of max_seq_len {self.max_seq_len_requested}): {groups}. The sliding-window and "
            "compressor-state groups are a fixed cost per request (a few blocks each), the window-less group holds the "
            "compressed tokens."
        )
        base.append(
            f"get_kv_cache_capacity() reads blocks_in_primary_pool, the page-index bound of the first layer's SWA "
            f"buffer ({self.max_num_blocks:,} = slots x buffers sharing its pool), not a count of token blocks; "
            f"the window-less pool group holds {self.max_kv_tokens:,} tokens."
        )
        return tuple(base)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["kv_cache_manager_v2"] = {
            **self.v2.to_dict(),
            "quota_from_max_tokens": self.quota_from_max_tokens,
            "max_util_for_resume": MAX_UTIL_FOR_RESUME,
            "estimated_bytes_per_token": self.estimated_bytes_per_token,
        }
        return out


def plan_v2(
    inputs: TrtllmInputs, layers: Sequence[TrtllmLayer], *, num_nextn_predict_layers: int | None
) -> TrtllmV2PlanResult:
    """Plan ``layers`` (every one answered with a ``v2`` value) as their ``KVCacheManagerV2`` subclass sizes them.
    Refused, with TensorRT-LLM's reason: ``tokens_per_block`` the manager asserts against, constraints that pin more
    than the memory free after warm-up (the runtime raises the quota to them and the allocation fails; below that a
    warning says the pools exceed the quota), a budget not one block of every group fits.  Not modelled yet
    (refused by name): MTP drafting, pipeline stages, a host tier, attention windows and window shares."""
    spec, serving, seq_len = inputs.model, inputs.serving, inputs.max_seq_len_requested
    block, max_tokens, frees = inputs.tokens_per_block, inputs.max_tokens, inputs.frees
    v2s = [layer.v2 for layer in layers]
    if any(v2 is None for v2 in v2s):
        raise UnsupportedCombinationError(
            f"kvpools does not model {spec.name}'s mix of KVCacheManagerV2 and V1 layers for --accounting trtllm yet."
        )
    managers = {v2.manager for v2 in v2s if v2 is not None}
    first = v2s[0]
    assert first is not None
    manager = first.manager
    if len(managers) > 1:
        raise UnsupportedCombinationError(
            f"kvpools does not model {spec.name}'s layers in several KVCacheManagerV2 classes ({sorted(managers)}) yet."
        )
    if first.tokens_per_block and block not in first.tokens_per_block:
        raise UnsupportedCombinationError(
            f"TensorRT-LLM refuses --tokens_per_block {block} for "
            f"{spec.name}: {manager} asserts 'requires tokens_per_block in {list(first.tokens_per_block)} ... Set "
            f"kv_cache_config.tokens_per_block to {' or '.join(map(str, first.tokens_per_block))}.' Pass "
            f"--tokens_per_block {first.tokens_per_block[0]} (what TensorRT-LLM's DeepSeek-V4 examples set, "
            "examples/models/core/deepseek_v4/README.md)."
        )
    what = f"{spec.name}'s {manager} (a KVCacheManagerV2)"
    if num_nextn_predict_layers:
        raise UnsupportedCombinationError(
            f"kvpools does not model MTP drafting beside {what} for --accounting trtllm yet: TensorRT-LLM builds "
            f"a second {manager} for the draft layers (should_use_separate_draft_kv_cache; appended to the target's "
            "with attention DP), appends max_draft_len - 1 virtual layers of the last layer's compress ratio, widens "
            "every window by max_draft_len, and splits max_gpu_total_bytes between the two managers in proportion "
            "to their CacheCost (_split_kv_cache_budget_for_draft), whose DeepSeek-V4 estimate differs between the "
            "TensorRT-LLM sources kvpools read (windowed buffers per token, or per request) and is not pinned to "
            "1.2.1. Drop --num_nextn_predict_layers (docs/trtllm.md)."
        )
    if serving.pp_size > 1:
        raise UnsupportedCombinationError(
            f"kvpools does not model pipeline stages of {what} for --accounting trtllm yet (each stage's manager "
            f"holds its own layers' buffers and the ranks agree on the fewest tokens); use {option('pp_size')} 1."
        )
    if inputs.host_cache_size:
        raise UnsupportedCombinationError(
            f"kvpools does not model the host tier of {what} for --accounting trtllm yet (HostCacheTierConfig: the "
            "runtime splits host_cache_size by the same ratio with the host granularity); drop --host_cache_size."
        )
    if inputs.max_attention_window is not None or inputs.window_size_shares is not None:
        raise UnsupportedCombinationError(
            f"kvpools does not model --max_attention_window or --window_size_shares beside {what} for "
            "--accounting trtllm yet: the manager sets each buffer's window itself. Drop them."
        )
    estimated = sum(v2.estimated_bytes_per_token for v2 in v2s if v2 is not None)
    budget = available_kv_memory(frees[0], inputs.free_gpu_memory_fraction)
    mgtb = inputs.max_gpu_total_bytes
    written = budget if mgtb is None or mgtb <= 0 else min(budget, mgtb)
    quota = written
    from_max_tokens = None
    if max_tokens is not None:
        from_max_tokens = math.ceil((int(max_tokens * estimated) + first.quota_extra_bytes) / MAX_UTIL_FOR_RESUME)
        quota = min(quota, from_max_tokens)
    if quota <= 0:
        raise ConfigError(f"{what} gets no GPU quota ({quota} B): raise the budget or --max_gpu_total_bytes.")
    typical = [((seq_len, 0), 1)]
    if inputs.max_batch_size > 1:
        typical.append(((seq_len, max(seq_len - 1, 0)), inputs.max_batch_size - 1))
    constraints = [[(seq_len, 0)]]
    result = solve(
        manager=manager,
        layers=layers,
        tokens_per_block=block,
        quota=quota,
        typical_step=typical,
        constraints=constraints,
    )
    warnings = []
    if result.min_quota > round_up(quota, result.granularity):
        if result.level_quota > frees[0]:
            raise UnsupportedCombinationError(
                f"{what} needs {result.level_quota:,} B for its constraint (one context request of max_seq_len "
                f"{seq_len} holds every block of every buffer until it is attended), more than the "
                f"{frees[0]:,} B free after warm-up: TensorRT-LLM's runtime raises the quota of {quota:,} B to what "
                "the constraint pins (_compute_slot_count_for_level) and the allocation fails. Lower --max_seq_len "
                "or raise the budget."
            )
        warnings.append(
            f"the constraint of one context request of max_seq_len {seq_len} pins {result.level_quota:,} B: the "
            f"runtime raises the quota of {quota:,} B to it (_compute_slot_count_for_level), so the pools exceed "
            "max_gpu_total_bytes / the fraction's budget."
        )
    seq_after = clamp_max_seq_len(result.groups, result.slots, block, seq_len)
    if max_tokens is not None:
        seq_after = min(seq_after, max_tokens)
    if seq_after <= 0:
        raise UnsupportedCombinationError(
            f"TensorRT-LLM refuses this budget for {spec.name}: not one block of every pool group fits "
            f"({result.slots} slots); raise the budget."
        )
    if seq_after < seq_len:
        warnings.append(
            f"max_seq_len {seq_len} is greater than max_num_tokens {seq_after} that can be allocated in kv cache "
            f"manager, setting max_seq_len to {seq_after}"
        )
    pools = tuple(
        WindowPool(
            window=max((w or seq_len) for w in group.windows),
            layers=group.layers,
            bytes_per_token=group.slot_bytes // block,
            share=result.ratios[group.index],
            primary_blocks=result.slots[group.index],
        )
        for group in result.groups
    )
    window_less = [result.slots[g.index] for g in result.groups if None in g.windows] or list(result.slots)
    rank = inputs.stage(
        0,
        available_kv_memory=budget,
        estimated_size_per_token=estimated,
        cache_bytes_per_token=estimated,
        max_tokens=min(window_less) * block,
        max_gpu_total_bytes=written,
    )
    return inputs.result(
        TrtllmV2PlanResult,
        max_seq_len=min(seq_after, seq_len),
        host_cache_size=None,  # a host tier is refused above; 0 (none) reads as None
        is_vswa=True,
        ranks=(rank,),
        pools=pools,
        warnings=tuple(warnings),
        v2=result,
        v2_manager=manager,
        first_buffer=(layers[0].index, first.buffers[0].kind),
        quota_from_max_tokens=from_max_tokens,
        estimated_bytes_per_token=estimated,
    )


if not MANAGER_V2_PLANNER:
    MANAGER_V2_PLANNER.append(plan_v2)

__all__ = ["MAX_UTIL_FOR_RESUME", "TrtllmV2PlanResult", "plan_v2"]
