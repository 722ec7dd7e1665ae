"""DeepSeek-V4.1's ``--accounting sglang`` plan fits its budget (issue 33): SGLang 0.5.23's configurator prices the
ratio-1/2 kv_source pools (:mod:`kvpools_plugins.dsv4.v41_budget`).

Before, kvpools followed ref-002's configurator, which charges those layers nothing: the synthetic V4.1 config at
20 GiB with encoder replay planned 113,383,424 full tokens (183.5625 B a token) and built 622.62 % of its budget,
against 17,090,304 under ``--accounting exact``.

The relation asserted, for the pools built at the sglang plan's sizes (every pool charged as ``--accounting
exact`` charges it, :func:`kvpools_plugins.dsv4.buffers.pool_specs`):

* SGLang's own estimate (``full x bytes per full token + reserved pages + fixed bytes``) is within the budget
  (``calculate_pool_sizes`` stops there);
* the pools the configurator prices (``sglang_charged``) exceed that estimate by SGLang's own slack alone, at
  most 2 MiB: the one reserved page of each paged pool (``_num_dsv4_physical_kv_pages``: ``size + page``) and the
  ``ring + 1`` padding rows of the state rings, which its coefficient leaves out (8 SWA pages of 149,760 B are
  1,198,080 B here);
* what goes past the budget is the pools SGLang sizes outside the configurator (``req_to_token``, the allocators'
  free lists, the full-to-SWA mapping), and nothing else;
* the sglang plan holds at least the exact plan's full tokens (in cap mode too: both build SGLang's SWA pool),
  and its extra tokens cost (at SGLang's bytes per full token) no more than those pools outside and the slack:
  they are what pays for them.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from kvpools_plugins.dsv4.sizing import dsv4_shape

from kvpools_core import Serving, plan

V41 = str(Path(__file__).with_name("configs") / "dsv41_synthetic.json")
OUTSIDE = {"req_to_token", "allocator", "swa_allocator", "full_to_swa"}
SLACK = 2 * 2**20


@pytest.mark.parametrize("memory", ["7GiB", "20GiB", "80GiB"])
@pytest.mark.parametrize(
    "serving",
    [
        Serving(enable_encoder_swa_bounded_replay=True),
        Serving(swa_full_tokens_ratio=0.1),
        Serving(swa_full_tokens_ratio=0.8),
        Serving(swa_full_tokens_ratio=0.5, dsv4_kv_layout="v41", max_running_requests=64),
        Serving(),
    ],
    ids=["replay", "ratio-0.1", "ratio-0.8", "ratio-0.5-v41-64", "cap-mode"],
)
def test_the_sglang_plan_fits_its_budget_within_sglangs_slack(serving: Serving, memory: str) -> None:
    sglang = plan(V41, attrs.evolve(serving, accounting="sglang"), memory=memory)
    exact = plan(V41, attrs.evolve(serving, accounting="exact"), memory=memory)
    budget = sglang.budget.budget_bytes
    charged = sum(pool.bytes for pool in sglang.pools if pool.sglang_charged)
    outside = {pool.name: pool.bytes for pool in sglang.pools if not pool.sglang_charged}
    estimate = sglang.sizing.sglang_estimate_bytes
    assert estimate <= budget
    assert charged - estimate <= SLACK
    assert set(outside) <= OUTSIDE
    assert sglang.planned_bytes - budget <= sum(outside.values()) + SLACK
    extra = sglang.max_total_num_tokens - exact.max_total_num_tokens
    assert 0 <= extra * sglang.cell.sglang_bytes_per_token <= sum(outside.values()) + SLACK


def test_the_ratio_path_by_hand() -> None:
    """``--swa-full-tokens-ratio 0.1``, 20 GiB, 256 requests (V4 layout): bytes per SWA token ``585 x 8 + 8 / 256
    x (8,192 + 2,048) x 1`` = 4,680 + 320 = 5,000 (the c4 state ring per SWA page of 256, 0.5.23's
    ``_get_bytes_per_swa_token``); bytes per full token ``0.1 x 5,000 + 179.25 + 6.75 + 653 + 326.5`` = 1,665.5;
    full tokens ``int((21,474,836,480 - 135,790,592 - 2,121,728) / 1,665.5)`` = 12,811,122, page aligned
    12,810,752, with the reserved pages (``12,810,752 x 1,665.5 + 334,336`` = 21,336,641,792 <= 21,336,924,160)
    kept: 12,810,752; SWA ``int(12,810,752 x 0.1)`` page aligned 1,281,024; c4 states ``1,281,024 // 256 x 8`` = 40,032.
    """
    p = plan(V41, Serving(accounting="sglang", swa_full_tokens_ratio=0.1), memory="20GiB")
    config = p.sizing.sglang_config
    assert p.cell.sglang_bytes_per_token == 0.1 * 5000 + 179.25 + 6.75 + 653 + 326.5 == 1665.5
    available = 20 * 2**30 - 135_790_592 - 2_121_728
    assert int(available / 1665.5) == 12_811_122
    assert 12_810_752 * 1665.5 + 334_336 == 21_336_641_792 <= available
    assert config["full_max_total_num_tokens"] == 12_810_752
    assert config["swa_max_total_num_tokens"] == 1_281_024
    assert config["c4_state_pool_size"] == 1_281_024 // 256 * 8 == 40_032


def test_sglangs_swa_cap_mode_by_hand() -> None:
    """The SWA ratio unset on a V4.1 checkpoint (no 0.1 default, ``_deepseek_v4_overrides``), 256 requests, chunk
    8192, the radix cache on: 0.5.23's cap mode (``_resolve_swa_cap_tokens``, ``compute_swa_request_cap``).  Per
    request ``128 + 128 x 1 + 256 + 256`` (window, eviction interval x one draft token, page, a page of decode
    allocation) = 768; ``768 x 256 + 2 x 8192 + 256`` = 213,248; prefix tails ``4 x 256`` of ``128 + 256``:
    393,216; ``ceil_align(606,464, 256)`` = 606,464 SWA slots, set aside at 5,000 B each (585 x 8 + 8 / 256 x
    10,240) = 3,032,320,000 B, the ratio term out of the coefficient (1,165.5 B); full tokens
    ``int((21,474,836,480 - 135,790,592 - 2,121,728 - 3,032,320,000) / 1,165.5)`` = 15,705,366, page aligned
    15,705,088, less a page for the reserved pages (``15,705,088 x 1,165.5 + 334,336`` = 18,304,614,400 >
    18,304,604,160): 15,704,832; c4 states ``606,464 // 256 x 8`` = 18,952.  Before, kvpools sized it with the
    generic 0.8 ratio."""
    p = plan(V41, Serving(accounting="sglang"), memory="20GiB")
    config = p.sizing.sglang_config
    assert p.cell.sglang_bytes_per_token == 1165.5
    assert (768 * 256 + 2 * 8192 + 256) + 4 * 256 * (128 + 256) == 606_464
    available = 20 * 2**30 - 135_790_592 - 2_121_728 - 606_464 * 5000
    assert int(available / 1165.5) == 15_705_366 and available < 15_705_088 * 1165.5 + 334_336
    assert config["swa_max_total_num_tokens"] == 606_464
    assert config["full_max_total_num_tokens"] == 15_704_832
    assert config["c4_state_pool_size"] == 606_464 // 256 * 8 == 18_952
    assert any("cap mode" in note for note in p.sizing.notes)
    # the exact accounting builds the same SWA pool (before: the generic 0.8 ratio, 3,132,160 slots), and solves
    # its full tokens over the pools built (test_dsv41_exact_swa_cap.py)
    exact = plan(V41, Serving(accounting="exact"), memory="20GiB")
    assert exact.sizing.sglang_config["swa_max_total_num_tokens"] == 606_464


@pytest.mark.parametrize("memory", ("7GiB", "40GiB"))
def test_v4_models_keep_ref_002s_budget(memory: str) -> None:
    """A model without ratios 1 / 2 gets no V4.1 terms (the oracle pins its ref-002 arithmetic)."""
    flash = str(Path(__file__).parents[2] / "plugins/dsv4/presets/deepseek-v4-flash.json")
    p = plan(flash, Serving(accounting="sglang", tp_size=4), memory=memory)
    assert dsv4_shape(p.model, p.serving).v41 is None
