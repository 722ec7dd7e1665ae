"""How much work a KvpoolsCache decode step does: torch operations counted, never timed (issue 37).

transformers' ``DynamicCache`` costs two ``torch.cat`` per layer and step.  KvpoolsCache used to re-derive the
step's layout from the request table at every step (about 40 operations, growing with nothing but the code
path) and to gather K/V with advanced indexing (``get_kv``), 16 operations per layer.  A decode step of the
batch the last forward committed now extends that step's layout (one allocation, one table write, one
``cat``) and reads a plain pool's buffers with ``index_select``: the counts below pin that, independent of the
requests' lengths.  Token identity with ``DynamicCache`` is tested in ``test_transformers_llama.py``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

import kvpools_core
from kvpools_core.integrations.transformers import KvpoolsCache, cache_kwargs, plan_for_config
from kvpools_core.pools.mha import MHATokenToKVPool
from kvpools_core.values import Serving

from .tiny import left_padded, llama


class _Count(TorchDispatchMode):
    """Every aten operation dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _decode_op_counts(page_size: int, steps: int) -> tuple[list[Counter[str]], torch.Tensor, torch.Tensor]:
    """Operations inside the cache's ``update`` calls per forward (prompt first), and the tokens of the
    KvpoolsCache and DynamicCache runs."""
    model = llama()
    ids, mask = left_padded((5, 9, 13, 3), model.config.vocab_size)
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=page_size), memory="4MiB")
    cache = KvpoolsCache(kvpools_core.build(plan, "cpu"), attention_mask=mask)
    per_forward: list[Counter[str]] = []
    original = KvpoolsCache._update_layer

    def counted(self: KvpoolsCache, *args: Any) -> Any:
        with _Count() as count:
            out = original(self, *args)
        per_forward[-1].update(count.ops)
        return out

    def run(reference: Any) -> torch.Tensor:
        tokens, step_ids, step_mask = [], ids, mask
        for _ in range(steps):
            per_forward.append(Counter())
            with torch.no_grad():
                logits = model(input_ids=step_ids, attention_mask=step_mask, **cache_kwargs(model, reference)).logits
            step_ids = logits[:, -1].argmax(-1, keepdim=True)
            step_mask = torch.cat([step_mask, torch.ones_like(step_mask[:, :1])], 1)
            tokens.append(step_ids)
        return torch.cat(tokens, 1)

    setattr(KvpoolsCache, "_update_layer", counted)  # noqa: B010 - restored below
    try:
        ours = run(cache)
    finally:
        setattr(KvpoolsCache, "_update_layer", original)  # noqa: B010
    theirs = run(DynamicCache(config=model.config))
    return per_forward[:steps], ours, theirs


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_decode_step_costs_a_fixed_handful_of_operations_per_layer(page_size: int) -> None:
    counts, ours, theirs = _decode_op_counts(page_size, steps=8)
    assert torch.equal(ours, theirs)
    layers = llama().config.num_hidden_layers  # 2
    decode = [sum(c.values()) for c in counts[1:]]
    # per step: the table write (index_put_ + its int32 copy), the new slots as a column (view, cat), the last
    # slot of each request (select), the lengths (add), the flat slot list (view); per layer: K and V each one
    # index_copy_ into the pool, one index_select out of it, its view and transpose = 8.  The old path:
    # 40 per step and 16 per layer (72 for these two layers), with 5 advanced-indexing gathers.
    if page_size == 1:  # the same work at every length
        assert decode == [decode[0]] * len(decode), decode
        assert decode[0] <= 8 + 8 * layers, counts[1]
    else:  # alloc_decode's own operations: a few more where a request opens a page
        assert max(decode) <= 16 + 8 * layers, decode
    step = counts[1]
    assert step["aten.index.Tensor"] == 0  # no advanced-indexing gather: index_select reads whole slots
    assert step["aten.index_select.default"] == 2 * layers
    assert step["aten.index_copy_.default"] == 2 * layers
    assert step["aten.cat.default"] == 1  # the layout grows by one column, once per step


def test_a_pool_that_quantises_keeps_the_pools_own_read_and_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct buffer path is only for a pool that stores the model's dtype as is: an fp8 pool's K/V go
    through ``set_kv_buffer`` / ``get_kv`` (their codec), so the cache has no direct buffers for it."""
    monkeypatch.setenv("KVPOOLS_CPU_AMX", "1")  # the cpu platform's fp8 needs AMX on the serving host
    model = llama()
    plain = plan_for_config(model.config, Serving(platform="cpu"), memory="4MiB")
    fp8 = plan_for_config(model.config, Serving(platform="cpu", kv_cache_dtype="fp8_e4m3"), memory="4MiB")
    assert set(KvpoolsCache(kvpools_core.build(plain, "cpu"))._raw) == {0, 1}
    assert KvpoolsCache(kvpools_core.build(fp8, "cpu"))._raw == {}
    assert type(kvpools_core.build(plain, "cpu").kv_pool) is MHATokenToKVPool
