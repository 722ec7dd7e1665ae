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


def _decode_op_counts(
    page_size: int, steps: int, lengths: tuple[int, ...] = (5, 9, 13, 3), scatter: bool = False
) -> tuple[list[Counter[str]], torch.Tensor, torch.Tensor]:
    """Operations inside the cache's ``update`` calls per forward (prompt first), and the tokens of the
    KvpoolsCache and DynamicCache runs.  ``scatter``: after the prompt, 8 slots are taken and every other one
    given back behind the cache's back, so the first decode step's slots are not consecutive (1, 3, 5, 7 on a
    page-1 pool: the token allocator hands out the freed slots first)."""
    model = llama()
    ids, mask = left_padded(lengths, model.config.vocab_size)
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
        for step in range(steps):
            if scatter and step == 1 and reference is cache:
                taken = cache.allocator.alloc(8)
                assert taken is not None
                cache.allocator.free(taken[::2])
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
    # page 1, per step: the new slots as a column (view, cat) and the flat slot list (view) = 3, the table written
    # by Python ints through its memory (no index_put_, no int32 copy); per layer: K and V each one index_copy_
    # into the pool, one index_select out of it and one as_strided to (batch, heads, width, dim) = 6.  Issue 37's
    # fourth pass: 6 per step (index_put_, _to_copy, add for the table and lengths); second pass 23; before it 40
    # per step and 16 per layer.
    if page_size == 1:  # the same work at every length
        assert decode == [decode[0]] * len(decode), decode
        assert decode[0] == 3 + 6 * layers, counts[1]
    else:  # alloc_decode's own operations: a few more where a request opens a page
        assert max(decode) <= 16 + 8 * layers, decode
    step = counts[1]
    assert step["aten.index.Tensor"] == 0  # no advanced-indexing gather: index_select reads whole slots
    assert step["aten.index_select.default"] == 2 * layers
    assert step["aten.index_copy_.default"] == 2 * layers
    assert step["aten.as_strided.default"] == 2 * layers  # the gathered rows as (batch, heads, width, dim): one op
    assert step["aten.transpose.int"] == 0
    assert step["aten.cat.default"] == 1  # the layout grows by one column, once per step
    if page_size == 1:
        assert step["aten.index_put_.default"] == 0  # the table is written by ints
        assert step["aten.select.int"] == 0  # a page-1 rollback frees every slot of the step: no last slot read


def test_decode_slots_that_do_not_follow_each_other_are_recorded_where_they_are() -> None:
    """A decode step whose slots are 31, 33, 35, 37 (slots freed behind the cache's back), then steps on
    consecutive slots again: the table, written by ints through its memory, holds each request's own slot of each
    step in the column after its tokens, the tokens are DynamicCache's, and release frees exactly those slots."""
    counts, ours, theirs = _decode_op_counts(1, steps=6, scatter=True)
    assert torch.equal(ours, theirs)
    layers = llama().config.num_hidden_layers
    assert [sum(c.values()) for c in counts[1:]] == [3 + 6 * layers] * 5

    model = llama()
    lengths = (5, 9, 13, 3)
    ids, mask = left_padded(lengths, model.config.vocab_size)
    plan = plan_for_config(model.config, Serving(platform="cpu"), memory="4MiB")
    cache = KvpoolsCache(kvpools_core.build(plan, "cpu"), attention_mask=mask)
    free_at_start = cache.allocator.available_size()
    handed: list[list[int]] = []
    alloc = cache.allocator.alloc

    def recorded(n: int) -> Any:
        out = alloc(n)
        handed.append(out.tolist())
        return out

    step_ids, step_mask = ids, mask
    for step in range(4):
        if step == 1:  # after the prompt (slots 1..30): take 31..38, give back 31, 33, 35, 37
            taken = cache.allocator.alloc(8)
            assert taken is not None and taken.tolist() == list(range(31, 39))
            cache.allocator.free(taken[::2])
            cache.allocator.alloc = recorded  # type: ignore[method-assign]
        with torch.no_grad():
            logits = model(input_ids=step_ids, attention_mask=step_mask, **cache_kwargs(model, cache)).logits
        step_ids = logits[:, -1].argmax(-1, keepdim=True)
        step_mask = torch.cat([step_mask, torch.ones_like(step_mask[:, :1])], 1)
    assert handed == [[31, 33, 35, 37], [39, 40, 41, 42], [43, 44, 45, 46]]
    table = cache.req_to_token.req_to_token
    for i, row in enumerate(cache.requests):
        assert cache.length(row) == lengths[i] + 3
        assert table[row, lengths[i] : lengths[i] + 3].tolist() == [slots[i] for slots in handed]
    cache.release()
    assert cache.allocator.available_size() == free_at_start - 4  # only 32, 34, 36, 38 (taken behind its back)


@pytest.mark.parametrize("page_size", [1, 16])
def test_one_request_on_consecutive_slots_reads_no_copy_of_its_tokens(page_size: int) -> None:
    """A fresh pool hands one request consecutive slots (9 prompt tokens, then one per step, across a page
    boundary at 16): its K/V are a view of the pool's buffers, no gather, same tokens as DynamicCache."""
    counts, ours, theirs = _decode_op_counts(page_size, steps=10, lengths=(9,))
    assert torch.equal(ours, theirs)
    layers = llama().config.num_hidden_layers
    if page_size == 1:  # per step: the slot's value (item), the table store by ints through its memory (no op;
        # before issue 37's fifth pass a torch store: lift_fresh, select, copy_)
        assert [sum(c.values()) for c in counts[1:]] == [1 + 4 * layers] * (len(counts) - 1), counts[1]
    for step in counts[1:]:
        assert step["aten.index_select.default"] == 0, step
        assert step["aten.cat.default"] == (0 if page_size == 1 else 1)  # page 1: no layout while the run lasts
        assert step["aten.index_copy_.default"] == 2 * layers  # the new token's K and V, written to the pool
        assert step["aten.as_strided.default"] == 2 * layers  # and every cached one read as a view


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


def _one_request_cache(page_size: int, prompt: int) -> KvpoolsCache:
    model = llama()
    plan = plan_for_config(model.config, Serving(platform="cpu", page_size=page_size), memory="4MiB")
    return KvpoolsCache(kvpools_core.build(plan, "cpu"), attention_mask=torch.ones(1, prompt, dtype=torch.long))


def _feed(cache: KvpoolsCache, query: int, generator: torch.Generator) -> list[tuple[torch.Tensor, ...]]:
    """One forward's ``update`` of both layers with random K/V ``(1, 2 heads, query, 16)``: (k, v, out_k, out_v)."""
    fed = []
    for layer in (0, 1):
        k = torch.randn(1, 2, query, 16, generator=generator).to(torch.bfloat16)
        v = torch.randn(1, 2, query, 16, generator=generator).to(torch.bfloat16)
        fed.append((k, v, *cache.update(k, v, layer)))
    return fed


@pytest.mark.parametrize(("page_size", "prompt"), [(1, 5), (16, 15)])
def test_the_view_of_consecutive_slots_holds_what_was_fed_and_ends_where_a_slot_breaks_the_run(
    page_size: int, prompt: int
) -> None:
    """What ``update`` returns is every K/V fed so far in order (DynamicCache's ``cat``), whether read as a view
    of the pool (the request's slots follow each other) or gathered (a page taken behind the cache's back before
    step 2 breaks the run: step 2's slot opens a page after it, not the one after the last slot)."""
    cache = _one_request_cache(page_size, prompt)
    generator = torch.Generator().manual_seed(3)
    history: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {0: [], 1: []}
    buffers = {layer: cache.pool.kv.k_buffer[layer].untyped_storage().data_ptr() for layer in (0, 1)}
    for step, query in enumerate((prompt, 1, 1, 1)):
        if step == 2:
            assert cache.allocator.alloc(page_size) is not None
        for layer, (k, v, out_k, out_v) in enumerate(_feed(cache, query, generator)):
            history[layer].append((k, v))
            assert torch.equal(out_k, torch.cat([h[0] for h in history[layer]], 2))
            assert torch.equal(out_v, torch.cat([h[1] for h in history[layer]], 2))
            viewed = out_k.untyped_storage().data_ptr() == buffers[layer]
            # steps 0-1: page 1's slots 1..6, or page 16's slots 16..31 (one page); from step 2 on not consecutive
            assert viewed == (step < 2), (step, layer)


def test_a_forward_abandoned_on_a_run_is_rolled_back_and_the_retry_reads_what_was_fed() -> None:
    """A decode step of one request on consecutive slots whose forward stops after layer 0 (an exception in the
    model): the retry rolls it back (its slot is freed) and still returns exactly the K/V fed by the committed
    forwards and itself, whether the retry's slot continues the run or not."""
    cache = _one_request_cache(1, 5)
    generator = torch.Generator().manual_seed(4)
    history: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {0: [], 1: []}
    for query in (5, 1):
        for layer, (k, v, _, _) in enumerate(_feed(cache, query, generator)):
            history[layer].append((k, v))
    free_before = cache.allocator.available_size()
    abandoned = torch.randn(1, 2, 1, 16, generator=generator).to(torch.bfloat16)
    cache.update(abandoned, abandoned, 0)  # layer 1 never runs: the forward raised
    assert cache.allocator.available_size() == free_before - 1
    for _ in range(3):
        for layer, (k, v, out_k, out_v) in enumerate(_feed(cache, 1, generator)):
            history[layer].append((k, v))
            assert torch.equal(out_k, torch.cat([h[0] for h in history[layer]], 2))
            assert torch.equal(out_v, torch.cat([h[1] for h in history[layer]], 2))
    assert cache.length(next(iter(cache.requests))) == 5 + 1 + 3
    assert cache.allocator.available_size() == free_before - 3  # the abandoned step's slot came back
