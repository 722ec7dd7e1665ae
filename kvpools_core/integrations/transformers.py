"""A Hugging Face transformers ``Cache`` whose K/V live in kvpools pools (extra ``kvpools[hf]``).

Why: every number kvpools prints is checked against SGLang's arithmetic, but a plan is only proven when a real
model writes and reads the pools it builds.  :class:`KvpoolsCache` is that proof for transformers (5.x ``Cache``
API): each attention layer's new K/V go to the pool with ``set_kv_buffer`` at slots the kvpools allocator hands
out (SGLang's ``alloc_extend`` / ``alloc_decode`` for paged pools, ``alloc`` for page size 1), their slot ids are
written into the request-to-token table, and attention reads every cached token back through that table
(``get_kv`` of ``req_to_token[row, :len]``).  Only real tokens are stored: left padding is skipped (the prompt's
attention mask says which columns are real), so a request holds a slot for each token it fed the model.

Layout of what ``update`` returns: request ``i``'s ``n_i`` cached tokens are right-aligned in a
``(batch, heads, width, head_dim)`` tensor, zeros to their left; ``width`` is :meth:`KvpoolsCache.get_seq_length`
plus the step's query length.  That is exactly the layout left padding gives, so ``model.generate`` with a
left-padded batch needs nothing more, and a continuous-batching loop builds its attention mask the same way
(see ``examples/continuous_batching.py``).  Zeros sit only where the mask is 0, so attention sees the same
scores as with transformers' own cache: greedy tokens are identical when the pool stores the model's dtype.

Which transformers: every 5.x the ``hf`` extra accepts (5.17 on).  From 5.24 on a model's ``forward`` and
``generate`` take the cache as ``cache=`` and warn (``FutureWarning``) about ``past_key_values=``; 5.17 to 5.23
know only ``past_key_values=``.  :func:`cache_kwargs` gives the keyword the model in hand accepts, read from its
``forward`` signature (not from the version: a model's code may come from elsewhere), so one call works on all.
A recurrent mixer up to 5.20 asks ``has_previous_state`` first, later ones ``get_conv_state`` or
``get_recurrent_state``: whichever comes first in a forward loads the requests' state.

Families: plans whose layers are full attention (the ``mha`` pool: Llama, Qwen, ...), full and sliding-window
attention (the ``swa`` plugin's two pools, full→SWA mapping and dual allocator; the SWA slots of tokens that slid
out of the window are freed as SGLang evicts them), or MLA latents (the ``mla`` pool: DeepSeek-V3), beside
recurrent layers whose conv and SSM state live in a state slot per request (the ``mamba`` plugin's
``HybridReqToTokenPool``: Qwen3-Next).  Which families are tested is in ``docs/integrations/transformers.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from kvpools_core.errors import AllocatorError, ConfigError, InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.pools.mha import MHATokenToKVPool
from kvpools_core.pools.quant import NativeCodec

if TYPE_CHECKING:
    from kvpools_core.building import Pools
    from kvpools_core.values import Plan, Serving

try:
    from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionLayer
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "kvpools_core.integrations.transformers needs Hugging Face transformers 5.x: pip install 'kvpools[hf]'."
    ) from exc

__all__ = ["KvpoolsCache", "PoolFullError", "cache_kwargs", "plan_for_config"]

_QUANTISED_KV = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})
_FULL, _SLIDING, _LATENT = "attention", "sliding_attention", "mla"
"""The ``LayerSpec.kind`` s whose K/V this cache stores (the core's, the ``swa`` and ``mla`` plugins' names)."""


class PoolFullError(InsufficientMemoryError):
    """The allocator or the request table has no room for what a forward step needs."""


def cache_kwargs(model: Any, cache: Cache) -> dict[str, Cache]:
    """The keyword arguments that hand ``cache`` to ``model``'s ``forward`` and ``generate``.

    ``{"cache": cache}`` where the model's ``forward`` has a ``cache`` parameter (transformers 5.24 and later,
    which deprecate ``past_key_values`` with a ``FutureWarning``), else ``{"past_key_values": cache}`` (5.17 to
    5.23).  Use: ``model.generate(**inputs, **cache_kwargs(model, cache))``.
    """
    forward = getattr(model, "forward", None)
    try:
        parameters = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):  # a forward without a readable signature: the keyword every 5.x knows
        parameters = {}
    return {"cache": cache} if "cache" in parameters else {"past_key_values": cache}


def plan_for_config(
    config: Any, serving: Serving | None = None, *, memory: int | str = "64MiB", name: str | None = None
) -> Plan:
    """Plan a transformers config's KV pools through kvpools, exactly as for a ``config.json`` on disk.

    ``config`` is a ``PretrainedConfig`` or its ``to_dict()``; the architecture plugins claim it by its fields
    as they claim a checkpoint's config.  ``serving`` defaults to ``Serving(platform="cpu")``.
    """
    import attrs

    from kvpools_core.models import parse_config
    from kvpools_core.pipeline import plan
    from kvpools_core.registry import get_registry
    from kvpools_core.values import Serving

    as_dict = config.to_dict() if hasattr(config, "to_dict") else config
    if not isinstance(as_dict, Mapping):
        raise ConfigError(f"config must be a transformers PretrainedConfig or a dict, got {type(config).__name__}.")
    label = name or f"transformers:{as_dict.get('model_type', 'model')}"
    registry = get_registry()
    spec, _ = parse_config(as_dict, label, registry)
    spec = attrs.evolve(spec, name=label)
    return plan(spec, serving or Serving(platform="cpu"), memory=memory, registry=registry)


class _Request:
    """One request's row in the request-to-token table and how many of its tokens the pool holds."""

    __slots__ = ("length", "row")

    def __init__(self, row: int) -> None:
        self.row = row
        self.length = 0


class _Step:
    """What one forward step decided once, at its first KV layer, for every layer to use.

    ``write_mask`` picks the real new tokens out of ``(batch, q)``, request by request (``None`` when every
    column is one: a decode step or an unpadded prompt); ``locs`` are their slots; ``full`` / ``sliding`` are
    the slot each of the returned ``(batch * width)`` rows (right-aligned) is read from: slot 0, the zero padding
    slot, where a row holds no cached token (left padding, a token evicted from the SWA pool).
    ``requests`` / ``counts`` are what the step adds once it commits; ``opened`` the step's slots and the slot
    each request held last before it, from which a rollback finds the pages the step opened (:meth:`fresh`: a
    page the request already held stays held); ``given_counts`` the ``new_tokens`` of ``select`` it consumed.
    ``rows`` / ``lengths`` are the requests' table rows and their lengths once the step commits (tensors), what
    the next decode step extends without reading the request table (:meth:`KvpoolsCache._decode_step`).
    ``run`` is the first slot when the step's one request reads consecutive slots ``run .. run + width - 1`` of a
    host pool (``None`` otherwise): its K/V are then a view of the pool's buffers, no gather at all.
    """

    __slots__ = (
        "_full",
        "_lengths",
        "batch",
        "counts",
        "flat",
        "given_counts",
        "locs",
        "opened",
        "requests",
        "rows",
        "run",
        "sliding",
        "width",
        "write_mask",
    )

    def __init__(
        self,
        batch: int,
        width: int,
        write_mask: Tensor | None,
        locs: Tensor,
        full: Tensor | None,
        sliding: Tensor | None,
        *,
        requests: list[_Request],
        counts: list[int],
        opened: tuple[Tensor, Tensor | None],
        given_counts: list[int] | None,
        rows: Tensor,
        lengths: Tensor | list[int],
        run: int | None = None,
    ) -> None:
        self.batch = batch
        self.width = width
        self.write_mask = write_mask
        self.locs = locs
        self._full = full
        self.sliding = full if sliding is None else sliding
        """:attr:`full`, the tokens evicted from the SWA pool read from the padding slot: what a sliding layer
        reads (a decode step's is ``full``: it has no sliding layers)."""
        self.requests = requests
        self.counts = counts
        self.opened = opened
        self.given_counts = given_counts
        self.rows = rows
        self._lengths = lengths
        self.run = run
        self.flat: Tensor | None = None
        """``full`` flattened, made once per step: the slots :meth:`KvpoolsCache._through_buffers` selects."""

    @property
    def full(self) -> Tensor:
        """The slot of every returned row, ``(batch, width)``: what a full-attention layer reads.  A decode step
        on a run of consecutive slots makes it only when something asks (the run ended, or a layer gathers)."""
        full = self._full
        if full is None:
            assert self.run is not None, "a step without its layout is a run's"
            full = self._full = torch.arange(self.run, self.run + self.width, dtype=torch.int64).view(1, -1)
        return full

    @property
    def lengths(self) -> Tensor:
        """The requests' lengths once the step commits (a run's decode step keeps them as ints until asked)."""
        lengths = self._lengths
        if isinstance(lengths, list):
            lengths = self._lengths = torch.tensor(lengths, dtype=torch.int64)
        return lengths

    def fresh(self, page: int) -> Tensor:
        """The slots of pages this step opened (host): what a rollback frees (all of them where ``last`` is
        ``None``: a page-1 decode step, whose every slot is a page of its own)."""
        locs, last = self.opened
        return locs if last is None else locs[locs // page != last // page]


class _Journal:
    """The forward in progress: what it wrote that the cache has not made its own yet.

    A forward's changes become the cache's (request lengths, layout width, recurrent state slots) only when its
    last layer is done (:meth:`KvpoolsCache._commit`).  A forward that raised part-way leaves the journal open;
    the next cache call that can only belong to a new forward (a layer at or before the last one seen, or the
    same call of a layer twice) rolls it back first, so a retried forward sees the cache as it was before.
    """

    __slots__ = ("cursor", "seen", "state_writes", "step")

    def __init__(self) -> None:
        self.cursor = -1
        """The highest layer whose cache calls have begun in this forward."""
        self.seen: set[tuple[int, str, int]] = set()
        """(layer, call, state index) of the calls made so far."""
        self.step: _Step | None = None
        self.state_writes: list[tuple[_StateLayer, list[int], Tensor, Tensor, Tensor]] = []
        """(layer, request rows, state slots, conv columns, recurrent state) to store at commit."""


class _PoolLayer(CacheLayerMixin):  # type: ignore[misc]
    """One model layer's view of the shared :class:`KvpoolsCache` state (transformers' per-layer interface)."""

    is_sliding = False
    is_croppable = False

    def __init__(self, cache: KvpoolsCache, layer_id: int, sliding_window: int | None = None) -> None:
        super().__init__()
        self._cache = cache
        self.layer_id = layer_id
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self._cache._update_layer(self.layer_id, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The whole layout for a full layer; for a sliding one, what transformers' ``DynamicSlidingWindowLayer``
        advertises (the last ``window - 1`` cached columns and the step's), so the mask and the keys agree."""
        width = self._cache.width
        if self.sliding_window is None:
            return width + query_length, 0
        return min(width, self.sliding_window - 1) + query_length, max(width - self.sliding_window + 1, 0)

    def get_seq_length(self) -> int:
        return self._cache.width

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self._cache.release()

    def reorder_cache(self, beam_idx: Tensor) -> None:
        raise UnsupportedCombinationError(
            "KvpoolsCache does not reorder requests (beam search): generate with num_beams=1."
        )

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise UnsupportedCombinationError(
            "KvpoolsCache does not repeat requests (num_return_sequences > 1 or beam search): one sequence per prompt."
        )

    def batch_select_indices(self, indices: Tensor) -> None:
        raise UnsupportedCombinationError("KvpoolsCache does not drop requests mid-generation: free them with release.")

    def crop(self, tokens_to_remove: int) -> None:
        raise UnsupportedCombinationError("KvpoolsCache cannot crop (assisted decoding): generate without it.")


class _StateLayer(LinearAttentionLayer):  # type: ignore[misc]
    """A recurrent (linear-attention / Mamba) layer whose conv and SSM state live in the plan's state slots.

    transformers' mixers read ``conv_states[0]`` / ``recurrent_states[0]`` of their layer directly and update
    the conv state in place on decode, so this layer keeps the batch's state as working tensors: loaded from the
    requests' slots when the mixer asks ``has_previous_state`` (its first cache call each forward), written back
    when it hands over the new recurrent state (its last).  transformers keeps ``kernel`` conv columns, SGLang's
    pool ``kernel - 1``: the oldest column is shifted out before the next convolution reads the window, so the
    pool keeps the ``kernel - 1`` that matter and a zero column stands in for the other.
    """

    def __init__(self, cache: KvpoolsCache, layer_id: int) -> None:
        super().__init__()
        self._cache = cache
        self.layer_id = layer_id
        self.rows_with_state: set[int] = set()
        """Request rows whose state this layer has written (their prompt went through it)."""

    def load(self) -> bool:
        """Copy the selected requests' state into the working tensors; whether they all have a previous state.

        Called at the layer's first cache call of each forward (whichever the release's mixer makes first), so
        the refusals below come before the mixer computes anything with a state of the wrong batch.
        """
        cache = self._cache
        if not cache._batch:
            raise ConfigError(
                "A recurrent layer runs before the cache knows its requests: pass KvpoolsCache(..., "
                "attention_mask=...) to generate, or select() the requests before the forward."
            )
        rows = [r.row for r in cache._batch]
        have = [row in self.rows_with_state for row in rows]
        if any(have) and not all(have):
            raise ConfigError(
                "A forward mixes requests with and without a recurrent state (prefill and decode): the state layers "
                "run one or the other per batch; prefill new requests in a batch of their own."
            )
        conv_pools, ssm_pool = cache._state_pool.layer_cache(self.layer_id)
        slots = cache._state_slots(rows)
        conv = conv_pools[0][slots]
        zero = conv.new_zeros(*conv.shape[:-1], 1)
        self.conv_states[0] = torch.cat([zero, conv], dim=-1)
        self.recurrent_states[0] = ssm_pool[slots].clone()
        self.conv_kernel_size[0] = conv.shape[-1] + 1
        self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = True
        self.device, self.dtype = conv.device, conv.dtype
        self.has_previous_state[0] = bool(rows) and all(have)
        return bool(self.has_previous_state[0])

    def update_conv_state(self, conv_states: Tensor, state_idx: int = 0, **kwargs: Any) -> Tensor:
        self._cache._state_call(self.layer_id, "update_conv_state", state_idx)
        out: Tensor = super().update_conv_state(conv_states, state_idx, **kwargs)
        return out

    def update_recurrent_state(self, recurrent_states: Tensor, state_idx: int = 0, **kwargs: Any) -> Tensor:
        """The mixer's last cache call: the new state goes to the requests' slots when the forward commits."""
        cache = self._cache
        journal = cache._state_call(self.layer_id, "update_recurrent_state", state_idx)
        out: Tensor = super().update_recurrent_state(recurrent_states, state_idx, **kwargs)
        rows = [r.row for r in cache._batch]
        window = cache._state_pool.layer_cache(self.layer_id)[0][0].shape[-1]
        conv = self.conv_states[0][..., -window:].clone()
        journal.state_writes.append((self, rows, cache._state_slots(rows), conv, out.detach().clone()))
        if self.layer_id == cache._last_cache_layer:
            cache._commit()
        return out

    def reorder_cache(self, beam_idx: Tensor) -> None:
        raise UnsupportedCombinationError(
            "KvpoolsCache does not reorder requests (beam search): generate with num_beams=1."
        )

    def crop(self, tokens_to_remove: int) -> None:
        raise UnsupportedCombinationError("KvpoolsCache cannot crop (assisted decoding): generate without it.")


class KvpoolsCache(Cache):  # type: ignore[misc]
    """A transformers ``Cache`` backed by a kvpools build: pool for K/V, allocator for slots, table for requests.

    ``pools`` is ``kvpools_core.build(plan, device)`` of the model's plan (:func:`plan_for_config`).  With
    ``model.generate``, pass the prompt's ``attention_mask`` (left padding): its zeros are not stored.  Without
    it every input column of the first step is a real token.  A continuous-batching loop drives the cache
    directly: :meth:`add_request`, :meth:`select` before each forward, :meth:`release` when a request ends.
    """

    def __init__(self, pools: Pools, *, attention_mask: Tensor | None = None) -> None:
        self.pools = pools
        self.pool = pools.kv_pool
        self.req_to_token = pools.req_to_token_pool
        self.allocator = pools.allocator
        self.page_size = int(pools.plan.serving.page_size)
        layers = pools.plan.model.layers
        self._state_pool: Any = getattr(self.req_to_token, "mamba_pool", None)
        state_ids = set(self._state_pool.layer_ids) if self._state_pool is not None else set()
        """Recurrent layers: their state lives in the request table's state pool (``HybridReqToTokenPool``)."""
        kinds = {spec.kind for spec in layers if spec.index not in state_ids}
        self.latent = kinds == {_LATENT} and hasattr(self.pool, "set_mla_kv_buffer")
        """MLA: transformers hands the cache the latent and the rope key (``kv_nope``, ``k_rot``), one "head"
        each, which the pool stores as SGLang's latent row (``set_mla_kv_buffer`` / ``get_mla_kv``)."""
        if not (self.latent or kinds <= {_FULL, _SLIDING}) or not hasattr(self.pool, "set_kv_buffer"):
            raise UnsupportedCombinationError(
                f"KvpoolsCache stores the K/V of full and sliding-window attention layers, or MLA latents (beside "
                f"recurrent layers' state slots); the plan of {pools.plan.model.name} (architecture "
                f"{pools.plan.model.architecture!r}) has layers of kind {sorted(kinds)}, which it does not store alike."
            )
        storage = {self.pool.device, self.req_to_token.req_to_token.device}
        if any(torch.device(device).type == "meta" for device in storage):
            raise UnsupportedCombinationError(
                "KvpoolsCache needs pools with storage, but these were built on the meta device (shapes only): "
                "build them with kvpools_core.build(plan, 'cpu') or on the model's accelerator, e.g. 'cuda'."
            )
        self._last_cache_layer = max(spec.index for spec in layers)
        """The forward's last layer: its last cache call commits the forward (:class:`_Journal`)."""
        self._sliding_layers = frozenset(spec.index for spec in layers if spec.kind == _SLIDING)
        windows = {spec.sliding_window for spec in layers if spec.kind == _SLIDING}
        self.window: int | None = max(w for w in windows if w is not None) if windows - {None} else None
        """The widest sliding window (transformers' semantics: a query sees itself and the ``window - 1`` tokens
        before it); the SWA slots of older tokens, which no sliding layer reads again, are freed (``free_swa``),
        as SGLang evicts them."""
        self._evicted: dict[int, int] = {}
        self._only_sliding = kinds == {_SLIDING}
        """Every layer slides (Mistral-7B-v0.1 style): one SWA pool, its slot ids are the token ids, so an evicted
        slot is already free when its request ends."""
        super().__init__(
            layers=[
                _StateLayer(self, spec.index)
                if spec.index in state_ids
                else _PoolLayer(self, spec.index, spec.sliding_window if spec.kind == _SLIDING else None)
                for spec in layers
            ]
        )
        self.width = 0
        """Columns of the right-aligned layout before the next step (transformers' ``past_seen_tokens``)."""
        self._direct_update = not getattr(self, "offloading", False)
        """:meth:`update` skips ``Cache.update`` (whose only other work is offloading, never asked for here)."""
        self.requests: dict[int, _Request] = {}
        """Live requests by request-table row."""
        self._batch: list[_Request] = []
        self._first_counts: list[int] | None = None
        self._journal: _Journal | None = None
        self._last: _Step | None = None
        """The last committed step, while the next forward may extend it (:meth:`_decode_step`)."""
        self._raw = self._raw_buffers()
        self._pool_dtype = self.pool.dtype
        table = self.req_to_token.req_to_token
        self._table_flat: Tensor | None = table.view(-1) if table.is_contiguous() else None
        """The request table as one row (a run's decode step writes its slot by ints: :meth:`_extend_run`)."""
        host = {table.device.type, torch.device(self.pool.device).type, torch.device(self.allocator.device).type}
        self._table_slots: memoryview | None = None
        """The request table's memory as Python ints (``memoryview`` of its ``int32`` entries, row after row) where
        the table, the pool and the allocator are in host memory: a page-1 decode step writes it by ints
        (:meth:`_extend_host`, :meth:`_extend_run`)."""
        if self._table_flat is not None and host == {"cpu"} and table.dtype == torch.int32:
            self._table_slots = memoryview(self._table_flat.numpy())
        if attention_mask is not None:
            self._start_batch(attention_mask)

    # -- the request lifecycle -------------------------------------------------------------------------------------

    def add_request(self) -> int | None:
        """A new request's row in the request-to-token table, or ``None`` when every row is taken."""
        rows = self.req_to_token.alloc(1)
        if rows is None:
            return None
        row = int(rows[0])
        self.requests[row] = _Request(row)
        return row

    def select(self, rows: Sequence[int], new_tokens: Sequence[int] | None = None) -> None:
        """Run the next forward on these requests (one batch row each, in this order).

        ``new_tokens[i]`` is how many of the step's input columns are request ``i``'s real tokens, right-aligned
        (default: every column).  The layout's width becomes the longest selected request, so the caller's
        attention mask is ``[0] * (width - length) + [1] * (length + q)`` per request (:meth:`attention_mask`).
        """
        missing = [row for row in rows if row not in self.requests]
        if missing:
            raise ConfigError(f"select: rows {missing} are not live requests of this cache (add_request first).")
        self._rollback()  # a forward that raised part-way is abandoned: its slots go back
        self._last = None
        self._batch = [self.requests[row] for row in rows]
        self._first_counts = list(new_tokens) if new_tokens is not None else None
        self.width = max((r.length for r in self._batch), default=0)

    def attention_mask(self, query_length: int) -> Tensor:
        """The 2-D attention mask of the selected batch for a step of ``query_length`` right-aligned columns."""
        counts = self._first_counts or [query_length] * len(self._batch)
        columns = torch.arange(self.width + query_length)
        ends = torch.tensor([self.width + query_length] * len(self._batch))
        starts = torch.tensor(
            [self.width - r.length + (query_length - c) for r, c in zip(self._batch, counts, strict=True)]
        )
        return ((columns >= starts[:, None]) & (columns < ends[:, None])).long()

    def length(self, row: int) -> int:
        """Tokens request ``row`` holds in the pool."""
        return int(self.requests[row].length)

    def release(self, rows: Sequence[int] | None = None) -> None:
        """Free the slots and table rows of these requests (default: all), as SGLang frees a finished request.

        Each request's slots are freed on their own, so a free the allocator refuses (slots already free: a double
        free, e.g. through the allocator behind the cache's back) names that request, and every other request is
        still released; the refused request's table row is freed too (``AllocatorError`` after the rest).
        """
        chosen = list(self.requests) if rows is None else list(rows)
        missing = [row for row in chosen if row not in self.requests]
        if missing:
            raise ConfigError(f"release: rows {missing} are not live requests of this cache.")
        twice = sorted({row for row in chosen if chosen.count(row) > 1})
        if twice:
            raise ConfigError(f"release: rows {twice} are given more than once; each request is released once.")
        self._rollback()  # a forward that raised part-way: the pages it opened go back too
        self._last = None
        refused: dict[int, AllocatorError] = {}
        for row in chosen:
            for layer in self.layers:
                if isinstance(layer, _StateLayer):
                    layer.rows_with_state.discard(row)
            request = self.requests.pop(row)
            evicted = self._evicted.pop(row, 0)
            first = evicted if self._only_sliding else 0  # the dual allocator skips evicted SWA slots itself
            if request.length > first:
                slots = self.req_to_token.req_to_token[row, first : request.length].to(torch.int64)
                try:
                    self.allocator.free(slots.to(self.allocator.device))
                except AllocatorError as exc:
                    refused[row] = exc
        if chosen:
            self.req_to_token.free(chosen)
        self._batch = [r for r in self._batch if r.row in self.requests]
        if not self._batch:
            self.width = 0
        if refused:
            row, cause = next(iter(refused.items()))
            raise AllocatorError(
                f"release: the allocator refused to free the slots of request row(s) {sorted(refused)}, first row "
                f"{row}: {cause}. Slots freed twice (a double free: were they freed through the allocator behind "
                f"the cache's back?). Every other request was released, and every request-table row."
            ) from cause

    # -- transformers' Cache -----------------------------------------------------------------------------------------

    def update(
        self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        """transformers' ``Cache.update`` without its hop through the layer object (this cache never offloads:
        the pool holds the K/V), for an attention layer that has run before; otherwise ``Cache.update``."""
        layer = self.layers[layer_idx]
        if type(layer) is _PoolLayer and layer.is_initialized and self._direct_update:
            return self._update_layer(layer_idx, key_states, value_states)
        out: tuple[Tensor, Tensor] = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        return out

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.width

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        """A recurrent layer's first cache call each forward up to transformers 5.20: load the requests' state.

        Without ``layer_idx`` (a question about the cache, not a layer's call): whether every selected request
        has a state in the last recurrent layer; nothing is loaded.
        """
        states = [i for i, layer in enumerate(self.layers) if isinstance(layer, _StateLayer)]
        if not states:
            raise UnsupportedCombinationError("has_previous_state asks about a recurrent layer; this model has none.")
        if layer_idx is None:
            last = self.layers[states[-1]]
            return bool(self._batch) and all(r.row in last.rows_with_state for r in self._batch)
        self._state_call(layer_idx, "has_previous_state", state_idx or 0)
        return bool(self.layers[layer_idx].has_previous_state[0])

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> Tensor | None:
        """A recurrent layer's conv state (transformers 5.21 and later ask it first, or the recurrent state)."""
        self._state_call(layer_idx, "get_conv_state", state_idx)
        layer = self.layers[layer_idx]
        return layer.conv_states[state_idx] if layer.has_previous_state[state_idx] else None

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> Tensor | None:
        """A recurrent layer's recurrent state, loaded from the requests' slots at its first call of a forward."""
        self._state_call(layer_idx, "get_recurrent_state", state_idx)
        layer = self.layers[layer_idx]
        return layer.recurrent_states[state_idx] if layer.has_previous_state[state_idx] else None

    # -- one forward, all or nothing ---------------------------------------------------------------------------------

    def _enter(self, layer_id: int, call: str, state_idx: int = 0) -> tuple[_Journal, bool]:
        """Note a cache call of ``layer_id`` in the forward's journal; whether the layer starts with it.

        A call that cannot belong to the open forward (an earlier layer, or a call the layer already made) means
        that forward raised part-way and this is a new one: the open one is rolled back first.
        """
        journal = self._journal
        key = (layer_id, call, state_idx)
        if journal is not None and (layer_id < journal.cursor or key in journal.seen):
            self._rollback()
            journal = None
        if journal is None:
            journal = self._journal = _Journal()
        starts = layer_id != journal.cursor
        journal.cursor = layer_id
        journal.seen.add(key)
        return journal, starts

    def _state_call(self, layer_id: int, call: str, state_idx: int = 0) -> _Journal:
        """A recurrent layer's cache call: at its first of the forward, load the selected requests' state."""
        layer = self.layers[layer_id]
        if not isinstance(layer, _StateLayer):
            raise UnsupportedCombinationError(f"Layer {layer_id} is an attention layer, it has no recurrent state.")
        journal, starts = self._enter(layer_id, call, state_idx)
        if starts:
            layer.load()
        return journal

    def _commit(self) -> None:
        """The forward's last layer is done: its tokens, layout width and recurrent states become the cache's."""
        journal, self._journal = self._journal, None
        if journal is None:
            return
        for layer, rows, slots, conv, ssm in journal.state_writes:
            conv_pools, ssm_pool = self._state_pool.layer_cache(layer.layer_id)
            conv_pools[0][slots] = conv.to(conv_pools[0].dtype)
            ssm_pool[slots] = ssm.to(ssm_pool.dtype)
            layer.rows_with_state.update(rows)
        step = journal.step
        if step is not None:
            for request, count in zip(step.requests, step.counts, strict=True):
                request.length += count
            self.width = step.width
            self._last = step

    def _rollback(self) -> None:
        """Undo a forward that raised part-way: free the pages it opened, give back the ``new_tokens`` it took.

        The pool's K/V and the table entries it wrote lie beyond the requests' lengths, never read; the state
        slots were not written (that waits for the commit).
        """
        journal, self._journal = self._journal, None
        if journal is None or journal.step is None:
            return
        step = journal.step
        self._first_counts = step.given_counts
        fresh = step.fresh(self.page_size)
        if fresh.numel():
            self.allocator.free(fresh.to(self.allocator.device))

    def _state_slots(self, rows: Sequence[int]) -> Tensor:
        """The state-pool slots of request rows (``HybridReqToTokenPool.get_mamba_indices``)."""
        index = torch.tensor(list(rows), dtype=torch.int64, device=self.req_to_token.req_to_token.device)
        slots: Tensor = self.req_to_token.get_mamba_indices(index).to(torch.int64)
        return slots

    @property
    def batch_size(self) -> int:
        return len(self._batch) if self._batch else -1

    def _start_batch(self, attention_mask: Tensor) -> None:
        """One request per mask row; the mask must be left-padded (zeros, then ones)."""
        mask = attention_mask.to("cpu", torch.int64)
        counts = mask.sum(dim=-1)
        columns = torch.arange(mask.shape[-1])
        expected = (columns >= (mask.shape[-1] - counts)[..., None]).long()
        if mask.dim() != 2 or not torch.equal(mask, expected):
            raise ConfigError(
                "KvpoolsCache needs a left-padded attention_mask (each row zeros, then ones): "
                "set tokenizer.padding_side = 'left' or pad the prompts on the left."
            )
        rows = self.req_to_token.alloc(mask.shape[0])
        if rows is None:
            raise PoolFullError(
                f"The request table has {self.req_to_token.available_size()} free rows, the batch needs "
                f"{mask.shape[0]}: plan with a larger max_running_requests or generate in smaller batches."
            )
        for row in rows:
            self.requests[row] = _Request(row)
        self.select(rows, [int(c) for c in counts])

    def _begin_step(self, key_states: Tensor) -> _Step:
        """Allocate the step's slots, record them in the request table, and precompute the gather."""
        batch, _, query, _ = key_states.shape
        stored = self.pool.dtype
        if stored not in _QUANTISED_KV and stored != key_states.dtype:
            raise ConfigError(
                f"The pool stores {stored} but the model runs in {key_states.dtype}: the cache would round every "
                f"K/V. Load the model in {stored}, or plan with Serving(kv_cache_dtype=...) of the model's dtype "
                f"(SGLang serves a float32 checkpoint in float16, so kvpools plans float16 for it by default)."
            )
        if not self._batch:
            rows = self.req_to_token.alloc(batch)
            if rows is None:
                raise PoolFullError(
                    f"The request table has {self.req_to_token.available_size()} free rows, the batch needs {batch}."
                )
            for row in rows:
                self.requests[row] = _Request(row)
            self._batch = [self.requests[row] for row in rows]
        if len(self._batch) != batch:
            raise ConfigError(
                f"The forward has {batch} batch rows but the cache holds {len(self._batch)} selected requests: one "
                f"row per request (num_beams=1, num_return_sequences=1; a loop selects its batch with select())."
            )
        given = self._first_counts
        counts = given or [query] * batch
        if any(not 0 <= c <= query for c in counts):
            raise ConfigError(f"new_tokens {counts} must each lie in 0..{query} (the step's query length).")
        prefix = [r.length for r in self._batch]
        width = self.width + query
        longest = max((p + c for p, c in zip(prefix, counts, strict=True)), default=0)
        if longest > width:  # checked before anything is allocated or written
            raise ConfigError(f"A request would hold {longest} tokens, more than the layout's width {width}.")
        limit = self.req_to_token.max_context_len
        if longest > limit:
            raise PoolFullError(
                f"A request would hold {longest} tokens, more than the plan's context length: its request-table row "
                f"holds {limit} slots. Plan with a larger Serving(context_length=...), or generate fewer tokens "
                f"(max_new_tokens) and release the request."
            )
        self._evict_out_of_window()
        locs = self._allocate(prefix, counts)
        self._first_counts = None
        rows = torch.tensor([r.row for r in self._batch], dtype=torch.int64)
        count_t = torch.tensor(counts, dtype=torch.int64)
        prefix_t = torch.tensor(prefix, dtype=torch.int64)
        if locs.numel():
            if all(c == 1 for c in counts):  # a decode step: one token per request, at its length
                row_of, col_of = rows, prefix_t
            else:
                row_of = torch.repeat_interleave(rows, count_t)
                col_of = _ranges(prefix_t, count_t)
            self.req_to_token.write((row_of, col_of), locs.to(torch.int32))
        lengths = prefix_t + count_t
        # the slot of every returned row, right-aligned: column c of request b is its token c - (width - length);
        # the columns before its first token read slot 0, the padding slot no allocator hands out, zero in every
        # pool (pools are zeroed and nothing writes it), so a padded column is zeros without a buffer to scatter into
        position = torch.arange(width, dtype=torch.int64)[None, :] - (width - lengths)[:, None]
        slots = self.req_to_token.req_to_token[rows[:, None], position.clamp(min=0)].to(torch.int64)
        gather_src = torch.where(position >= 0, slots, 0).flatten()
        every_column = all(c == query for c in counts)
        write_mask = None if every_column else torch.arange(query)[None, :] >= (query - count_t)[:, None]
        device = key_states.device
        swa_src = gather_src
        if self._sliding_layers:
            # tokens evicted from the SWA pool have no SWA slot any more (it may hold another request's token now):
            # their columns read the padding slot too, zeros, never attended to
            evicted = torch.tensor([self._evicted.get(r.row, 0) for r in self._batch], dtype=torch.int64)
            if bool(evicted.any()):
                swa_src = torch.where(position >= evicted[:, None], slots, 0).flatten()
        pool_device = self.pool.device
        # the slot each request held last: a rollback frees the pages this step opened, not one it held before
        last_held = torch.full_like(prefix_t, -1)
        held = prefix_t > 0
        if bool(held.any()):
            last_held[held] = self.req_to_token.req_to_token[rows[held], prefix_t[held] - 1].to(torch.int64)
        full = gather_src.view(batch, width).to(pool_device)
        run = None
        if batch == 1 and width and self._raw and pool_device.type == "cpu":
            # one request whose slots follow each other (a fresh pool hands them out in order): read as a view
            first, last_slot = full[0, 0].item(), full[0, -1].item()
            if last_slot - first == width - 1 and (width == 1 or bool((full[0, 1:] - full[0, :-1] == 1).all())):
                run = int(first)
        return _Step(
            batch,
            width,
            None if write_mask is None else write_mask.to(device),
            locs.to(pool_device),
            full,
            full if swa_src is gather_src else swa_src.view(batch, width).to(pool_device),
            requests=list(self._batch),
            counts=counts,
            opened=(_host(locs), torch.repeat_interleave(last_held, count_t)),
            given_counts=given,
            rows=rows,
            lengths=lengths,
            run=run,
        )

    def _decode_step(self, key_states: Tensor) -> _Step | None:
        """A decode step of the batch the last forward committed, or ``None`` (then :meth:`_begin_step` decides).

        What :meth:`_begin_step` computes from the request table, for one new token per request, follows from the
        last step: each request's slots are its row of the last layout, its last slot that row's last column,
        and the new layout is the last one with the new slots as one more column.  So a decode step costs one
        allocation, one table write and one concatenation, whatever the requests' lengths (a sliding window's
        evictions change the layout otherwise: those plans take :meth:`_begin_step`).
        """
        last = self._last
        batch = self._batch
        if (
            last is None
            or self._first_counts is not None
            or self.window is not None
            or key_states.shape[2] != 1
            or key_states.shape[0] != len(batch)
            or last.requests != batch
            or last.width != self.width
            or (self._pool_dtype != key_states.dtype and self._pool_dtype not in _QUANTISED_KV)
        ):
            return None
        lengths = [r.length for r in batch]
        if min(lengths) == 0 or max(lengths) + 1 > self.req_to_token.max_context_len:
            return None  # a request without a slot to extend, or past the table's row: _begin_step says which
        n = len(batch)
        if self.page_size == 1 and self._table_slots is not None:
            if last.run is not None:
                return self._extend_run(last)
            return self._extend_host(last, lengths)
        previous = last.full
        tail = None  # page 1: every new slot is a page of its own, a rollback frees them all
        device = self.allocator.device
        if self.page_size == 1:
            locs = self.allocator.alloc(n)
        else:
            tail = previous[:, -1]  # right-aligned: each request's last column is its last token's slot
            seq = last.lengths + 1
            locs = self.allocator.alloc_decode(
                seq if seq.device == device else seq.to(device), tail if tail.device == device else tail.to(device)
            )
        if locs is None:
            raise self._no_room(n)
        if locs.dtype != torch.int64:
            locs = locs.to(torch.int64)
        self.req_to_token.write((last.rows, last.lengths), locs.to(torch.int32))
        pool_device = previous.device
        locs = locs if locs.device == pool_device else locs.to(pool_device)
        full = torch.cat((previous, locs.view(n, 1)), 1)
        self._first_counts = None
        run = last.run
        if run is not None and locs.item() != run + last.width:  # a host pool (run says so): no sync; the run ends
            run = None
        return _Step(
            n,
            self.width + 1,
            None,
            locs,
            full,
            full,
            requests=last.requests,
            counts=[1] * n,
            opened=(_host(locs), None if tail is None else _host(tail)),
            given_counts=None,
            rows=last.rows,
            lengths=last.lengths + 1,
            run=run,
        )

    def _extend_host(self, last: _Step, lengths: list[int]) -> _Step:
        """:meth:`_decode_step` at page size 1 where the allocator, the request table and the pool are in host
        memory: the new slots as Python ints (one ``tolist``), the table written by ints through its memory
        (no ``index_put_`` and no ``int32`` copy), the layout grown by one ``cat``."""
        n = len(lengths)
        locs = self.allocator.alloc(n)
        if locs is None:
            raise self._no_room(n)
        if locs.dtype != torch.int64:
            locs = locs.to(torch.int64)
        new = locs.tolist()
        table = self._table_slots
        assert table is not None
        context = self.req_to_token.max_context_len
        for request, length, slot in zip(last.requests, lengths, new, strict=True):
            table[request.row * context + length] = slot
        full = torch.cat((last.full, locs.view(n, 1)), 1)
        self._first_counts = None
        return _Step(
            n,
            self.width + 1,
            None,
            locs,
            full,
            full,
            requests=last.requests,
            counts=[1] * n,
            opened=(locs, None),
            given_counts=None,
            rows=last.rows,
            lengths=[length + 1 for length in lengths],
        )

    def _extend_run(self, last: _Step) -> _Step:
        """:meth:`_decode_step` of one request on a run of consecutive slots, page size 1: its new slot as a
        Python int, the table written at its length by ints, no layout built (:attr:`_Step.full` makes it when
        the run ends) — what the step needs from torch is the slot's value and one table store."""
        locs = self.allocator.alloc(1)
        if locs is None:
            raise self._no_room(1)
        if locs.dtype != torch.int64:
            locs = locs.to(torch.int64)
        request, run = last.requests[0], last.run
        assert run is not None
        loc = int(locs.item())  # a host pool (a run is one): no device sync
        table = self._table_slots
        assert table is not None
        table[request.row * self.req_to_token.max_context_len + request.length] = loc
        self._first_counts = None
        width = self.width + 1
        return _Step(
            1,
            width,
            None,
            locs,
            None if loc == run + last.width else torch.cat((last.full, locs.view(1, 1)), 1),
            None,
            requests=last.requests,
            counts=[1],
            opened=(locs, None),
            given_counts=None,
            rows=last.rows,
            lengths=[request.length + 1],
            run=run if loc == run + last.width else None,
        )

    def _evict_out_of_window(self) -> None:
        """Free the SWA slots of the batch's tokens no query will see again (``free_swa``; full slots stay).

        The next query of a request holding ``n`` tokens is position ``n``; it sees positions above
        ``n - window``, so positions ``0..n - window`` are out.  Whole pages only, never the page of the last
        token (SGLang's caller contract for ``free_swa``), so an extend never continues an evicted page.
        """
        if self.window is None:
            return
        page = self.page_size
        for request in self._batch:
            out_end = max(0, request.length - self.window + 1) // page * page
            done = self._evicted.get(request.row, 0)
            if out_end > done:
                slots = self.req_to_token.req_to_token[request.row, done:out_end].to(torch.int64)
                self.allocator.free_swa(slots.to(self.allocator.device))
                self._evicted[request.row] = out_end

    def _allocate(self, prefix: list[int], counts: list[int]) -> Tensor:
        """Slots for positions ``prefix[i]..prefix[i]+counts[i]-1`` of every request, flat, request by request."""
        total = sum(counts)
        locs: Tensor | None
        if self.page_size == 1:
            locs = self.allocator.alloc(total)
        else:
            prefix_t = torch.tensor(prefix, dtype=torch.int64)
            seq_t = prefix_t + torch.tensor(counts, dtype=torch.int64)
            rows = torch.tensor([r.row for r in self._batch], dtype=torch.int64)
            last = torch.full_like(prefix_t, -1)
            held = prefix_t > 0
            if bool(held.any()):
                table = self.req_to_token.req_to_token
                last[held] = table[rows[held], prefix_t[held] - 1].to(torch.int64)
            device = self.allocator.device
            if all(c == 1 for c in counts) and bool(held.all()):
                locs = self.allocator.alloc_decode(seq_t.to(device), last.to(device))
            else:
                locs = self.allocator.alloc_extend(prefix_t.to(device), seq_t.to(device), last.to(device), total)
        if locs is None:
            raise self._no_room(total)
        return locs.to(torch.int64)

    def _no_room(self, total: int) -> PoolFullError:
        return PoolFullError(
            f"The allocator has {self.allocator.available_size()} free slots (page size {self.page_size}); this "
            f"step needs {total} more tokens. Plan with more memory, or admit fewer or shorter requests."
        )

    def _update_layer(self, layer_id: int, key_states: Tensor, value_states: Tensor) -> tuple[Tensor, Tensor]:
        """Write the step's real K/V of ``layer_id`` to the pool, read every cached token back, right-aligned."""
        journal = self._journal
        if journal is not None and layer_id > journal.cursor:  # the open forward's next layer: nothing to undo
            journal.cursor = layer_id
            journal.seen.add((layer_id, "update", 0))
        else:
            journal, _ = self._enter(layer_id, "update")
        step = journal.step
        if step is None:  # the forward's first attention layer decides for all
            step = journal.step = self._decode_step(key_states) or self._begin_step(key_states)
        raw = self._raw.get(layer_id)
        if (
            raw is not None
            and key_states.device == self.pool.device
            and raw[2] == (key_states.shape[1], key_states.shape[3], value_states.shape[1], value_states.shape[3])
        ):
            keys = self._through_buffers(raw, step, key_states, value_states)
        else:
            keys = self._through_pool(layer_id, step, key_states, value_states)
        if layer_id == self._last_cache_layer:
            self._commit()
        return keys

    def _through_pool(self, layer_id: int, step: _Step, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        batch, heads, query, head_dim = keys.shape
        v_dim = values.shape[-1]
        device = self.pool.device
        moves = keys.device != device  # on one device, every .to() below would be a no-op call per layer
        raw = None if moves else self._raw.get(layer_id)
        if raw is not None and raw[2] == (heads, head_dim, values.shape[1], v_dim):
            return self._through_buffers(raw, step, keys, values)
        if step.write_mask is None:  # every column is a new token: no mask to pick them with
            new_k = keys.transpose(1, 2).reshape(-1, heads, head_dim)
            new_v = values.transpose(1, 2).reshape(-1, values.shape[1], v_dim)
        else:
            new_k = keys.transpose(1, 2)[step.write_mask]
            new_v = values.transpose(1, 2)[step.write_mask]
        write = self.pool.set_mla_kv_buffer if self.latent else self.pool.set_kv_buffer
        if new_k.shape[0]:
            write(layer_id, step.locs, new_k.to(device) if moves else new_k, new_v.to(device) if moves else new_v)
        window = self.layers[layer_id].sliding_window
        src = step.full if window is None or step.sliding is None else step.sliding
        read = self.pool.get_mla_kv if self.latent else self.pool.get_kv
        # one gather in the returned rows' order (padded and evicted rows read the zero padding slot)
        out_k, out_v = read(layer_id, src.reshape(-1), keys.dtype)
        if moves:
            out_k, out_v = out_k.to(keys.device), out_v.to(keys.device)
        k = out_k.view(batch, step.width, heads, head_dim).transpose(1, 2)
        v = out_v.view(batch, step.width, values.shape[1], v_dim).transpose(1, 2)
        if window is None:
            return k, v
        visible = min(step.width - query, window - 1) + query  # get_mask_sizes' kv_length, before this step
        return k[:, :, -visible:], v[:, :, -visible:]

    def _through_buffers(self, raw: _RawLayer, step: _Step, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`_through_pool` on a pool that stores the model's dtype as is: the layer's K/V buffers directly.

        What ``set_kv_buffer`` and ``get_kv`` do for such a pool, in fewer and cheaper operations: a decode step's
        K/V go to their slots in one ``index_copy_`` each (the ``(batch, heads, 1, dim)`` input against the
        buffer's ``(slots, heads, 1, dim)`` view), and each is read back with one ``index_select`` of whole
        slots (the ``(slots, heads x dim)`` view: one row copy per token, where ``get_kv``'s advanced indexing
        costs 7-20x more on CPU, measured in ``benchmarks/README.md``), seen as ``(batch, heads, width, dim)``
        with one ``as_strided``.  Where the step's one request holds consecutive slots (``_Step.run``) nothing is
        gathered: the returned K/V are that ``as_strided`` view of the buffers themselves (transformers'
        ``DynamicCache`` returns its own tensors too; attention only reads them).
        """
        (k_rows, v_rows), (k_slots, v_slots), (heads, k_dim, v_heads, v_dim), layer_id = raw
        if keys.requires_grad or values.requires_grad:  # a forward outside no_grad: the pool stores values only
            keys, values = keys.detach(), values.detach()
        if step.write_mask is None and keys.shape[2] == 1:
            k_slots.index_copy_(0, step.locs, keys)
            v_slots.index_copy_(0, step.locs, values)
        else:  # a prompt (padded or not): the pool's own write, its shape checks included
            if step.write_mask is None:
                new_k = keys.transpose(1, 2).reshape(-1, heads, keys.shape[-1])
                new_v = values.transpose(1, 2).reshape(-1, values.shape[1], values.shape[-1])
            else:
                new_k = keys.transpose(1, 2)[step.write_mask]
                new_v = values.transpose(1, 2)[step.write_mask]
            if new_k.shape[0]:
                self.pool.set_kv_buffer(layer_id, step.locs, new_k, new_v)
        batch, width = step.batch, step.width
        k_row, v_row = heads * k_dim, v_heads * v_dim
        run = step.run
        if run is not None:  # consecutive slots: the returned K/V are a view of the buffers, nothing copied
            k_at, v_at = k_rows.storage_offset() + run * k_row, v_rows.storage_offset() + run * v_row
        else:
            flat = step.flat
            if flat is None:
                flat = step.flat = step.full.view(-1)
            k_rows, v_rows = k_rows.index_select(0, flat), v_rows.index_select(0, flat)
            k_at, v_at = 0, 0
        # (batch * width, heads x dim) rows seen as (batch, heads, width, dim): one as_strided, not view + transpose
        k = k_rows.as_strided((batch, heads, width, k_dim), (width * k_row, k_dim, k_row, 1), k_at)
        v = v_rows.as_strided((batch, v_heads, width, v_dim), (width * v_row, v_dim, v_row, 1), v_at)
        return k, v

    def _raw_buffers(self) -> dict[int, _RawLayer]:
        """Per full-attention layer, its K/V buffers where the pool stores the model's dtype as is (a plain
        ``MHATokenToKVPool``, one tensor per layer, no scales; no sliding window): :meth:`_through_buffers`."""
        pool = self.pool
        if type(pool) is not MHATokenToKVPool or self._sliding_layers or self.latent:
            return {}
        kv = pool.kv
        if type(kv.codec) is not NativeCodec or kv.k_scale_buffer or kv.v_scale_buffer:
            return {}
        raw: dict[int, _RawLayer] = {}
        for layer in self.layers:
            if isinstance(layer, _StateLayer):
                continue
            i = layer.layer_id - kv.start_layer
            if not 0 <= i < len(kv.layers):
                continue
            k, v = kv.k_buffer[i], kv.v_buffer[i]
            if not all(isinstance(t, Tensor) and t.dim() == 3 and t.is_contiguous() for t in (k, v)):
                continue
            rows, heads, dim = k.shape
            raw[layer.layer_id] = (
                (k.view(rows, heads * dim), v.view(rows, v.shape[1] * v.shape[2])),
                (k.unsqueeze(2), v.unsqueeze(2)),
                (heads, dim, v.shape[1], v.shape[2]),
                layer.layer_id,
            )
        return raw


_RawLayer = tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor], tuple[int, int, int, int], int]
"""A layer's K/V buffers as ``(slots, heads x dim)`` rows, as ``(slots, heads, 1, dim)``, their shapes, its id."""


def _host(tensor: Tensor) -> Tensor:
    """``tensor`` in host memory (itself when it is there: no call per step on CPU)."""
    return tensor if tensor.device.type == "cpu" else tensor.cpu()


def _ranges(starts: Tensor, counts: Tensor) -> Tensor:
    """``cat([arange(s, s + c) for s, c in zip(starts, counts)])`` without a Python loop."""
    total = int(counts.sum())
    if not total:
        return torch.zeros(0, dtype=torch.int64)
    offsets = torch.cumsum(counts, 0) - counts
    within = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(offsets, counts)
    return torch.repeat_interleave(starts, counts) + within
