"""Replay a request trace through a plan's real allocators: the concurrency a split achieves, measured.

A capacity answer ("this split serves N requests of length L at once") is a claim about the pools;
``replay(plan, trace)`` checks it the way an engine would find out, by running SGLang's scheduler
loop, in its simplest faithful form, against the allocators ``build`` constructs from the plan:

* **Allocators.** ``build(plan, "meta")`` builds the plan's pools without memory (and checks their
  bytes); allocators on ``meta`` hold no ids, so the replay builds the same allocators on ``cpu``
  (they hold page ids, not KV: a few MB even for a 60 GiB plan): the core's token / paged allocator
  over ``max_total_num_tokens`` (``allocator_for_plan``), or, when the plan has an ``"swa"`` token
  space beside ``"full"`` (``Plan.counts``), the core's dual ``SWATokenToKVPoolAllocator`` over
  both counts (SGLang's and the dsv4 plugin's allocator for DeepSeek-V4 too: ``build_allocator`` builds
  it over the same full and page-aligned SWA counts).  A compressed token space (``Plan.compression``:
  DeepSeek-V4's ``c4`` and ``c128``, ratio ``r``) has no allocator in SGLang: its DSV4 attention backend
  writes row ``raw_out_loc // compress_ratio`` of the full slot, so it follows the full allocator's pages
  and the replay counts its rows held as the full tokens held ``// r`` (``r`` must divide the page
  size; DeepSeek-V4 asserts ``page % 128 == 0``).  Any other token space is refused.  A plan with
  state slots (``Plan.counts["state_slots"]``, SGLang's ``max_mamba_cache_size``) gets a token
  allocator over them; a request takes one slot plus the ping-pong slots its request table takes
  (``ping_pong_slots`` of the built table, 0 without the extra buffer), as SGLang's
  ``HybridReqToTokenPool.alloc``.  A plan of only SWA tokens (every
  layer slides) is refused: SGLang's ``PureSWATokenToKVPoolAllocator`` is not modelled.
* **Requests.** All arrive at step 0 in trace order (an offline, closed-loop benchmark).  A request
  of ``input_len`` I and ``output_len`` O is prefilled (whole, or in chunks: below) and then takes O
  decode steps, one token each, and holds I + O tokens at the end (SGLang writes the KV of O - 1 of
  them: the one-token difference keeps a request's final length its context length L = I + O, the
  length a capacity answer is about).
* **Chunked prefill** (``Serving.chunked_prefill_size`` C, SGLang's default 8,192 here; ``None``
  prefills every prompt whole in one step, with no per-step limit).  Each step is one prefill pass
  with a budget of C prompt tokens (``PrefillAdder.rem_chunk_tokens``): first the chunked request,
  if any, takes its next chunk (``Scheduler.get_new_batch_prefill`` → ``PrefillAdder.add_chunked_req``;
  one chunked request at a time, ``Scheduler.chunked_req``); then, FCFS, a prompt within what is left
  is admitted whole and charged its page-aligned length, and the first prompt past it takes the rest
  as its first chunk and becomes the chunked request, which ends the pass (``add_one_req_ignore_eos``,
  ``budget_state``).  No request is admitted while a chunked request is unfinished.  A chunk's pages
  are allocated as its tokens arrive, in both pools of an SWA plan (``alloc_extend`` per pass); a
  continuing chunk is capped by the pages free (``available_chunk_tokens``: the full pool's, and the
  SWA pool's less a page) and waits a step when none are.  Between chunks the chunked request's SWA
  tokens that slid out of its window are freed (``_Engine._evict_chunked``: with the radix cache the
  tree locks only the trailing ``ceil_page(window)`` of the prefilled prompt, the rest being
  evictable cache; with the chunk cache ``maybe_evict_swa`` frees below ``pre_len - window`` at each
  extend, ``pre_len`` lagging one chunk under the overlap schedule), so it holds its window and one
  chunk (two with the chunk cache under overlap) while the full pool holds its whole prompt.  Its last
  chunk makes it a running request that decodes in the same step.  Running requests decode in every
  step, prefill pass or not: the modelling choice of SGLang's ``--enable-mixed-chunk`` (without its
  budget cut of one token per running request), where SGLang by default runs a prefill pass as its
  own batch and decodes only in steps without one.  That choice changes only the step count (the
  default adds one decode-free step per prefill pass), not what the pools hold at once: memory moves
  only when a pass allocates or a request decodes, evicts or completes, in either schedule.
* **Admission** (FCFS, as SGLang's ``fcfs`` policy, which keeps the queue in arrival order): the head
  of the queue is admitted while a request-table row is free (``max_running_requests``), its state
  slots are free, and its prompt's (or first chunk's) pages allocate (page aligned: ``ceil(I / page)``
  pages, in both pools of an SWA plan, as ``alloc_extend`` takes them).  ``admission="reserve"`` (the
  default) also keeps every running request's remaining pages free in the full pool (a chunked
  request's prompt included), so a request is only admitted when all can reach their final length:
  this is SGLang's ``PrefillAdder`` for requests whose output length is known (``ignore_eos``:
  new-token ratio 1.0), with exact page counts where SGLang reserves ``ceil(I / page) + page + O``
  tokens per new request and compares strictly (``schedule_policy.py``, ``prefill_budget.py``
  ``PrefillBudget.reserve``) — SGLang's rule admits at most this many.  In an SWA plan a newcomer
  also needs its prompt and first decode page free in the SWA pool (a chunked newcomer: its window
  beside its largest chunk, ``_Engine._prefill_swa``), beyond what each running request still needs
  to reach its steady SWA holding (``swa_window_bound``, or its final length if shorter); a
  prompt's transient SWA pages are not reserved (SGLang reserves none for running requests either;
  a shortfall retracts).
  ``admission="greedy"`` admits while the prompt allocates (SGLang with a new-token ratio near 0):
  decode then runs out and retracts.
* **Decode** (every step, every running request): SGLang's ``ScheduleBatch.check_decode_mem``
  first (``new_tokens_required_next_decode``: one page per request whose length is a multiple of
  the page size, against ``available_size()``, the smaller pool's for SWA); while it fails,
  ``retract_decode``: the request with the fewest output tokens (ties: the longest input) is
  retracted, its tokens and slots freed, and it re-joins the back of the queue
  (``Scheduler._add_request_to_queue(req, is_retracted=True)``) keeping its output, so it is later
  re-prefilled at I + generated tokens; at least one request always stays.  Then SWA eviction,
  then one slot per request (a new page when it crosses a page boundary).  A request that has
  generated O tokens completes and frees everything (SGLang's radix cache keeps finished tokens,
  and its mamba radix cache their states, as evictable cache; a trace of unique prompts never
  reuses them, so freeing them is the same capacity).
* **SWA eviction** (``ScheduleBatch.maybe_evict_swa`` → ``BasePrefixCache.evict_sliding_windows`` →
  ``mem_cache/common.py`` ``free_swa_out_of_window_slots``, SGLang 0.5.23): before a decode step's
  allocation, a request that has already decoded once (``decode_batch_idx >= 1``) at length L with
  E tokens evicted frees SWA pages once ``L - window >= E + interval`` (``_swa_eviction_trigger``;
  interval ``--swa-eviction-interval``, ``SGLANG_SWA_EVICTION_INTERVAL``, 128): E becomes
  ``floor_page(L - keep)``, with ``keep = ceil_page(max(window, page))`` under the radix cache
  (prefix sharing) and ``keep = window`` with ``--disable-radix-cache`` (the chunk cache); the freed
  pages go back through ``free_swa`` (their full pages stay).  The window is the largest
  ``sliding_window`` of the model's layers.  A prompt prefilled in one pass evicts nothing before its
  first decode; a chunked one evicts between its chunks (above).  A request past its first decode
  therefore holds at most ``swa_window_bound`` SWA tokens.

Not modelled: prefix reuse, arrival times, speculative decoding's extra slots, ``--enable-mixed-chunk``'s
smaller chunk budget, DP attention (one worker's pools are replayed), and a plan whose only token space is SWA.

Cost: Python per running request per step plus a few allocator calls per step: ~3 us per
request-step for plain paged plans, 25-50 us for SWA plans (the dual allocator's tensor ops on every
prefill, eviction and completion) on a 2-core VM; 400 requests of 8k tokens at ~70-110 running take
10-20 s.
"""

from __future__ import annotations

import json
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from kvpools_core.errors import ConfigError, short_repr
from kvpools_core.values import Plan

__all__ = [
    "ADMISSIONS",
    "MAX_TRACE_BYTES",
    "ReplayStats",
    "Request",
    "Trace",
    "fixed_trace",
    "load_jsonl_trace",
    "lognormal_trace",
    "replay",
    "swa_window_bound",
    "uniform_trace",
]

Admission = Literal["reserve", "greedy"]
ADMISSIONS: tuple[str, ...] = ("reserve", "greedy")
FULL = "full"
SWA = "swa"


def _positive_int(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"Request.{attribute.name} must be a positive integer, got {value!r}.")


@attrs.frozen
class Request:
    """One request of a trace: its prompt and how many tokens it generates."""

    input_len: int = attrs.field(validator=_positive_int)
    output_len: int = attrs.field(validator=_positive_int)

    @property
    def context_len(self) -> int:
        """Tokens it holds at its end (prompt + output): the L of a capacity answer."""
        return self.input_len + self.output_len


def _request_tuple(requests: Iterable[Request]) -> tuple[Request, ...]:
    return tuple(requests)


@attrs.frozen
class Trace:
    """Requests in arrival order (all arrive at once: an offline benchmark), and where they came from."""

    requests: tuple[Request, ...] = attrs.field(converter=_request_tuple)
    source: str = ""

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def tokens(self) -> int:
        """Prompt plus output tokens of every request."""
        return sum(r.context_len for r in self.requests)


def fixed_trace(input_len: int, output_len: int, count: int) -> Trace:
    """``count`` identical requests: the workload a closed-form capacity answer is about."""
    _check_count(count)
    request = Request(input_len, output_len)
    return Trace((request,) * count, f"fixed {input_len}:{output_len} x {count}")


def lognormal_trace(
    count: int,
    *,
    input_median: int,
    input_p99: int,
    output_median: int,
    output_p99: int,
    seed: int = 0,
    max_len: int | None = None,
) -> Trace:
    """Lengths drawn from log-normals given by median and 99th percentile (chat-like traffic), seeded.

    ``sigma = ln(p99 / median) / z_0.99``; lengths are rounded and clamped to ``1..max_len`` (prompt
    and output alike), so one seed gives one trace on every machine (``random.Random``).
    """
    _check_count(count)
    rng = random.Random(seed)
    in_mu, in_sigma = _lognormal_params(input_median, input_p99, "input")
    out_mu, out_sigma = _lognormal_params(output_median, output_p99, "output")

    def draw(mu: float, sigma: float) -> int:
        value = max(1, round(rng.lognormvariate(mu, sigma)))
        return min(value, max_len) if max_len else value

    requests = [Request(draw(in_mu, in_sigma), draw(out_mu, out_sigma)) for _ in range(count)]
    return Trace(
        requests,
        f"lognormal input {input_median}/{input_p99} output {output_median}/{output_p99} x {count} seed {seed}",
    )


def uniform_trace(count: int, *, input_range: tuple[int, int], output_range: tuple[int, int], seed: int = 0) -> Trace:
    """Lengths drawn uniformly from inclusive ranges, seeded."""
    _check_count(count)
    for name, (lo, hi) in (("input", input_range), ("output", output_range)):
        if not 1 <= lo <= hi:
            raise ConfigError(f"uniform_trace: the {name} range must satisfy 1 <= low <= high, got {lo}..{hi}.")
    rng = random.Random(seed)
    requests = [Request(rng.randint(*input_range), rng.randint(*output_range)) for _ in range(count)]
    return Trace(requests, f"uniform input {input_range} output {output_range} x {count} seed {seed}")


MAX_TRACE_BYTES = 16 << 20
"""The largest JSONL trace kvpools reads: 16 MiB, about 400,000 records of ``{"input_len": ..., "output_len":
...}``, far above the thousands to tens of thousands of requests benchmark traces hold.  A bigger file is refused
before it is read: it would take several times its size in memory, and its planning minutes (a 60 MiB trace:
~30 s and 450 MB through ``capacity --workload``).  Split or sample a larger trace."""


def load_jsonl_trace(path: str | Path) -> Trace:
    """A trace from a JSONL file of ``{"input_len": ..., "output_len": ...}`` records, one per line.

    Blank lines are skipped; other keys are ignored.  A malformed record is refused with a
    ``ConfigError`` naming the file, the line and the field, so a broken trace never replays half;
    so is a file over :data:`MAX_TRACE_BYTES` (before it is read) and a length over
    :data:`kvpools_core.config.TOKENS`.
    """
    from kvpools_core.config import TOKENS

    path = Path(path)
    text = _read_trace(path)
    requests = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not a JSON record ({exc.msg}).") from None
        except ValueError:  # an integer of more than 4,300 digits
            raise ConfigError(f"{where}: the record holds an integer too long to read (over 4,300 digits).") from None
        except RecursionError:  # arrays or objects nested thousands deep
            raise ConfigError(
                f"{where}: the record is nested too deeply to read; a record is one flat object."
            ) from None
        if not isinstance(record, dict):
            raise ConfigError(f"{where}: a record must be a JSON object, got {type(record).__name__}.")
        lengths = []
        for field in ("input_len", "output_len"):
            value = record.get(field)
            if field not in record:
                raise ConfigError(f"{where}: the record has no {field!r} field.")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}: {field!r} must be a positive integer, got {short_repr(value)}.")
            if value > TOKENS.maximum:
                raise ConfigError(
                    f"{where}: {field!r} {short_repr(value)} is beyond any model's context "
                    f"(kvpools reads lengths of at most {TOKENS.maximum:,} tokens)."
                )
            lengths.append(value)
        requests.append(Request(*lengths))
    if not requests:
        raise ConfigError(f"Trace {path} has no records.")
    return Trace(requests, str(path))


def _read_trace(path: Path) -> str:
    """The text of a trace file, refused unread when over :data:`MAX_TRACE_BYTES` (a pipe: once it is)."""
    too_big = (
        f"Trace {path} is over {MAX_TRACE_BYTES:,} bytes, the most kvpools reads (about 400,000 records). "
        f"Split it, or sample the requests that matter."
    )
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise ConfigError(too_big)
        with path.open("rb") as stream:
            raw = stream.read(MAX_TRACE_BYTES + 1)  # bounded: a pipe or a growing file states no size
    except OSError as exc:
        raise ConfigError(f"Cannot read trace {path}: {exc.strerror or exc}.") from exc
    if len(raw) > MAX_TRACE_BYTES:
        raise ConfigError(too_big)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"Trace {path} is not UTF-8 text (byte {exc.start}: {exc.reason}). A trace is UTF-8 JSONL: re-save it "
            f"as UTF-8."
        ) from None


@attrs.frozen
class ReplayStats:
    """What a replay measured.  Concurrency is running requests per decode step."""

    requests: int
    completed: int
    steps: int
    peak_concurrency: int
    mean_concurrency: float
    prompt_tokens: int
    generated_tokens: int
    retractions: int
    peak_tokens_held: Mapping[str, int]
    """Most tokens (whole pages) the allocator had handed out at once, per token space; for a compressed space
    (``Plan.compression``), the most rows its requests held at once (the full tokens held ``// ratio``)."""
    token_capacity: Mapping[str, int]
    """Tokens each token space's allocator can hand out (a compressed space: the rows the plan counts)."""
    free_tokens_at_end: Mapping[str, int] = attrs.field(factory=dict)
    """What each token space has free once the trace is done (its capacity: nothing leaks)."""
    peak_state_slots_held: int = 0
    state_slots: int = 0
    free_state_slots_at_end: int = 0
    peak_swa_tokens_per_request: int = 0
    """Most SWA tokens one request held after a decode step it could evict in (past its first decode)."""
    admission: str = "reserve"
    prefill_chunks: int = 0
    """Prefill passes of a prompt cut by ``chunked_prefill_size`` (0: every prompt was prefilled whole)."""
    peak_swa_tokens_chunked_request: int = 0
    """Most SWA tokens the chunked request held right after a chunk's allocation."""

    @property
    def tokens_served(self) -> int:
        """Prompt plus generated tokens of the requests served (each request's prompt once)."""
        return self.prompt_tokens + self.generated_tokens

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["tokens_served"] = self.tokens_served
        return data


def swa_window_bound(window: int, page_size: int, interval: int) -> int:
    """The most SWA tokens a request holds after a decode step in which it could evict.

    With E evicted tokens (page aligned), no eviction happens while ``L - window < E + interval``, so
    after the step's token ``L + 1 <= E + window + interval``: at most ``ceil_page(window + interval)``
    tokens past E.  An eviction sets E to ``floor_page(L - keep)``, so after the step the request
    holds ``ceil_page(L + 1) - floor_page(L - keep)`` tokens, a whole number of pages below
    ``keep + 2 x page``: ``ceil_page(window) + page`` for both ``keep = window`` (chunk cache) and
    ``keep = ceil_page(max(window, page))`` (radix cache).
    """
    return max(_ceil_to(window + interval, page_size), _ceil_to(window, page_size) + page_size)


def replay(
    plan: Plan, trace: Trace | Iterable[Request], *, admission: Admission = "reserve", device: str = "cpu"
) -> ReplayStats:
    """Run ``trace`` through the plan's allocators and measure the concurrency it achieves.

    See the module docstring for what is modelled and where SGLang does it.  ``device`` is where the
    allocators' free lists live: ``cpu`` (the fast host paths) or an accelerator (every call goes
    through device tensors); ``meta`` holds no ids and is refused.  Raises
    ``ConfigError`` for a request longer than the plan's context length or than a pool can
    hold alone (the replay could never serve it), and for a plan it cannot replay.
    """
    if admission not in ADMISSIONS:
        raise ConfigError(f"replay: admission must be one of {', '.join(ADMISSIONS)}, got {admission!r}.")
    requests = trace.requests if isinstance(trace, Trace) else tuple(trace)
    if not requests:
        raise ConfigError("replay: the trace has no requests.")
    if str(device).startswith("meta"):
        raise ConfigError("replay: allocators on 'meta' hold no ids to hand out; replay on 'cpu'.")
    engine = _Engine(plan, admission, device)
    for index, request in enumerate(requests):
        engine.check_fits(index, request)
    return engine.run(requests)


# --------------------------------------------------------------------------------------------- internals


def _check_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"A trace needs a positive number of requests, got {count!r}.")


def _lognormal_params(median: int, p99: int, what: str) -> tuple[float, float]:
    if not 1 <= median <= p99:
        raise ConfigError(f"lognormal_trace: the {what} lengths need 1 <= median <= p99, got {median} and {p99}.")
    z99 = 2.3263478740408408  # the standard normal's 99th percentile
    return math.log(median), math.log(p99 / median) / z99


def _ceil_to(value: int, page: int) -> int:
    return -(-value // page) * page


class _Running:
    """A request while it holds memory: its length, pages, SWA eviction cursor and state slots."""

    __slots__ = (
        "decodes",
        "evicted",
        "extends",
        "generated",
        "index",
        "input_len",
        "length",
        "output_len",
        "pages",
        "slots",
        "target",
    )

    def __init__(self, index: int, request: Request, generated: int) -> None:
        self.index = index
        self.input_len = request.input_len
        self.output_len = request.output_len
        self.generated = generated
        self.target = request.input_len + generated  # the prompt it prefills (a retracted request: with its output)
        self.length = self.target  # tokens whose slots it holds (fewer while its prompt is prefilled in chunks)
        self.extends = 0  # SGLang's extend_batch_idx: prefill passes (chunks) run so far
        self.pages: list[int] = []
        self.evicted = 0  # SWA tokens freed (page aligned)
        self.decodes = 0  # SGLang's decode_batch_idx
        self.slots: list[int] = []


class _Pages:
    """The plan's token allocator(s), driven a page at a time (a page of 1 token at page size 1).

    Every call goes through the real allocator: ``alloc_pages`` / ``free_pages`` of the paged
    allocator, ``alloc`` / ``free`` of the token allocator, and ``alloc`` / ``free`` / ``free_swa`` of
    the dual SWA allocator (full slot ids in, both pools out).
    """

    def __init__(self, plan: Plan, device: str) -> None:
        import torch

        from kvpools_core.allocators.factory import allocator_for_plan
        from kvpools_core.allocators.paged import PagedAllocator
        from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator

        self._torch = torch
        self.page = page = plan.serving.page_size
        tokens = dict(plan.counts["tokens"])
        self.compression = {space: ratio for space, ratio in plan.compression.items() if space in tokens}
        unknown = sorted(set(tokens) - {FULL, SWA} - set(self.compression))
        if unknown or FULL not in tokens or not tokens[FULL]:
            raise ConfigError(
                f"replay: {plan.model.name} keeps token spaces {sorted(tokens)}; the replay models a full pool, "
                f"optionally with an SWA pool and compressed spaces (Plan.compression) beside it (a model whose "
                f"every layer slides is not modelled)."
            )
        paged = sorted(space for space in self.compression if space in plan.compression_pages)
        if paged:
            raise ConfigError(
                f"replay: the compressed token spaces {paged} of {plan.model.name} have page allocators of their own "
                f"(Plan.compression_pages: SGLang's NPU DeepSeek-V4 c128 pool), which the replay does not model yet; "
                f"`kvpools capacity` answers their worst case."
            )
        uneven = sorted(space for space, ratio in self.compression.items() if page % ratio)
        if uneven:
            raise ConfigError(
                f"replay: the compressed token spaces {uneven} of {plan.model.name} have ratios "
                f"{[self.compression[space] for space in uneven]} that do not divide the page size {page}: a page's "
                f"rows would be shared with its neighbours'."
            )
        allocated = {space: count for space, count in tokens.items() if space not in self.compression}
        self.capacity = {space: count // page * page for space, count in allocated.items()}
        self.compressed_rows = {space: int(tokens[space]) for space in self.compression}
        self.swa = SWA in tokens
        self._dual: SWATokenToKVPoolAllocator | None = None
        self._paged: PagedAllocator | None = None
        if self.swa:
            need_sort = plan.serving.disaggregation_mode in ("prefill", "decode")
            self._dual = SWATokenToKVPoolAllocator(
                self.capacity[FULL], self.capacity[SWA], page, device=device, need_sort=need_sort
            )
            self.allocator: Any = self._dual
        else:
            self.allocator = allocator_for_plan(plan, device, widen_dcp=False)  # pages of page_size per rank
            if isinstance(self.allocator, PagedAllocator):
                self._paged = self.allocator

    def free_pages(self) -> dict[str, int]:
        if self._dual is not None:
            return {
                FULL: self._dual.full_available_size() // self.page,
                SWA: self._dual.swa_available_size() // self.page,
            }
        return {FULL: self.allocator.available_size() // self.page}

    def held(self) -> dict[str, int]:
        """Tokens each allocator has handed out, and the rows each compressed space holds with them.

        A compressed space has no allocator: SGLang's DSV4 attention backend indexes it by the full slot,
        ``raw_out_loc // compress_ratio`` (SGLang 0.5.23 ``layers/attention/deepseek_v4_backend.py`` line 359;
        docs/capacity.md "Compressed space"), so each full page of ``P`` slots holds ``P / r`` rows of it and the
        rows held are the full tokens held ``/ r``.
        """
        held = {space: self.capacity[space] - free * self.page for space, free in self.free_pages().items()}
        for space, ratio in self.compression.items():
            held[space] = held[FULL] // ratio
        return held

    def available(self) -> int:
        """SGLang's ``available_size()`` in pages: the smaller pool's for SWA."""
        return int(self.allocator.available_size()) // self.page

    def alloc(self, count: int) -> list[int] | None:
        """``count`` pages in every pool, as full page ids, or None (nothing changes)."""
        if count == 0:
            return []
        if self._paged is not None:
            return self._paged.alloc_pages(count)
        slots = self.allocator.alloc(count * self.page)
        if slots is None:
            return None
        pages: list[int] = (slots[:: self.page] // self.page).tolist()
        return pages

    def free(self, pages: Sequence[int]) -> None:
        """Give back full pages and whatever SWA pages are still mapped to them."""
        if not pages:
            return
        if self._paged is not None:
            self._paged.free_pages(list(pages))
            return
        self.allocator.free(self._slots(pages))

    def free_swa(self, pages: Sequence[int]) -> None:
        """Give back the SWA pages of full pages that slid out of the window (the full pages stay)."""
        assert self._dual is not None
        if pages:
            self._dual.free_swa(self._slots(pages))

    def _slots(self, pages: Sequence[int]) -> Any:
        torch = self._torch
        return torch.tensor(pages, dtype=torch.int64) * self.page


class _Engine:
    """SGLang's scheduler loop over the real allocators (see the module docstring)."""

    def __init__(self, plan: Plan, admission: Admission, device: str) -> None:
        from kvpools_core.building import build

        pools = build(plan, "meta")  # the plan's pools as built: checks them, and names their request table
        self.plan = plan
        self.admission = admission
        self.pages = _Pages(plan, device)
        self.page = page = self.pages.page
        self.max_requests = plan.max_running_requests
        self.context_len = plan.serving.context_length or plan.model.context_len
        serving = plan.serving
        self.window = 0
        self.keep = 0
        self.interval = serving.swa_eviction_interval
        self.swa_bound_pages = 0
        if self.pages.swa:
            windows = [layer.sliding_window for layer in plan.model.layers if layer.sliding_window]
            if not windows:
                raise ConfigError(f"replay: {plan.model.name} has an SWA pool but no layer with a sliding window.")
            self.window = max(windows)
            prefix_sharing = not serving.radix_cache_disabled
            self.keep = _ceil_to(max(self.window, page), page) if prefix_sharing else self.window
            bound = swa_window_bound(self.window, page, self.interval)
            self.swa_bound_pages = bound // page
        self.chunk = serving.chunked_prefill_size  # None: prompts are prefilled whole
        self.overlap = not serving.disable_overlap_schedule
        self.prefix_sharing = not serving.radix_cache_disabled
        self.chunked: _Running | None = None  # SGLang's Scheduler.chunked_req: at most one at a time
        self.prefill_chunks = 0
        self.peak_swa_chunked = 0
        self.state_slots = int(plan.counts.get("state_slots", 0))
        self.slots_per_request = 0
        self.slot_allocator: Any = None
        if self.state_slots:
            from kvpools_core.allocators.token import TokenAllocator

            self.slots_per_request = 1 + int(getattr(pools.req_to_token_pool, "ping_pong_slots", 0))
            self.slot_allocator = TokenAllocator(self.state_slots, device=device)

    # -- checks -----------------------------------------------------------------------------------

    def check_fits(self, index: int, request: Request) -> None:
        """Refuse a request no schedule can serve: over the context length, or over a pool alone."""
        length = request.context_len
        if length > self.context_len:
            raise ConfigError(
                f"replay: request {index} holds {length:,} tokens (input {request.input_len:,} + output "
                f"{request.output_len:,}), more than the plan's context length {self.context_len:,}."
            )
        pages = -(-length // self.page)
        capacity = self.pages.capacity
        too_long_for_swa = SWA in capacity and self._swa_peak_pages(request) > capacity[SWA] // self.page
        too_long_compressed = any(
            pages * self.page // ratio > self.pages.compressed_rows[space]
            for space, ratio in self.pages.compression.items()
        )
        if pages * self.page > capacity[FULL] or too_long_for_swa or too_long_compressed:
            raise ConfigError(
                f"replay: request {index} ({length:,} tokens) does not fit the plan's pools alone "
                f"({', '.join(f'{space} {count:,} tokens' for space, count in capacity.items())})."
            )
        if self.slots_per_request > self.state_slots:
            raise ConfigError(
                f"replay: a request takes {self.slots_per_request} state slots but the plan has {self.state_slots}."
            )

    def _swa_peak_pages(self, request: Request) -> int:
        """SWA pages a request needs at some point alone: its prompt or chunks, first decode, or the window bound."""
        page = self.page
        final = -(-request.context_len // page)
        prefill_peak, evicted = self._prefill_swa(request.input_len, self.chunk or request.input_len)
        if self.chunk and request.input_len > self.chunk:
            prefill_peak += 1  # a continuing chunk leaves a page of the SWA pool free (available_chunk_tokens)
        first_decode = -(-(request.input_len + 1) // page) - evicted // page
        return min(max(prefill_peak, first_decode, self.swa_bound_pages + 1), final)  # + a step's page before evicting

    def _prefill_swa(self, prompt: int, first_chunk: int) -> tuple[int, int]:
        """SWA pages a prompt holds at most while prefilled alone (first chunk ``first_chunk``, then whole chunks),
        and the tokens its chunks evicted by its end: the chunked request's schedule, without other requests."""
        r = _Running(-1, Request(prompt, 1), 0)
        r.length = 0
        peak = 0
        chunk = first_chunk
        while r.length < prompt:
            self._evict_chunked(r)
            r.length = min(prompt, r.length + chunk)
            r.extends += 1
            peak = max(peak, -(-r.length // self.page) - r.evicted // self.page)
            chunk = self.chunk or prompt
        return peak, r.evicted

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, requests: Sequence[Request]) -> ReplayStats:
        page = self.page
        pages = self.pages
        waiting: deque[tuple[int, int]] = deque((i, 0) for i in range(len(requests)))  # (index, generated)
        running: list[_Running] = []
        capacity = {**pages.capacity, **pages.compressed_rows}
        peak_held = dict.fromkeys(capacity, 0)
        steps = peak = total_running = retractions = completed = 0
        prompt_tokens = generated_tokens = 0
        peak_slots = peak_swa_request = 0
        while waiting or running or self.chunked is not None:
            budget = self.chunk  # SGLang's rem_chunk_tokens: prompt tokens one prefill pass takes
            if self.chunked is not None:
                budget = self._continue_chunk(running, budget)
            if self.chunked is None:
                self._admit(requests, waiting, running, budget)
            if not running and self.chunked is None:
                index, _ = waiting[0]
                raise ConfigError(f"replay: request {index} cannot be admitted into empty pools.")  # check_fits
            retractions += self._make_room(running, waiting)
            steps += 1
            total_running += len(running)
            peak = max(peak, len(running))
            if self.pages.swa:
                self._evict_swa(running)
            needing = [r for r in running if r.length % page == 0]
            new_pages = pages.alloc(len(needing))
            assert new_pages is not None, "check_decode_mem passed, so the decode allocation fits"
            for r, new_page in zip(needing, new_pages, strict=True):
                r.pages.append(new_page)
            for space, held in pages.held().items():
                peak_held[space] = max(peak_held[space], held)
            if self.slot_allocator is not None:
                peak_slots = max(peak_slots, self.state_slots - int(self.slot_allocator.available_size()))
            still: list[_Running] = []
            for r in running:
                r.length += 1
                r.generated += 1
                r.decodes += 1
                generated_tokens += 1
                if self.pages.swa and r.decodes >= 2:  # it could evict at the start of this step
                    peak_swa_request = max(peak_swa_request, len(r.pages) * page - r.evicted)
                if r.generated == r.output_len:
                    completed += 1
                    prompt_tokens += r.input_len
                    self._release(r)
                else:
                    still.append(r)
            running = still
        return ReplayStats(
            requests=len(requests),
            completed=completed,
            steps=steps,
            peak_concurrency=peak,
            mean_concurrency=total_running / steps,
            prompt_tokens=prompt_tokens,
            generated_tokens=generated_tokens,
            retractions=retractions,
            peak_tokens_held=peak_held,
            token_capacity=dict(capacity),
            free_tokens_at_end={space: capacity[space] - held for space, held in pages.held().items()},
            peak_state_slots_held=peak_slots,
            state_slots=self.state_slots,
            free_state_slots_at_end=int(self.slot_allocator.available_size()) if self.slot_allocator else 0,
            peak_swa_tokens_per_request=peak_swa_request,
            admission=self.admission,
            prefill_chunks=self.prefill_chunks,
            peak_swa_tokens_chunked_request=self.peak_swa_chunked if self.pages.swa else 0,
        )

    def _admit(
        self,
        requests: Sequence[Request],
        waiting: deque[tuple[int, int]],
        running: list[_Running],
        budget: int | None,
    ) -> None:
        """FCFS: admit the head of the queue while it fits; the first that does not stops admission.

        With chunked prefill (``budget``: the pass's ``rem_chunk_tokens``) a prompt within the budget is
        prefilled whole and charged its page-aligned length; the first prompt past it takes the rest of the
        budget as its first chunk and becomes the chunked request, ending the pass (``PrefillAdder
        .add_one_req_ignore_eos``; ``budget_state`` stops at ``rem_chunk_tokens <= 0``).
        """
        page = self.page
        reserve = self.admission == "reserve"
        if not waiting or len(running) >= self.max_requests:
            return
        reserved = dict.fromkeys(self.pages.capacity, 0)
        if reserve:  # what running requests still need: their final full pages, their steady SWA holding
            reserved[FULL] = sum(-(-(r.input_len + r.output_len) // page) - len(r.pages) for r in running)
            if self.pages.swa:
                bound = self.swa_bound_pages
                reserved[SWA] = sum(
                    max(0, min(bound, -(-(r.input_len + r.output_len) // page)) - len(r.pages) + r.evicted // page)
                    for r in running
                )
        while waiting and len(running) < self.max_requests and (budget is None or budget > 0):
            index, generated = waiting[0]
            request = requests[index]
            prompt = request.input_len + generated
            first_chunk = prompt if budget is None else min(prompt, budget)
            prompt_pages = -(-first_chunk // page)
            if reserve:
                free = self.pages.free_pages()
                newcomer = _Running(index, request, generated)
                newcomer_needs = self._future_pages(newcomer, prompt_pages=prompt_pages, first_chunk=first_chunk)
                if any(free[space] - reserved[space] < need for space, need in newcomer_needs.items()):
                    return
            slots: list[int] = []
            if self.slot_allocator is not None:
                got = self.slot_allocator.alloc(self.slots_per_request)
                if got is None:
                    return
                slots = got.tolist()
            new_pages = self.pages.alloc(prompt_pages)
            if new_pages is None:
                if slots:
                    self.slot_allocator.free(self._slot_tensor(slots))
                return
            waiting.popleft()
            r = _Running(index, request, generated)
            r.pages = new_pages
            r.slots = slots
            r.extends = 1
            if first_chunk < prompt:  # the first chunk of a longer prompt: the pass ends here
                r.length = first_chunk
                self.chunked = r
                self.prefill_chunks += 1
                self.peak_swa_chunked = max(self.peak_swa_chunked, len(r.pages) * page)
                return
            running.append(r)
            if budget is not None:
                budget -= prompt_pages * page  # _update_prefill_budget charges the page-ceiled extend
            if reserve:
                for space, need in self._future_pages(r).items():
                    reserved[space] += need

    def _future_pages(
        self, r: _Running, *, prompt_pages: int | None = None, first_chunk: int | None = None
    ) -> dict[str, int]:
        """Pages ``r`` still needs beyond what it holds (all it needs when ``prompt_pages`` is given: a newcomer).

        A newcomer's SWA need is its steady holding or its prefill's peak and first decode page, whichever is
        larger: its whole prompt, or, prefilled in chunks (``first_chunk`` below the prompt), its largest
        chunk beside the window it keeps (``_prefill_swa``).
        """
        page = self.page
        final = -(-(r.input_len + r.output_len) // page)
        held = len(r.pages) if prompt_pages is None else 0
        needs = {FULL: final - held}
        if self.pages.swa:
            steady = min(self.swa_bound_pages, final)
            if prompt_pages is None:
                needs[SWA] = max(0, steady - (held - r.evicted // page))
            elif first_chunk is None or first_chunk >= r.target:
                needs[SWA] = max(steady, min(prompt_pages + (r.length % page == 0), final))
            else:
                peak, evicted = self._prefill_swa(r.target, first_chunk)
                first_decode = -(-(r.target + 1) // page) - evicted // page
                needs[SWA] = max(steady, min(max(peak, first_decode), final))
        return needs

    def _continue_chunk(self, running: list[_Running], budget: int | None) -> int | None:
        """The chunked request's next pass (``PrefillAdder.add_chunked_req``): free what slid out of its window,
        then allocate up to ``budget`` more prompt tokens in every pool, capped by the pages free
        (``available_chunk_tokens``: the full and SWA pools' free tokens, a page kept in the SWA pool); with
        none free the chunk waits a step (the hybrid-SWA early return) while running requests decode.  Its
        last chunk makes it a running request, decoding this step.  Returns the budget left to admission.
        """
        r = self.chunked
        assert r is not None and budget is not None
        page = self.page
        if self.pages.swa:
            self._evict_chunked(r)
        free = self.pages.free_pages()
        room_pages = min(free[FULL], free[SWA] - 1) if self.pages.swa else free[FULL]
        room = room_pages * page + len(r.pages) * page - r.length  # the partly filled last page is room too
        tokens = min(budget, r.target - r.length, room)
        if tokens <= 0:
            if not running:  # nothing will free pages for it: check_fits rules this out
                raise ConfigError("replay: the chunked request cannot take its next chunk in otherwise empty pools.")
            return 0
        new_pages = self.pages.alloc(-(-(r.length + tokens) // page) - len(r.pages))
        assert new_pages is not None, "the chunk was capped by the free pages"
        r.pages.extend(new_pages)
        r.length += tokens
        r.extends += 1
        self.prefill_chunks += 1
        self.peak_swa_chunked = max(self.peak_swa_chunked, len(r.pages) * page - r.evicted)
        if r.length < r.target:
            return 0
        self.chunked = None
        running.append(r)
        return budget - _ceil_to(tokens, page)

    def _evict_chunked(self, r: _Running) -> None:
        """Free the SWA pages of a chunked request's prompt that slid out of its window, before its next chunk.

        With the radix cache, ``Scheduler.stash_chunked_request`` → ``checkpoint_kv_cache`` inserts the
        prefilled prompt into the tree before the next pass is scheduled, and the SWA component locks only
        the trailing ``ceil_page(window)`` tokens of it (``unified_cache/components/swa.py``
        ``_maybe_split_leaf_for_swa_lock`` and the window lock; ``prefill_budget.py``: "only the sliding
        window stays locked between chunks"): the rest is evictable tree cache, which the replay frees.
        With the chunk cache, ``ScheduleBatch.maybe_evict_swa`` frees ``[evicted, floor_page(pre_len -
        window))`` at each extend (``free_swa_out_of_window_slots``, interval 1), ``pre_len`` the prefilled
        length, or under the overlap schedule one chunk less and only from the third pass on (the previous
        chunk is still running).  Either way the request holds its window plus the chunk being prefilled
        (two chunks with the chunk cache under overlap).
        """
        page = self.page
        if self.prefix_sharing:
            threshold = r.length - _ceil_to(max(self.window, page), page)
        else:
            pre_len = r.length
            if self.overlap:
                if r.extends < 2 or not self.chunk:
                    return
                pre_len -= self.chunk
            if pre_len - self.window < r.evicted + 1:
                return
            threshold = pre_len - self.window
        new_evicted = max(r.evicted, threshold) // page * page
        if new_evicted > r.evicted:
            self.pages.free_swa(r.pages[r.evicted // page : new_evicted // page])
            r.evicted = new_evicted

    def _make_room(self, running: list[_Running], waiting: deque[tuple[int, int]]) -> int:
        """SGLang's ``check_decode_mem`` / ``retract_decode``: retract until this step's new pages fit."""
        page = self.page
        needed = sum(1 for r in running if r.length % page == 0)
        if needed <= self.pages.available():
            return 0
        # keep the most generated first; ties keep the shorter input (SGLang's length_key, reverse-sorted)
        order = sorted(range(len(running)), key=lambda i: (running[i].generated, -running[i].input_len), reverse=True)
        retracted = 0
        while needed > self.pages.available() and len(order) > 1:
            r = running[order.pop()]
            needed -= r.length % page == 0
            self._release(r)
            waiting.append((r.index, r.generated))
            retracted += 1
        kept = set(order)
        running[:] = [r for i, r in enumerate(running) if i in kept]
        if needed > self.pages.available():  # one request alone: check_fits rules this out
            raise ConfigError("replay: a single request cannot decode in the plan's pools.")
        return retracted

    def _evict_swa(self, running: list[_Running]) -> None:
        """SGLang's ``maybe_evict_swa`` at page granularity (see the module docstring)."""
        page = self.page
        for r in running:
            if r.decodes < 1 or r.length - self.window < r.evicted + self.interval:
                continue
            new_evicted = max(r.evicted, r.length - self.keep) // page * page
            if new_evicted > r.evicted:
                self.pages.free_swa(r.pages[r.evicted // page : new_evicted // page])
                r.evicted = new_evicted

    def _release(self, r: _Running) -> None:
        self.pages.free(r.pages)
        r.pages = []
        if r.slots:
            self.slot_allocator.free(self._slot_tensor(r.slots))
            r.slots = []

    def _slot_tensor(self, slots: list[int]) -> Any:
        import torch

        return torch.tensor(slots, dtype=torch.int64)
