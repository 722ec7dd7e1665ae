"""Differential: kvpools' allocators and SGLang's own (the installed 0.5.23) on the same random operations.

SGLang's ``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator`` run in the peers venv
(``sglang_peer_server.py``); each hypothesis step sends the same call to both.  Where kvpools decided to
match SGLang (``docs/allocators.md``, "Allocator contract") the returned slot tensors must be identical:
the paged allocator without ``need_sort`` (``alloc``, ``alloc_extend``, ``alloc_decode``, ``free``, free
groups).  Everywhere ``available_size()`` and whether a call succeeds must agree; the token allocator's
slots differ by design (kvpools reuses freed slots first, SGLang last), and with ``need_sort`` SGLang's
paged ``alloc_extend`` merges released pages earlier (on its upper bound of new pages), so there the
checks are the counts, the slot count and that slots are distinct and live.

Without the peers venv or the shared checkout it skips with the shared-checkout reason (a user's
clone); under ``KVPOOLS_REQUIRE_SHARED=1`` (CI) it fails instead.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpools_core.allocators import PagedAllocator, TokenAllocator
from tests.oracle import locate

PYTHON, BENCH = locate.require_sglang_peer()
SERVER = Path(__file__).with_name("sglang_peer_server.py")


class Peer:
    """SGLang's allocator in the peers venv, one JSON line per call."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [str(PYTHON), str(SERVER), str(BENCH)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self._line()) == {"ready": True}

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the SGLang peer exited ({self.proc.poll()}); see its stderr above")
        return line

    def call(self, op: str, **args: Any) -> tuple[list[int] | None, int]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self._line())
        return reply["out"], reply["available"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module", autouse=True)
def peer() -> Iterator[Peer]:
    global PEER
    PEER = Peer()
    yield PEER
    PEER.close()


PEER: Peer


def i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def as_list(out: torch.Tensor | None) -> list[int] | None:
    return None if out is None else out.tolist()


class SameOperations(RuleBasedStateMachine):
    """Requests prefill, extend, decode and finish (in free groups or not) on both allocators at once."""

    @initialize(page=st.sampled_from([1, 1, 4, 16]), pages=st.integers(4, 24), need_sort=st.booleans())
    def start(self, page: int, pages: int, need_sort: bool) -> None:
        self.page, self.size, self.need_sort = page, pages * page, need_sort
        self.ours = (
            TokenAllocator(self.size, need_sort=need_sort)
            if page == 1
            else PagedAllocator(self.size, page, need_sort=need_sort)
        )
        PEER.call("new", page=page, size=self.size, need_sort=need_sort)
        self.exact = page > 1 and not need_sort  # where kvpools matches SGLang slot for slot
        self.requests: dict[int, list[int]] = {}  # request -> its slots, position by position
        self.next = 0
        self.in_group = False

    def compare(self, ours: torch.Tensor | None, theirs: list[int] | None, n: int) -> list[int] | None:
        got = as_list(ours)
        assert (got is None) == (theirs is None)
        if got is None:
            return None
        assert len(got) == n
        if self.exact:
            assert got == theirs
        live = {s for slots in self.requests.values() for s in slots}
        assert len(set(got)) == n and not set(got) & live and 0 not in got
        return got

    @rule(n=st.integers(1, 40))
    def prefill(self, n: int) -> None:
        if self.page == 1:
            got = self.compare(self.ours.alloc(n), PEER.call("alloc", n=n)[0], n)
        else:
            assert isinstance(self.ours, PagedAllocator)
            out = self.ours.alloc_extend(i64([0]), i64([n]), i64([-1]), n)
            got = self.compare(out, PEER.call("alloc_extend", pre=[0], seq=[n], last=[-1], n=n)[0], n)
        if got is not None:
            self.requests[self.next] = got
            self.next += 1

    @precondition(lambda self: self.page > 1 and self.requests)
    @rule(data=st.data(), grow=st.integers(1, 20))
    def extend(self, data: st.DataObject, grow: int) -> None:
        assert isinstance(self.ours, PagedAllocator)
        reqs = data.draw(st.lists(st.sampled_from(sorted(self.requests)), min_size=1, max_size=3, unique=True))
        pre = [len(self.requests[r]) for r in reqs]
        seq = [p + grow for p in pre]
        last = [self.requests[r][-1] for r in reqs]
        n = grow * len(reqs)
        out = self.ours.alloc_extend(i64(pre), i64(seq), i64(last), n)
        got = self.compare(out, PEER.call("alloc_extend", pre=pre, seq=seq, last=last, n=n)[0], n)
        if got is not None:
            for k, r in enumerate(reqs):
                self.requests[r] += got[k * grow : (k + 1) * grow]

    @precondition(lambda self: self.page > 1 and self.requests)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        assert isinstance(self.ours, PagedAllocator)
        reqs = data.draw(st.lists(st.sampled_from(sorted(self.requests)), min_size=1, max_size=4, unique=True))
        seq = [len(self.requests[r]) + 1 for r in reqs]
        last = [self.requests[r][-1] for r in reqs]
        out = self.ours.alloc_decode(i64(seq), i64(last))
        got = self.compare(out, PEER.call("alloc_decode", seq=seq, last=last)[0], len(reqs))
        if got is not None:
            for k, r in enumerate(reqs):
                self.requests[r].append(got[k])

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        reqs = data.draw(st.lists(st.sampled_from(sorted(self.requests)), min_size=1, max_size=3, unique=True))
        slots = [s for r in reqs for s in self.requests.pop(r)]
        self.ours.free(i64(slots))
        PEER.call("free", slots=slots)

    @rule()
    def group(self) -> None:
        if self.in_group:
            self.ours.free_group_end()
            PEER.call("group_end")
        else:
            self.ours.free_group_begin()
            PEER.call("group_begin")
        self.in_group = not self.in_group

    @invariant()
    def same_free_count(self) -> None:
        if hasattr(self, "ours"):
            assert self.ours.available_size() == PEER.call("available")[1]

    def teardown(self) -> None:
        if getattr(self, "in_group", False):
            self.ours.free_group_end()
            PEER.call("group_end")


TestSameOperations = SameOperations.TestCase
TestSameOperations.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
