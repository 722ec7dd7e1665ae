"""kvpools' multi-ended allocators against SGLang 0.5.23's own, step by step, on the same random sequences.

A hypothesis state machine builds one arena (the Mamba pair or the SWA pair,
eager or lazy compaction, page size 1 / 2 / 4) in both, then drives the same
allocs, frees (``free``, ``free_swa``, state-slot frees), idle flushes and
urgent flushes through SGLang's ``UnifiedMambaTokenToKVPoolAllocator`` /
``UnifiedSWATokenToKVPoolAllocator`` (real installed code, in the peers venv)
and kvpools' :class:`UnifiedMambaAllocator` / :class:`UnifiedSWAAllocator`.
After every step the returned ids, the composite's ``available_size()`` and,
for each sub-pool, the watermark, ``available_size()``,
``schedulable_available_size()``, the holes, the live count, the free
virtual ids and both page tables (the physical layout) must be equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpools_core.allocators.unified import UnifiedArena, UnifiedMambaAllocator, UnifiedSWAAllocator
from kvpools_core.allocators.unified_float import UnifiedMambaSWAAllocator
from kvpools_core.parts.unified import mamba_size_full, mamba_slot_full_token_cost, swa_size_full
from tests.unified.peer import Peer, entry, member_state

PEER: Peer | None = None


@pytest.fixture(scope="module", autouse=True)
def peer() -> Iterator[Peer]:
    global PEER
    PEER = Peer()
    yield PEER
    PEER.close()
    PEER = None


FULL = {"kind": "mha", "name": "full", "layers": 2, "grow": "down", "heads": 2, "head_dim": 64}  # 1,024 B entries
MAMBA = {"kind": "mamba", "name": "mamba", "layers": 2, "grow": "up", "conv": [[16, 3]], "temporal": [2, 8, 8]}
SWA = {"kind": "mha", "name": "swa", "layers": 3, "grow": "up", "heads": 2, "head_dim": 64}  # 1,536 B entries


TRI_TOKENS = {"full_tokens": 100, "swa_tokens": 80}  # the tri-pool's boot labels (SGLang takes them as given)


def build(composite: str, total: int, page: int, lazy: bool) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    """kvpools' composite for ``"mamba"`` (full + state), ``"swa"`` (full + SWA) or ``"tri"`` (state | SWA | full)."""
    if composite == "tri":
        specs = [FULL, {**SWA, "grow": "float"}, MAMBA]
    else:
        specs = [FULL, MAMBA] if composite == "mamba" else [FULL, SWA]
    arena = UnifiedArena.build(total, [(entry(s), s["grow"]) for s in specs], page)
    alloc: Any
    if composite == "tri":
        alloc = UnifiedMambaSWAAllocator(
            arena,
            full_max_total_num_tokens=TRI_TOKENS["full_tokens"],
            swa_max_total_num_tokens=TRI_TOKENS["swa_tokens"],
            lazy_compaction=lazy,
        )
    else:
        alloc = (UnifiedMambaAllocator if composite == "mamba" else UnifiedSWAAllocator)(arena, lazy_compaction=lazy)
    members = {"full": alloc.full_attn_allocator}
    if composite != "swa":
        members["mamba"] = alloc.mamba_allocator
    if composite != "mamba":
        members["swa"] = alloc.swa_attn_allocator
    return alloc, members, specs


class UnifiedVsSGLang(RuleBasedStateMachine):
    """Same operations on both sides; equal state after each."""

    @initialize(
        composite=st.sampled_from(["mamba", "swa", "tri"]),
        page=st.sampled_from([1, 2, 4]),
        lazy=st.booleans(),
        total=st.integers(10, 30).map(lambda k: k * 4096),
    )
    def setup(self, composite: str, page: int, lazy: bool, total: int) -> None:
        assert PEER is not None
        self.peer = PEER
        self.composite, self.page = composite, page
        self.alloc, self.members, specs = build(composite, total, page, lazy)
        reply = self.peer.call("new", composite=composite, total=total, page=page, lazy=lazy, specs=specs, **TRI_TOKENS)
        self.reqs: list[list[int]] = []  # token ids per held allocation (full side)
        self.swa_gone: list[list[int]] = []  # allocations whose SWA side free_swa gave back
        self.slots: list[int] = []  # held state slots
        arena = self.alloc.arena
        if composite == "mamba":
            assert reply["size_full"] == self.alloc.size_full == mamba_size_full(arena.geometry["full"])
            assert reply["cost"] == self.alloc.mamba_slot_full_token_cost()
            assert reply["cost"] == mamba_slot_full_token_cost(entry(MAMBA), entry(FULL))
            assert reply["size_mamba"] == self.alloc.size_mamba
        elif composite == "tri":
            assert (reply["size_full"], reply["size_swa"]) == (100, 80) == (self.alloc.size_full, self.alloc.size_swa)
            assert reply["cost"] == self.alloc.mamba_slot_full_token_cost()
            assert reply["cost"] == mamba_slot_full_token_cost(entry(MAMBA), entry(FULL), swa=entry(SWA))
        else:
            assert (
                reply["size_full"]
                == self.alloc.size_full
                == swa_size_full(arena.geometry["full"], arena.geometry["swa"])
            )
            assert reply["size_swa"] == self.alloc.size_swa
        self.compare(reply)

    def compare(self, reply: dict[str, Any], out: Any = "skip") -> None:
        if out != "skip":
            assert reply["out"] == (None if out is None else out.tolist())
        assert reply["available"] == self.alloc.available_size()
        for name, m in self.members.items():
            assert reply[name] == member_state(m), name

    @rule(pages=st.integers(1, 12))
    def alloc(self, pages: int) -> None:
        n = pages * self.page
        out = self.alloc.alloc(n)
        self.compare(self.peer.call("alloc", n=n), out)
        if out is not None:
            self.reqs.append(out.tolist())

    @precondition(lambda self: bool(self.reqs))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        ids = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        self.alloc.free(torch.tensor(ids))
        self.compare(self.peer.call("free", ids=ids))

    @precondition(lambda self: len(self.reqs) > 1)
    @rule(data=st.data())
    def free_every_other(self, data: st.DataObject) -> None:
        """Free every other held allocation in one call: many interior holes at once."""
        start = data.draw(st.integers(0, 1))
        picked, self.reqs = self.reqs[start::2], [r for i, r in enumerate(self.reqs) if i % 2 != start]
        ids = [t for r in picked for t in r]
        self.alloc.free(torch.tensor(ids))
        self.compare(self.peer.call("free", ids=ids))

    @precondition(lambda self: len(self.reqs) > 1)
    @rule(data=st.data())
    def grouped_free(self, data: st.DataObject) -> None:
        """Two frees (and, on SWA, a ``free_full``) inside one free group: applied at its end."""
        self.alloc.free_group_begin()
        self.peer.call("group_begin")
        for _ in range(2):
            ids = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
            self.alloc.free(torch.tensor(ids))
            self.compare(self.peer.call("free", ids=ids))
        if self.swa_gone:
            ids = self.swa_gone.pop()
            self.alloc.free_full(torch.tensor(ids))
            self.compare(self.peer.call("free_full", ids=ids))
        self.alloc.free_group_end()
        self.compare(self.peer.call("group_end"))

    @invariant()
    def bytes_conserved(self) -> None:
        """Each END's band is its live pages plus its holes; the chain's frontiers never cross."""
        if not hasattr(self, "members"):
            return
        for m in self.members.values():
            if m.lazy_compaction:
                assert m._allocated_pages() == m.live_page_count + m.holes.numel()
        full, low = self.members["full"], self.members.get("mamba", self.members.get("swa"))
        assert low is not None
        mid = self.members.get("swa") if self.composite == "tri" else None
        if mid is not None and not mid._transparent():
            assert low._high_frontier() <= mid._low_frontier() <= mid._high_frontier() <= full._low_frontier()
        else:
            assert low._high_frontier() <= full._low_frontier()

    @precondition(lambda self: self.composite != "mamba" and bool(self.reqs))
    @rule(data=st.data())
    def free_swa(self, data: st.DataObject) -> None:
        ids = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        self.alloc.free_swa(torch.tensor(ids))
        self.compare(self.peer.call("free_swa", ids=ids))
        self.swa_gone.append(ids)

    @precondition(lambda self: self.composite != "mamba" and bool(self.swa_gone))
    @rule(data=st.data())
    def free_full(self, data: st.DataObject) -> None:
        ids = self.swa_gone.pop(data.draw(st.integers(0, len(self.swa_gone) - 1)))
        self.alloc.free_full(torch.tensor(ids))
        self.compare(self.peer.call("free_full", ids=ids))

    @precondition(lambda self: self.composite != "swa")
    @rule(n=st.integers(1, 6))
    def mamba_alloc(self, n: int) -> None:
        out = self.alloc.mamba_allocator.alloc(n)
        self.compare(self.peer.call("mamba_alloc", n=n), out)
        if out is not None:
            self.slots.extend(out.tolist())

    @precondition(lambda self: self.composite != "swa" and bool(self.slots))
    @rule(data=st.data())
    def mamba_free(self, data: st.DataObject) -> None:
        picked = data.draw(st.lists(st.sampled_from(self.slots), min_size=1, unique=True))
        self.slots = [s for s in self.slots if s not in picked]
        self.alloc.mamba_allocator.free(torch.tensor(picked))
        self.compare(self.peer.call("mamba_free", ids=picked))

    @rule(data=st.data(), urgent=st.booleans())
    def flush(self, data: st.DataObject, urgent: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.members)))
        m = self.members[name]
        m.flush_for_allocation() if urgent else m.flush_opportunistic()
        self.compare(self.peer.call("flush_urgent" if urgent else "flush", member=name))

    @invariant()
    def translation(self) -> None:
        """Held ids translate to the physical token their page is bound to (SGLang: ``v2p[t // ps] * ps + t % ps``)."""
        if not getattr(self, "reqs", None):
            return
        full = self.members["full"]
        ids = torch.tensor(self.reqs[-1])
        want = full.virtual_to_physical[ids // self.page] * self.page + ids % self.page
        assert torch.equal(full.translate_kv_loc(ids), want)


UnifiedVsSGLang.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestUnifiedVsSGLang = UnifiedVsSGLang.TestCase
