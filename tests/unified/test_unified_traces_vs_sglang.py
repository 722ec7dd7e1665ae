"""Long seeded traces through kvpools' unified allocators and SGLang 0.5.23's, compared after every step.

The hypothesis machine (``test_unified_allocator_vs_sglang.py``) shrinks
towards short runs; these fixed traces (200 steps each, both composites,
eager and lazy, page sizes 1 / 2 / 4) reach the states short runs rarely do:
several interior holes under several survivors when a flush runs.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch

from tests.unified.peer import Peer, member_state
from tests.unified.test_unified_allocator_vs_sglang import TRI_TOKENS, build


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


@pytest.mark.parametrize("seed", range(6))
def test_seeded_trace_equals_sglang(peer: Peer, seed: int) -> None:
    rng = random.Random(seed)
    for trial in range(5):
        comp, page, lazy = rng.choice(["mamba", "swa", "tri"]), rng.choice([1, 2, 4]), rng.random() < 0.7
        total = rng.randint(10, 30) * 4096
        alloc, members, specs = build(comp, total, page, lazy)
        reply = peer.call("new", composite=comp, total=total, page=page, lazy=lazy, specs=specs, **TRI_TOKENS)
        reqs: list[list[int]] = []
        slots: list[int] = []
        for step in range(200):
            r = rng.random()
            out = None
            if r < 0.35:
                n = rng.randint(1, 12) * page
                out = alloc.alloc(n)
                reply = peer.call("alloc", n=n)
                assert reply["out"] == (None if out is None else out.tolist())
                if out is not None:
                    reqs.append(out.tolist())
            elif r < 0.55 and reqs:
                ids = reqs.pop(rng.randrange(len(reqs)))
                alloc.free(torch.tensor(ids))
                reply = peer.call("free", ids=ids)
            elif r < 0.65 and comp != "swa":
                n = rng.randint(1, 3)
                got = alloc.mamba_allocator.alloc(n)
                reply = peer.call("mamba_alloc", n=n)
                assert reply["out"] == (None if got is None else got.tolist())
                slots.extend([] if got is None else got.tolist())
            elif r < 0.75 and comp != "swa" and slots and (comp == "mamba" or rng.random() < 0.5):
                slot = slots.pop(rng.randrange(len(slots)))
                alloc.mamba_allocator.free(torch.tensor([slot]))
                reply = peer.call("mamba_free", ids=[slot])
            elif r < 0.75 and comp != "mamba" and reqs:
                ids = reqs.pop(rng.randrange(len(reqs)))
                alloc.free_swa(torch.tensor(ids))
                reply = peer.call("free_swa", ids=ids)
            else:
                name = rng.choice(sorted(members))
                urgent = rng.random() < 0.5
                m = members[name]
                m.flush_for_allocation() if urgent else m.flush_opportunistic()
                reply = peer.call("flush_urgent" if urgent else "flush", member=name)
            where = (seed, trial, step, comp, page, lazy)
            assert reply["available"] == alloc.available_size(), where
            for name, m in members.items():
                assert reply[name] == member_state(m), (*where, name)


@pytest.mark.parametrize("seed", range(3))
def test_seeded_three_pool_trace_equals_sglang(peer: Peer, seed: int) -> None:
    """The Mamba+SWA chain under pressure: state slots come and go under the floating SWA band, so the ENDs
    keep asking the float to open the side facing them (``make_room`` moves pages) and ``free_swa`` leaves
    holes in the float that later requests reuse from alternating ends."""
    rng = random.Random(100 + seed)
    for trial in range(8):
        page, lazy, total = rng.choice([1, 2, 4]), rng.random() < 0.7, rng.randint(10, 30) * 4096
        alloc, members, specs = build("tri", total, page, lazy)
        peer.call("new", composite="tri", total=total, page=page, lazy=lazy, specs=specs, **TRI_TOKENS)
        reqs: list[list[int]] = []
        slots: list[int] = []
        for step in range(300):
            r = rng.random()
            if r < 0.3:
                n = rng.randint(1, 8) * page
                out = alloc.alloc(n)
                reply = peer.call("alloc", n=n)
                assert reply["out"] == (None if out is None else out.tolist())
                reqs += [] if out is None else [out.tolist()]
            elif r < 0.45 and reqs:
                ids = reqs.pop(rng.randrange(len(reqs)))
                alloc.free(torch.tensor(ids))
                reply = peer.call("free", ids=ids)
            elif r < 0.6:
                n = rng.randint(1, 4)
                got = alloc.mamba_allocator.alloc(n)
                reply = peer.call("mamba_alloc", n=n)
                assert reply["out"] == (None if got is None else got.tolist())
                slots.extend([] if got is None else got.tolist())
            elif r < 0.72 and slots:
                slot = slots.pop(rng.randrange(len(slots)))
                alloc.mamba_allocator.free(torch.tensor([slot]))
                reply = peer.call("mamba_free", ids=[slot])
            elif r < 0.85 and reqs:
                ids = reqs.pop(rng.randrange(len(reqs)))
                alloc.free_swa(torch.tensor(ids))
                reply = peer.call("free_swa", ids=ids)
            else:
                name, urgent = rng.choice(sorted(members)), rng.random() < 0.5
                m = members[name]
                m.flush_for_allocation() if urgent else m.flush_opportunistic()
                reply = peer.call("flush_urgent" if urgent else "flush", member=name)
            where = (seed, trial, step, page, lazy)
            assert reply["available"] == alloc.available_size(), where
            for name, m in members.items():
                assert reply[name] == member_state(m), (*where, name)
