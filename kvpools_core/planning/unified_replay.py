"""Replay a request trace through a unified-memory plan's own allocators: the concurrency the arena achieves.

``unified_concurrency`` (:mod:`kvpools_core.planning.unified`) answers in closed form how many requests of one
length fit when their KV and state draw on one arena; ``replay_unified(plan, trace)`` finds out the way an engine
would, by driving the allocators ``build`` puts over the arena (:class:`~kvpools_core.allocators.unified.
UnifiedMambaAllocator`, SGLang 0.5.23's ``UnifiedMambaTokenToKVPoolAllocator`` contract, differential-tested in
``tests/unified``) with the trace, on the CPU (they hold page ids and tables, never the arena's bytes):

* **Requests** all arrive at step 0 and are served FCFS (an offline, closed-loop benchmark, as
  :func:`kvpools_core.planning.replay.replay`).  A request of prompt I and output O takes its state slots
  (``PoolSizing.state_slots_per_request``: SGLang's 3 with the radix cache, 1 without) from the grow-up END and
  its prompt's pages from the grow-down END when admitted (prefilled whole: chunked prefill is not modelled
  here), then one token per step, a page whenever it crosses a page boundary, and frees its pages and slots
  once it holds I + O tokens.
* **Admission** reserves, in bytes: the head of the queue is admitted while a request-table row is free
  (``max_running_requests``) and the bytes every running request still needs to reach its final length, plus
  the newcomer's final pages and state slots, fit in what the live pages and slots leave of the room between
  the two ENDs' starting frontiers (``UnifiedCapacity.room_bytes``).  That is SGLang's ``PrefillAdder`` for
  requests of known output length (new-token ratio 1.0) with the arena's bytes as the one budget, so the peak
  concurrency of a trace of identical requests is the closed form's answer when the arena binds; the test
  ``test_replay_achieves_the_predicted_concurrency`` checks it.  The allocators still decide: an allocation
  they refuse ends admission (``allocator_refusals``), and a decode page they refuse retracts the running
  request with the fewest output tokens (``retractions``; it re-joins the queue and re-prefills).
* **Compaction.**  Under lazy compaction (SGLang's default) a free leaves holes that are reused first and
  packed when a neighbour is short (``flush_for_allocation``, inside the allocators) or at idle points
  (``flush_opportunistic``: SGLang's scheduler calls it when idle, ``Scheduler`` ``record_scheduler_idle``; the
  replay calls it in a step in which nothing runs; its flush at an overlap-disabled batch boundary is not
  modelled); eager compaction (``--disable-lazy-compaction``) packs the band at every free.  What the holes
  cost is measured: pages moved, and after every step the full END's ``available_size()`` (gap, own holes),
  ``schedulable_available_size()`` (plus the state END's holes an urgent flush would hand back) and its free
  virtual ids (what a dashboard of the id space would show).  ``allocator_seconds`` is the time inside the
  allocator calls (a benchmark figure, never a test's).

* **A hybrid-SWA arena** (``UnifiedSWAAllocator``: full KV down, SWA KV up, one virtual page backed by both) is
  replayed alike, a request's prompt taking joint pages.  Admission reserves each request's closed-form bytes
  (its final full pages, and SWA pages for ``min(context, TokenWindow.per_request)`` tokens).  Decode evicts the
  out-of-window SWA pages as SGLang's scheduler does (``ScheduleBatch.maybe_evict_swa`` →
  ``free_swa_out_of_window_slots``): once ``seq_len - 1 - window >= evicted + SGLANG_SWA_EVICTION_INTERVAL``
  the SWA side of every whole page below ``seq_len - 1 - window`` is released (``free_swa``; its bytes return to
  the gap, where the full side grows).  Simplified: the no-prefix-sharing bound (the radix cache's extra page and
  tree locks are not modelled), no overlap schedule (eviction from the first decode step), whole-prompt prefill
  (no chunk-time eviction).

The three-pool chain is refused: its replay (the floating middle) is not modelled yet.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch

from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.planning.replay import Request, Trace
from kvpools_core.planning.unified import unified_concurrency
from kvpools_core.values import Plan

__all__ = ["UnifiedReplayStats", "replay_unified"]


@attrs.frozen
class UnifiedReplayStats:
    """What a unified replay measured.  Concurrency is running requests per step; tokens are the full END's."""

    requests: int
    completed: int
    steps: int
    lazy_compaction: bool
    peak_concurrency: int
    mean_concurrency: float
    predicted_concurrency: int
    """``unified_concurrency(plan, L).concurrent_requests`` for the trace's longest context ``L``: the peak a
    trace of identical requests reaches (else an upper bound for the longest requests only)."""
    predicted_binding: str
    admissions: int
    """Prefills, re-admissions of retracted requests included."""
    retractions: int
    allocator_refusals: int
    """Admissions the byte reservation allowed but an allocator refused (0 when the closed form is right)."""
    page_moves: int
    """Pages (full pages and state slots) the allocators copied to compact their bands."""
    idle_flushes: int
    max_hidden_tokens: int
    """Most full tokens ``schedulable_available_size()`` exceeded ``available_size()`` by after a step: bytes
    held by the state END's holes, usable only after an urgent flush."""
    steps_with_hidden_tokens: int
    max_free_ids_over_schedulable: int
    """Most free virtual full tokens (the id space) exceeded the schedulable ones by: free ids that are not
    bytes."""
    min_schedulable_tokens: int
    allocator_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class _Timed:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args)
        self.seconds += time.perf_counter() - start
        return out


class _MoveCounter:
    """Stands in for the arena's pool: counts the pages a compaction would copy (no bytes are held)."""

    def __init__(self) -> None:
        self.pages = 0

    def move_physical_pages(self, dst: torch.Tensor, src: torch.Tensor, page_size: int) -> None:
        self.pages += int(dst.numel())


@attrs.define
class _Running:
    index: int
    request: Request
    generated: int
    tokens: int
    pages: list[torch.Tensor]
    slots: torch.Tensor | None
    swa_evicted: int = 0
    """Tokens whose SWA side was released (whole pages; the SWA pair only)."""


def replay_unified(plan: Plan, trace: Trace | Iterable[Request]) -> UnifiedReplayStats:
    """Run ``trace`` through ``plan``'s unified allocators (see the module docstring) and measure what they serve.

    Raises ``UnsupportedCombinationError`` for a plan without an arena or one whose replay is not modelled, and
    ``ConfigError`` for an empty trace or a request the arena cannot hold alone.
    """
    requests = trace.requests if isinstance(trace, Trace) else tuple(trace)
    if not requests:
        raise ConfigError("replay_unified: the trace has no requests.")
    arenas = plan.sizing.arenas
    if arenas and sorted((s.kind, s.grows) for s in arenas[0].sub_pools) == [("kv", "down"), ("kv", "up")]:
        return _SWAEngine(plan).run(requests)
    return _Engine(plan).run(requests)


class _Engine:
    def __init__(self, plan: Plan) -> None:
        from kvpools_core.allocators.unified import UnifiedArena, UnifiedMambaAllocator
        from kvpools_core.parts.unified import SubPoolEntry

        if not plan.sizing.arenas:
            raise UnsupportedCombinationError(
                "replay_unified: the plan has no arena: plan it with --enable-unified-memory."
            )
        (arena,) = plan.sizing.arenas
        kinds = sorted((s.kind, s.grows) for s in arena.sub_pools)
        if kinds != [("kv", "down"), ("state", "up")]:
            raise UnsupportedCombinationError(
                f"kvpools does not replay arena {arena.name!r} with sub-pools "
                f"{[(s.pool, s.kind, s.grows) for s in arena.sub_pools]} yet: only the Mamba pair (full KV down, "
                f"state up) and the hybrid-SWA pair (full KV down, SWA KV up); the three-pool chain's floating middle "
                f"is not modelled."
            )
        self.plan = plan
        full = next(s for s in arena.sub_pools if s.grows == "down")
        state = next(s for s in arena.sub_pools if s.grows == "up")
        entries = [
            (SubPoolEntry(s.pool, s.kind, s.layer_num, s.entry_bytes), s.grows)
            for s in sorted(arena.sub_pools, key=lambda s: s.grows)
        ]
        geometry = UnifiedArena.build(arena.bytes, entries, plan.serving.page_size)
        self.moves = _MoveCounter()
        self.alloc = UnifiedMambaAllocator(
            geometry, full=full.pool, mamba=state.pool, lazy_compaction=arena.lazy_compaction, kvcache=self.moves
        )
        for end in (self.alloc.full_attn_allocator, self.alloc.mamba_allocator):
            end._mover = self.moves.move_physical_pages  # the composite hands its ENDs no pool: count their copies
        self.page = full.page_size
        self.page_bytes = full.page_size * full.entry_bytes
        self.units = max(plan.sizing.state_slots_per_request, 1)
        self.state_bytes = self.units * state.entry_bytes
        self.room = unified_concurrency(plan, self.page).room_bytes
        self.cap = plan.max_running_requests
        self.lazy = arena.lazy_compaction
        self.timed = _Timed()

    def _final_pages(self, request: Request) -> int:
        return -(-request.context_len // self.page)

    def _request_bytes(self, request: Request) -> int:
        return self._final_pages(request) * self.page_bytes + self.state_bytes

    def _after_decode(self, running: list[_Running]) -> None:
        """What a step does after its decode (the SWA pair evicts out-of-window pages)."""

    def run(self, requests: tuple[Request, ...]) -> UnifiedReplayStats:
        for index, request in enumerate(requests):
            alone = self._request_bytes(request)
            if alone > self.room:
                raise ConfigError(
                    f"replay_unified: request {index} ({request.context_len} tokens) needs {alone:,} B of the arena "
                    f"alone, more than its {self.room:,} B: give the plan more memory or drop the request."
                )
        longest = max(r.context_len for r in requests)
        predicted = unified_concurrency(self.plan, longest)
        waiting: deque[tuple[int, int]] = deque((i, 0) for i in range(len(requests)))
        running: list[_Running] = []
        full_end = self.alloc.full_attn_allocator
        steps = completed = admissions = retractions = refusals = idle_flushes = 0
        peak = concurrency_sum = hidden_max = hidden_steps = over_max = 0
        min_sched: int | None = None
        while waiting or running:
            steps += 1
            admitted, refused = self._admit(requests, waiting, running)
            admissions += admitted
            refusals += refused
            retractions += self._decode(running, waiting)
            self._after_decode(running)
            peak = max(peak, len(running))
            concurrency_sum += len(running)
            for r in [r for r in running if r.generated >= r.request.output_len]:
                running.remove(r)
                self._release(r)
                completed += 1
            if not running:
                self.timed(self.alloc.flush_opportunistic)
                idle_flushes += 1
            available, schedulable = full_end.available_size(), full_end.schedulable_available_size()
            free_ids = (full_end.num_pages - full_end.min_page_index) * self.page - full_end.allocated_count()
            hidden_max = max(hidden_max, schedulable - available)
            hidden_steps += schedulable > available
            over_max = max(over_max, free_ids - schedulable)
            min_sched = schedulable if min_sched is None else min(min_sched, schedulable)
            if steps > 100 * sum(r.context_len for r in requests) + 1_000:  # pragma: no cover - a livelock guard
                raise UnsupportedCombinationError("replay_unified: the trace makes no progress (a defect: report it).")
        return UnifiedReplayStats(
            requests=len(requests),
            completed=completed,
            steps=steps,
            lazy_compaction=self.lazy,
            peak_concurrency=peak,
            mean_concurrency=concurrency_sum / steps,
            predicted_concurrency=predicted.concurrent_requests,
            predicted_binding=predicted.binding,
            admissions=admissions,
            retractions=retractions,
            allocator_refusals=refusals,
            page_moves=self.moves.pages,
            idle_flushes=idle_flushes,
            max_hidden_tokens=hidden_max,
            steps_with_hidden_tokens=hidden_steps,
            max_free_ids_over_schedulable=over_max,
            min_schedulable_tokens=min_sched or 0,
            allocator_seconds=self.timed.seconds,
        )

    def _held_bytes(self, running: list[_Running]) -> int:
        return sum(len(r.pages) * self.page_bytes + self.state_bytes for r in running)

    def _future_bytes(self, running: list[_Running]) -> int:
        return sum((self._final_pages(r.request) - len(r.pages)) * self.page_bytes for r in running)

    def _admit(
        self, requests: tuple[Request, ...], waiting: deque[tuple[int, int]], running: list[_Running]
    ) -> tuple[int, int]:
        admitted = 0
        while waiting and len(running) < self.cap:
            index, generated = waiting[0]
            request = requests[index]
            need = self._final_pages(request) * self.page_bytes + self.state_bytes
            if self._held_bytes(running) + self._future_bytes(running) + need > self.room:
                return admitted, 0
            slots = self.timed(self.alloc.mamba_allocator.alloc, self.units)
            if slots is None:
                return admitted, 1
            tokens = request.input_len + generated
            pages = -(-tokens // self.page)
            ids = self.timed(self.alloc.alloc, pages * self.page)
            if ids is None:
                self.timed(self.alloc.mamba_allocator.free, slots)
                return admitted, 1
            waiting.popleft()
            running.append(_Running(index, request, generated, tokens, list(ids.view(pages, self.page)), slots))
            admitted += 1
        return admitted, 0

    def _decode(self, running: list[_Running], waiting: deque[tuple[int, int]]) -> int:
        """One token for every running request, a page at each page boundary; a refused page retracts."""
        retractions = 0
        for r in list(running):
            if r not in running:
                continue
            if r.tokens % self.page == 0:
                ids = self.timed(self.alloc.alloc, self.page)
                while ids is None and len(running) > 1:
                    victim = min(running, key=lambda x: (x.generated, -x.request.input_len))
                    running.remove(victim)
                    self._release(victim)
                    waiting.append((victim.index, victim.generated))
                    retractions += 1
                    if victim is r:
                        break
                    ids = self.timed(self.alloc.alloc, self.page)
                if r not in running:
                    continue
                if ids is None:
                    raise UnsupportedCombinationError(
                        "replay_unified: one request alone cannot take its next page (a defect: report it)."
                    )
                r.pages.append(ids)
            r.tokens += 1
            r.generated += 1
        return retractions

    def _release(self, r: _Running) -> None:
        if r.pages:
            self.timed(self.alloc.free, torch.cat(r.pages))
        if r.slots is not None:
            self.timed(self.alloc.mamba_allocator.free, r.slots)


class _SWAEngine(_Engine):
    """The hybrid-SWA pair: joint pages (full + SWA) per virtual page, out-of-window SWA pages released in decode."""

    def __init__(self, plan: Plan) -> None:
        from kvpools_core.allocators.unified import UnifiedArena, UnifiedSWAAllocator
        from kvpools_core.parts.unified import SubPoolEntry

        (arena,) = plan.sizing.arenas
        self.plan = plan
        full = next(s for s in arena.sub_pools if s.grows == "down")
        swa = next(s for s in arena.sub_pools if s.grows == "up")
        entries = [(SubPoolEntry(s.pool, s.kind, s.layer_num, s.entry_bytes), s.grows) for s in (full, swa)]
        geometry = UnifiedArena.build(arena.bytes, entries, plan.serving.page_size)
        self.moves = _MoveCounter()
        alloc = UnifiedSWAAllocator(
            geometry, full=full.pool, swa=swa.pool, lazy_compaction=arena.lazy_compaction, kvcache=self.moves
        )
        self.swa, self.alloc = alloc, alloc  # type: ignore[assignment]  # the run loop's calls are common to both
        for end in (alloc.full_attn_allocator, alloc.swa_attn_allocator):
            end._mover = self.moves.move_physical_pages
        space = next(p.token_space for p in plan.pools if p.name == swa.pool)
        window = plan.sizing.window(space)
        if window is None:
            raise UnsupportedCombinationError(
                f"replay_unified: the plan records no sliding window for {space!r} tokens (a defect: report it)."
            )
        self.window, self.interval, self.swa_cap = window.window, window.eviction_interval, window.per_request
        self.page = full.page_size
        self.page_bytes = full.page_size * full.entry_bytes
        self.swa_page_bytes = swa.page_size * swa.entry_bytes
        self.units, self.state_bytes = 0, 0
        self.room = unified_concurrency(plan, self.page).room_bytes
        self.cap = plan.max_running_requests
        self.lazy = arena.lazy_compaction
        self.timed = _Timed()

    def _request_bytes(self, request: Request) -> int:
        """``unified_concurrency``'s request bytes: final full pages, SWA pages for the window's worst case."""
        swa_pages = -(-min(request.context_len, self.swa_cap) // self.page)
        return self._final_pages(request) * self.page_bytes + swa_pages * self.swa_page_bytes

    def _admit(
        self, requests: tuple[Request, ...], waiting: deque[tuple[int, int]], running: list[_Running]
    ) -> tuple[int, int]:
        admitted = 0
        while waiting and len(running) < self.cap:
            index, generated = waiting[0]
            request = requests[index]
            reserved = sum(self._request_bytes(r.request) for r in running)
            if reserved + self._request_bytes(request) > self.room:
                return admitted, 0
            tokens = request.input_len + generated
            pages = -(-tokens // self.page)
            ids = self.timed(self.alloc.alloc, pages * self.page)
            if ids is None:
                return admitted, 1
            waiting.popleft()
            running.append(_Running(index, request, generated, tokens, list(ids.view(pages, self.page)), None))
            admitted += 1
        return admitted, 0

    def _after_decode(self, running: list[_Running]) -> None:
        for r in running:
            threshold = r.tokens - 1 - self.window
            if threshold < r.swa_evicted + self.interval:
                continue
            start, stop = r.swa_evicted // self.page, threshold // self.page
            if stop > start:
                self.timed(self.swa.free_swa, torch.cat(r.pages[start:stop]))
                r.swa_evicted = stop * self.page
