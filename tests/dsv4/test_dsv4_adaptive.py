"""DeepSeek-V4 with ``--speculative-adaptive`` (issue 33): the pools follow the largest draft count.

SGLang 0.5.23 sizes two DeepSeek-V4 things by ``max_speculative_num_draft_tokens()`` (``runtime_context.py``
L1982-2000; ``max(candidate_steps) + 1`` = 8 under adaptive speculation with the default tiers, steps 0-7):

* the online c128 state's MTP banks: ``CompressStatePool`` (``deepseek_v4_compress_state.py`` L159-167) has
  ``(size + ring + 1) x (1 + banks)`` rows of ``3 x head_dim`` fp32, ``online_mtp_max_draft_tokens`` =
  ``max_speculative_num_draft_tokens() or 0`` (``_build_dsv4_kv_pool``, ``kv_cache_configurator.py`` L2134), and
  the configurator's ``_get_c128_state_fixed_bytes`` (``pool_configurator.py`` L1505-1525) charges the same;
* ``_assert_ring_serves_draft_tokens`` (``pool_configurator.py`` L1194-1198, L1291-1306): the draft count must fit
  ``get_compress_state_write_pad(ratio, ring)`` = ``ring - window + 2`` (c4: 16 - 8 + 2 = 10; c128: 256 - 128 + 2
  = 130).

``sglang_dsv4_adaptive_peer.py`` runs those methods and the pool class, unchanged, in the peers venv.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
from kvpools_plugins.dsv4.sizing import dsv4_shape
from kvpools_plugins.dsv4.speculative import ring_problems

from kvpools_core import Serving, build
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan

FLASH = "deepseek-v4-flash"
EAGLE = Serving(
    tp_size=8,
    page_size=256,
    max_running_requests=64,
    speculative_algorithm="EAGLE",
    speculative_eagle_topk=1,
    speculative_draft_num_layers=1,
)
ONLINE = attrs.evolve(EAGLE, enable_online_compress=True, enable_online_c128_mtp=True)
C128_LAYERS = 20
ROW = 3 * 512 * 4
"""One online c128 state row: ``3 x head_dim`` (448 + 64) fp32."""


def _adaptive(serving: Serving, **options: object) -> Serving:
    return attrs.evolve(serving, speculative_adaptive=True, **options)  # type: ignore[arg-type]


def test_adaptive_resolves_and_plans() -> None:
    """Adaptive EAGLE on DeepSeek-V4 (no longer refused): SGLang's middle default step 3 gives 4 draft tokens, the
    largest tier 7 gives 8; the compressor rings stay the speculative 16 / 256 and the build is the plan."""
    p = plan(FLASH, _adaptive(EAGLE), memory="40GiB")
    s = p.serving
    assert (s.speculative_num_steps, s.speculative_num_draft_tokens, s.max_speculative_num_draft_tokens) == (3, 4, 8)
    shape = dsv4_shape(p.model, s)
    assert (shape.c4_ring, shape.c128_ring) == (16, 256)
    assert build(p, "meta").allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools}


def _c128_rows(p: Plan) -> int:
    return p.pool("c128_state").bytes // (ROW * C128_LAYERS)


def test_online_c128_banks_follow_the_largest_draft_count() -> None:
    """64 requests: 65 request slots, so the online c128 state (ring 1) has ``(65 + 1 + 1) x (1 + banks)`` rows:
    67 x 5 = 335 with a static 4 draft tokens, 67 x 9 = 603 under adaptive speculation (8 banks)."""
    static = plan(FLASH, attrs.evolve(ONLINE, speculative_num_steps=3, speculative_num_draft_tokens=4), memory="40GiB")
    adaptive = plan(FLASH, _adaptive(ONLINE), memory="40GiB")
    assert static.sizing.sglang_config["c128_state_pool_size"] == 65
    assert adaptive.sizing.sglang_config["c128_state_pool_size"] == 65
    assert _c128_rows(static) == 67 * 5 and static.pool("c128_state").bytes == 67 * 5 * ROW * C128_LAYERS
    assert _c128_rows(adaptive) == 67 * 9 and adaptive.pool("c128_state").bytes == 67 * 9 * ROW * C128_LAYERS
    # the configurator's reservation (sglang accounting) counts the same banks
    assert dsv4_shape(adaptive.model, adaptive.serving).c128_state_fixed_bytes(64) == 67 * 9 * ROW * C128_LAYERS
    assert build(adaptive, "meta").allocated_by_pool() == {pool.name: pool.bytes for pool in adaptive.pools}


def test_a_draft_count_past_the_c4_ring_is_refused_in_sglangs_words() -> None:
    """11 draft tokens exceed the c4 ring's write pad of 10 (16 - 8 + 2): SGLang's configurator asserts."""
    message = (
        "speculative_num_draft_tokens=11 exceeds what the c4 compress state ring can keep resident "
        "(ring_size=16 serves at most 10 draft tokens)."
    )
    with pytest.raises(UnsupportedCombinationError, match=re.escape(message)):
        plan(FLASH, attrs.evolve(EAGLE, speculative_num_steps=10, speculative_num_draft_tokens=11), memory="40GiB")
    plan(FLASH, attrs.evolve(EAGLE, speculative_num_steps=9, speculative_num_draft_tokens=10), memory="40GiB")


def test_an_adaptive_tier_past_the_ring_is_refused(tmp_path: Path) -> None:
    """A config whose largest tier is 10 steps makes the largest draft count 11, whatever the current step."""
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [1, 3, 10]}}))
    serving = _adaptive(EAGLE, speculative_adaptive_config=str(config))
    with pytest.raises(UnsupportedCombinationError, match=re.escape("exceeds what the c4 compress state ring")) as e:
        plan(FLASH, serving, memory="40GiB")
    assert "speculative_adaptive's largest draft count" in str(e.value)


# -- against SGLang's own code (the peers venv) --------------------------------------------------------------


def _peer(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from tests.oracle import locate

    python, _ = locate.require_sglang_peer()
    peer = Path(__file__).with_name("sglang_dsv4_adaptive_peer.py")
    done = subprocess.run(
        [str(python), str(peer)], input=json.dumps(cases), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("online", [False, True], ids=["ring", "online"])
def test_draft_counts_against_sglang(online: bool) -> None:
    """For draft counts 2-12 and 129-131: kvpools refuses exactly where ``_assert_ring_serves_draft_tokens``
    asserts (with its message); with online c128 the state layer and the configurator's reservation are SGLang's."""
    base = ONLINE if online else EAGLE
    counts = [*range(2, 13), 129, 130, 131]
    model = plan(FLASH, Serving(tp_size=8, page_size=256), memory="40GiB").model
    cases = [
        {
            "max_draft_tokens": n,
            "num_req_slots": 65,
            "c4_layers": 21,
            "c128_layers": C128_LAYERS,
            "online": online,
            "head_dim": 512,
        }
        for n in counts
    ]
    answers = _peer(cases)
    for n, sglang in zip(counts, answers, strict=True):
        serving = attrs.evolve(base, speculative_num_steps=n - 1, speculative_num_draft_tokens=n)
        problems = ring_problems(model, serving)
        if "assertion" in sglang:
            assert any(sglang["assertion"] in p for p in problems), (n, sglang, problems)
            continue
        assert problems == [], (n, problems)
        shape = dsv4_shape(model, serving)
        assert shape.c128_state_fixed_bytes(64) == sglang["c128_fixed_bytes"], n
        if online and n <= 10:
            p = plan(FLASH, serving, memory="40GiB")
            assert p.pool("c128_state").bytes == sglang["c128_state_layer_bytes"] * C128_LAYERS, n
