"""What sized a plan's sliding-window pool (:func:`kvpools_core.planning.capacity.window_pool_sizing`): the ratio
where the pool holds SGLang's ratio split of the full tokens, else the plugin that sized it and its note.

SGLang's ratio split (``HybridSWAPoolConfigurator``, ``002_50706b73e02ffb67.txt``; DeepSeek-V4's
``DSV4PoolConfigurator``): SWA tokens = ``int(full x swa_full_tokens_ratio)`` page aligned.  SGLang 0.5.23 does not
size a DeepSeek-V4.1 checkpoint's SWA pool by the ratio when the ratio is unset: cap mode (``_resolve_swa_cap_tokens``)
sizes it from the request cap, and without chunked prefill the configurator uses its own 0.1
(``DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO``), not the unset 0.8 the serving options read.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from kvpools_core import Serving, plan
from kvpools_core.errors import InvalidValueError
from kvpools_core.planning.capacity import window_pool_sizing

V41 = str(Path(__file__).parents[1] / "dsv4" / "configs" / "dsv41_synthetic.json")
"""8 layers of DeepSeek-V4-Flash's dims, compress ratios [0, 1, 2, 1, 4, 128, 2, 0] (tests/dsv4)."""


def test_v41_cap_mode_names_the_cap_not_the_ratio() -> None:
    """20 GiB, the ratio unset, 256 requests, chunk 8192: cap mode's 606,464 SWA tokens
    (``test_dsv41_exact_swa_cap.test_cap_mode_exact_plan_by_hand``), not int(15,704,832 x 0.8) page aligned =
    12,563,712 (the unset ratio the serving options print)."""
    p = plan(V41, Serving(accounting="sglang"), memory="20GiB")
    assert p.serving.swa_full_tokens_ratio == 0.8
    assert p.sizing.token_counts["full"] == 15_704_832
    assert p.sizing.token_counts["swa"] == 606_464 != int(15_704_832 * 0.8) // 256 * 256 == 12_563_712
    sized = window_pool_sizing(p, "swa")
    assert sized is not None
    assert sized.startswith("the dsv4 plugin sized it: SWA pool: SGLang 0.5.23's cap mode")
    assert "606,464 tokens from the request cap" in sized


def test_v41_without_chunked_prefill_names_the_configurators_ratio() -> None:
    """No chunked prefill: no cap mode; the configurator's 0.1 sizes the pool (12,810,752 x 0.1 = 1,281,075,
    page aligned 1,281,024), not the 0.8 the serving options hold."""
    p = plan(V41, Serving(accounting="sglang", chunked_prefill_size=None), memory="20GiB")
    assert p.sizing.token_counts["swa"] == int(12_810_752 * 0.1) // 256 * 256 == 1_281_024
    sized = window_pool_sizing(p, "swa")
    assert sized is not None and "x swa_full_tokens_ratio 0.1) page aligned = 1,281,024 tokens" in sized


def test_a_pool_the_ratio_sized_names_none() -> None:
    """The ratio is the knob: V4.1 with the ratio given (0.3: int(8,004,608 x 0.3) page aligned = 2,401,280),
    DeepSeek-V4-Flash (SGLang's 0.1 for it, an engine default the serving options hold) and gpt-oss-20b's 0.8."""
    given = plan(V41, Serving(accounting="sglang", swa_full_tokens_ratio=0.3), memory="20GiB")
    assert given.sizing.token_counts["swa"] == int(8_004_608 * 0.3) // 256 * 256 == 2_401_280
    assert window_pool_sizing(given, "swa") is None
    flash = plan("deepseek-v4-flash", Serving(), memory="20GiB")
    assert flash.serving.swa_full_tokens_ratio == 0.1
    assert window_pool_sizing(flash, "swa") is None
    assert window_pool_sizing(plan("gpt-oss-20b", Serving(), memory="20GiB"), "swa") is None


def test_the_hybrid_swa_chunk_cap_names_the_cap() -> None:
    """An explicit --max-running-requests with the radix cache off and chunked prefill: SGLang's
    SWAChunkCapPoolConfigurator sizes gpt-oss-20b's SWA pool from the requests, whatever the ratio."""
    p = plan("gpt-oss-20b", Serving(max_running_requests=64, disable_radix_cache=True), memory="20GiB")
    sized = window_pool_sizing(p, "swa")
    assert sized is not None and sized.startswith("the swa plugin sized it: SWA chunk cap")


def test_a_synced_pipeline_stage_names_its_own_sizing_not_a_stale_note() -> None:
    """gpt-oss-20b's chunk cap on two pipeline stages of 10 and 14 layers: a full token costs 5 x 2,048 B on stage 0
    and 7 x 2,048 = 14,336 B on stage 1 (8 KV heads x 64 x K and V x 2 B a layer), so stage 0 alone holds more full
    tokens and is synced down to stage 1's (every stage keeps the smallest).  The SWA cap is the same on both:
    64 x (window 128 + 128 x 1 + page 1 + decode 1) + 2 x 8,192 + 1 = 32,897 tokens.  Stage 0's notes keep the
    pre-sync sentence first (its own, larger full pool); what sized the space is the synced sizing's own statement
    (``PoolSizing.token_space_sizing``), which names the full tokens the plan holds."""
    serving = Serving(max_running_requests=64, disable_radix_cache=True, pp_size=2, pp_layer_partition=(10, 14))
    stage0, stage1 = (plan("gpt-oss-20b", attrs.evolve(serving, pp_rank=r), memory="20GiB") for r in (0, 1))
    full = stage1.sizing.token_counts["full"]
    assert 64 * (128 + 128 + 1 + 1) + 2 * 8192 + 1 == 32_897
    assert stage0.sizing.token_counts == {"full": full, "swa": 32_897}
    first_swa_note = next(note for note in stage0.sizing.notes if note.startswith("SWA"))
    assert f"full pool {full:,} tokens" not in first_swa_note  # the string convention read this stale sentence
    sized = window_pool_sizing(stage0, "swa")
    assert sized is not None and sized.startswith("the swa plugin sized it: SWA chunk cap")
    assert f"full pool {full:,} tokens x 10,240 B" in sized and "32,897 tokens" in sized
    assert f"full pool {full:,} tokens x 14,336 B" in (window_pool_sizing(stage1, "swa") or "")


def test_token_space_sizing_names_counted_spaces_only() -> None:
    sizing = plan("gpt-oss-20b", Serving(max_running_requests=64, disable_radix_cache=True), memory="20GiB").sizing
    assert set(sizing.token_space_sizing) == {"swa"}
    with pytest.raises(InvalidValueError, match=r"token_space_sizing\['c4'\] must be a sentence"):
        attrs.evolve(sizing, token_space_sizing={"c4": "made up"})
    with pytest.raises(InvalidValueError, match=r"token_space_sizing\['swa'\] must be a sentence"):
        attrs.evolve(sizing, token_space_sizing={"swa": " "})
