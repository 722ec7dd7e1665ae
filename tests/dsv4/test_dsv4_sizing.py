"""DeepSeek-V4 sizing: bytes per full token by hand, sub-pool derivations, validate, exact accounting, CLI."""

from __future__ import annotations

import json
import subprocess

import attrs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kvpools_plugins.dsv4.sizing import dsv4_shape, exact_bytes, exact_pools

from kvpools_core.errors import ConfigError, InsufficientMemoryError, KvpoolsError, UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.values import Serving

GiB = 1 << 30
PAGE = Serving(page_size=256, tp_size=8, swa_full_tokens_ratio=0.8)
"""The hand-computed numbers below take SGLang's generic ratio 0.8, given explicitly: left unset, DeepSeek-V4
takes SGLang's 0.1 (tests/core/test_engine_defaults.py)."""
SGLANG = attrs.evolve(PAGE, accounting="sglang")


def test_flash_bytes_per_full_token_by_hand() -> None:
    """kv row 448 + 2 x 64 + 8 = 584 B; indexer 128 + 4 = 132 B; c4 state 2 x 2 x 512 x 4 = 8192 B, its
    indexer state 2 x 2 x 128 x 4 = 2048 B, ring 8 per SWA page of 128:
    0.8 x 584 x 43 = 20089.6; 1/4 x 584 x 21 = 3066; 1/128 x 584 x 20 = 91.25; 1/4 x 132 x 21 = 693;
    0.8 x 8/128 x 8192 x 21 = 8601.6; 0.8 x 8/128 x 2048 x 21 = 2150.4; sum 34691.85 B."""
    p = plan("deepseek-v4-flash", SGLANG, memory=60 * GiB)
    assert p.cell.sglang_bytes_per_token == pytest.approx(34691.85)
    shape = dsv4_shape(p.model, p.serving)
    assert (shape.kv_bytes, shape.indexer_bytes, shape.c4_state_bytes, shape.c4_indexer_state_bytes) == (
        584,
        132,
        8192,
        2048,
    )
    # EAGLE: rings 16 / 256, and (43 + 1) / 43: 0.8 x 16/128 x 10240 x 21 = 21504 replaces 10752
    eagle = attrs.evolve(
        SGLANG,
        speculative_algorithm="EAGLE",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_draft_num_layers=1,
        speculative_num_draft_tokens=4,
    )
    cell = plan("deepseek-v4-flash", eagle, memory=60 * GiB).cell.sglang_bytes_per_token
    assert cell == pytest.approx((34691.85 - 10752 + 21504) * 44 / 43)
    # bf16 compressor states halve both state terms
    bf16 = attrs.evolve(SGLANG, dsv4_compress_state_dtype="bf16")
    assert plan("deepseek-v4-flash", bf16, memory=60 * GiB).cell.sglang_bytes_per_token == pytest.approx(
        34691.85 - 10752 / 2
    )


def test_the_numbers_at_60_gib() -> None:
    """c128 state: 2048 requests -> 2049 slots x ring 128 = 262272, + 129 rows, to 262528 rows x 1024 x 4 B x 20
    layers = 21,506,293,760 B; full = int((64424509440 - 21506293760) / 34691.85) = 1237126 -> 1236992 (page 256).

    2048 requests given; without them SGLang sets 256 for DeepSeek-V4 (``apply_deepseek_v4_defaults``,
    tests/core/test_engine_defaults.py), and its configurator's estimate (capacity 1,857,050 tokens of a 1M
    context: ``clamp(int(T / ctx x 512), 2048, 4096)`` = 2048) is reached only without one
    (:func:`test_the_configurators_request_estimate`)."""
    s = plan("deepseek-v4-flash", attrs.evolve(SGLANG, max_running_requests=2048), memory=60 * GiB).sizing.sglang_config
    assert dict(s) == {
        "max_total_num_tokens": 1236992,
        "max_running_requests": 2048,
        "full_max_total_num_tokens": 1236992,
        "swa_max_total_num_tokens": 989440,
        "c4_max_total_num_tokens": 309248,
        "c128_max_total_num_tokens": 9664,
        "c4_state_pool_size": 61840,
        "c128_state_pool_size": 262272,
    }


@pytest.mark.parametrize("accounting", ["sglang", "exact"])
@pytest.mark.parametrize("memory", [40 * GiB, 60 * GiB, 123 * GiB + 4567])
def test_sub_pools_follow_full_tokens(accounting: str, memory: int) -> None:
    """c4 = full // 4 and c128 = full // 128 (before HiSparse), SWA = int(full x ratio) page aligned,
    c4 state = SWA // 128 x ring 8; HiSparse ratio 4 shrinks c4 alone to full // 16."""
    for preset in ("deepseek-v4-flash", "deepseek-v4-pro"):
        p = plan(preset, attrs.evolve(PAGE, accounting=accounting), memory=memory)
        c = p.sizing.sglang_config
        full = c["full_max_total_num_tokens"]
        assert full % 256 == 0 and full == p.max_total_num_tokens
        assert c["c4_max_total_num_tokens"] == full // 4
        assert c["c128_max_total_num_tokens"] == full // 128
        assert c["swa_max_total_num_tokens"] == int(full * 0.8) // 256 * 256
        assert c["c4_state_pool_size"] == c["swa_max_total_num_tokens"] // 128 * 8
        assert c["c128_state_pool_size"] == (p.max_running_requests + 1) * 128
        for accounting in ("sglang", "exact"):
            hisparse = attrs.evolve(
                PAGE,
                accounting=accounting,
                enable_hisparse=True,
                disable_radix_cache=True,
                hisparse_config='{"host_to_device_ratio": 4}',
            )
            h = plan(preset, hisparse, memory=memory).sizing.sglang_config
            assert h["c4_max_total_num_tokens"] == h["full_max_total_num_tokens"] // 16
            assert h["c128_max_total_num_tokens"] == h["full_max_total_num_tokens"] // 128


@pytest.mark.parametrize("memory", [12 * GiB, 60 * GiB])
def test_exact_plan_fits_and_is_the_largest(memory: int) -> None:
    """Exact accounting: every pool build allocates fits the budget, and one page more would not."""
    for serving in (PAGE, attrs.evolve(PAGE, max_running_requests=64), attrs.evolve(PAGE, enable_online_compress=True)):
        p = plan("deepseek-v4-flash", serving, memory=memory)
        assert p.planned_bytes <= memory
        shape = dsv4_shape(p.model, p.serving)
        more = sum(x.bytes for x in exact_pools(p.model, p.serving, shape, p.max_total_num_tokens + 256))
        assert more > memory
        assert p.cost.bytes_for(**p.counts) == p.planned_bytes


def test_validate_rejects_before_sizing() -> None:
    cases = [
        (Serving(page_size=64, accounting="sglang"), "page_size must be multiple of 128 for compressed attention"),
        (Serving(page_size=128), "In paged swa mode, page_size must be 256"),
        (
            attrs.evolve(PAGE, enable_online_compress=True, dsv4_compress_state_dtype="bfloat16"),
            "online c128 state must stay float32",
        ),
        (
            attrs.evolve(
                PAGE,
                enable_online_compress=True,
                speculative_algorithm="EAGLE",
                speculative_eagle_topk=1,
                speculative_num_draft_tokens=4,
            ),
            "does not support speculative decode (MTP) yet",
        ),
        (
            attrs.evolve(
                PAGE,
                enable_online_compress=True,
                enable_online_c128_mtp=True,
                speculative_algorithm="EAGLE",
                speculative_eagle_topk=2,
                speculative_num_draft_tokens=4,
            ),
            "EAGLE top-k 1 only",
        ),
        (
            attrs.evolve(
                PAGE,
                enable_online_compress=True,
                enable_online_c128_mtp=True,
                speculative_algorithm="EAGLE",
                speculative_eagle_topk=1,
            ),
            "requires speculative_num_draft_tokens",
        ),
        (attrs.evolve(PAGE, hisparse_config='{"host_to_device_ratio": 4}'), "or drop hisparse_config"),
    ]
    for serving, message in cases:
        with pytest.raises(UnsupportedCombinationError) as error:
            plan("deepseek-v4-flash", serving, memory=60 * GiB)
        assert message in str(error.value), str(error.value)
    # the experimental path is accepted with EAGLE top-k 1 and draft tokens; at 128 with sglang accounting too
    ok = attrs.evolve(
        PAGE,
        enable_online_compress=True,
        enable_online_c128_mtp=True,
        speculative_algorithm="EAGLE",
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        speculative_num_steps=3,
        speculative_draft_num_layers=1,
    )
    plan("deepseek-v4-flash", ok, memory=60 * GiB)
    plan("deepseek-v4-flash", Serving(page_size=128, accounting="sglang"), memory=60 * GiB)


def test_serving_options_validate_and_alias() -> None:
    assert Serving(dsv4_compress_state_dtype="bf16").dsv4_compress_state_dtype == "bfloat16"
    assert Serving(dsv4_compress_state_dtype="FP32").dsv4_compress_state_dtype == "float32"
    for bad in (
        "{",
        "[4]",
        '{"host_to_device_ratio": 0}',
        '{"host_to_device_ratio": 2.5}',
        '{"top_k": 100, "device_buffer_size": 10}',
    ):
        with pytest.raises(ConfigError, match="hisparse_config"):
            Serving(hisparse_config=bad)
    with pytest.raises(ConfigError, match="dsv4_compress_state_dtype"):
        Serving(dsv4_compress_state_dtype="float16")


def run(exe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_plan_end_to_end(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    args = ("plan", "deepseek-v4-flash", "--tp-size", "8", "--page-size", "256", "--memory", "60GiB")
    args += ("--swa-full-tokens-ratio", "0.8", "--max-running-requests", "2048")
    out = run(kvpools_exe, cli_env, *args, "--accounting", "sglang")
    assert out.returncode == 0, out.stderr
    assert "c128_state_pool_size = 262,272" in out.stdout
    assert "SGLang's DSV4PoolConfigurator: c128 state fixed bytes 21,506,293,760" in out.stdout
    assert (
        "decided by platform_traits: cuda; parse_model_config: dsv4; estimate_cell_size: dsv4; size_pools: dsv4"
        in out.stdout
    )
    out = run(
        kvpools_exe,
        cli_env,
        *args,
        "--json",
        "--accounting",
        "sglang",
        "--dsv4-compress-state-dtype",
        "bf16",
        "--enable-hisparse",
        "--disable-radix-cache",
        "--hisparse-config",
        '{"host_to_device_ratio": 4}',
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    config = data["plan"]["sizing"]["sglang_config"]
    assert config["c4_max_total_num_tokens"] == config["full_max_total_num_tokens"] // 16
    assert data["plan"]["serving"]["dsv4_compress_state_dtype"] == "bfloat16"
    out = run(kvpools_exe, cli_env, "plan", "deepseek-v4-flash", "--memory", "60GiB", "--page-size", "64")
    assert out.returncode != 0 and "page_size must be multiple of 128" in out.stderr + out.stdout


def test_hisparse_under_exact_accounting_plans_the_allocator() -> None:
    """Issue 32: DeepSeek-V4 with HiSparse under exact accounting is planned (it was refused), with the device bytes
    of ``DeepSeekV4HiSparseTokenToKVPoolAllocator`` (``mem_cache/allocator/hisparse.py``; ref-000 lines 2166-2170).

    TP 8, 60 GiB, ratio 4 (SGLang's 256 requests; the paged pools with SGLang 0.5.23's physical page count):
    1,865,984 full tokens (1,742,592 without HiSparse); c4 = 1,865,984 // 16 = 116,624 rows, c128 = // 128 =
    14,578.  ``hisparse_attn_allocator``: a paged allocator of the c4 rows by the c4 page 256 // 4 = 64:
    116,624 // 64 = 1,822 pages, 8 x 1,822 + 8 x 64 = 15,088 B.  ``full_to_hisparse_device_index_mapping``:
    int64, ``c4_logical_size`` (c128 x 32 = 466,496) + 64 zeros and one -1: 466,561 x 8 = 3,732,488 B.  The data
    pointers: 21 c4 layers x 8 B = 168 B."""
    hisparse = attrs.evolve(
        PAGE, enable_hisparse=True, disable_radix_cache=True, hisparse_config='{"host_to_device_ratio": 4}'
    )
    p = plan("deepseek-v4-flash", hisparse, memory=60 * GiB)
    config = p.sizing.sglang_config
    assert (p.max_total_num_tokens, config["c4_max_total_num_tokens"], config["c128_max_total_num_tokens"]) == (
        1865984,
        116624,
        14578,
    )
    assert p.pool("c4_hisparse_allocator").bytes == 15088
    assert p.pool("c4_hisparse_mapping").bytes == 3732488
    assert p.pool("c4_hisparse_ptrs").bytes == 168
    assert sum(pool.bytes for pool in p.sizing.pools) <= 60 * GiB
    # the most tokens: one page more no longer fits
    shape = dsv4_shape(p.model, p.serving)
    assert exact_bytes(p.model, p.serving, shape, 1865984 + 256) > 60 * GiB
    assert plan("deepseek-v4-flash", PAGE, memory=60 * GiB).max_total_num_tokens == 1742592
    # the cost model prices the pools as they are
    for name in ("c4_hisparse_allocator", "c4_hisparse_mapping"):
        pool = p.pool(name)
        assert pool.cost is not None
        assert pool.cost.bytes_for(tokens=p.sizing.token_counts[pool.cost.token_space]) == pool.bytes


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 2,
             "speculative_num_draft_tokens": 4},
            "supports linear speculation only",
        ),
        (
            {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
             "speculative_num_draft_tokens": 4, "speculative_adaptive": True},
            "--speculative-adaptive is not supported",
        ),
    ],
)  # fmt: skip
def test_hisparse_refuses_what_validate_hisparse_refuses(change: dict[str, object], words: str) -> None:
    """``validate_hisparse`` (``arg_groups/hisparse_hook.py``): linear speculation only, no adaptive steps."""
    serving = attrs.evolve(PAGE, enable_hisparse=True, disable_radix_cache=True, **change)
    with pytest.raises(UnsupportedCombinationError, match=words):
        plan("deepseek-v4-flash", serving, memory=60 * GiB)


def test_budget_eaten_by_the_c128_state_says_so() -> None:
    """SGLang reserves the c128 state for the request count before dividing by the full-token bytes: for 4,096
    requests at 20 GiB on TP 8 that reservation alone is over the budget, and the error must name it, not the page."""
    serving = Serving(tp_size=8, page_size=256, accounting="sglang", max_running_requests=4096)
    shape = dsv4_shape(plan("deepseek-v4-flash", serving, memory="80GiB").model, serving)
    with pytest.raises(InsufficientMemoryError) as failure:
        plan("deepseek-v4-flash", serving, memory="20GiB")
    message = str(failure.value)
    fixed = int(message.split("after ")[1].split(" B")[0].replace(",", ""))
    assert fixed > 20 * (1 << 30)
    assert fixed == shape.c128_state_fixed_bytes(4096)
    assert "of c128 state reserved for the request count first" in message


def test_each_cost_line_prices_the_tokens_its_slots_are() -> None:
    """Issue 29: the report read ``indexer_c4: 88,704 B/c128 token``: the c4 indexer's slots are c4 tokens
    (``c4_logical_size = c128 tokens x 32``), 132 B x 21 c4 layers = 2,772 B each, 64 to a 256-token page
    (256 / 4), 177,408 B; it is sized by c128 tokens, 32 c4 tokens per c128 token (2,772 x 32 = 88,704).  Its fixed
    bytes are the page SGLang 0.5.23 reserves: ``ceil((size + 256) / 64)`` pages (``_num_dsv4_physical_kv_pages``
    with ``global_page_size`` 256, ``deepseek_v4_memory_pool.py`` L166-171 and L1615-1625), 4 pages beyond the
    slots here (12,914 c128 tokens x 32 = 413,248 c4 slots, a multiple of 64): 4 x 177,408 = 709,632 B."""
    from click.testing import CliRunner

    from kvpools_core.cli import main

    result = CliRunner().invoke(main, ["plan", "deepseek-v4-flash", "--memory", "40GiB", "--page-size", "256"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # the table wraps long lines
    assert "indexer_c4: 2,772 B/c4 token (177,408 B per 64-token page, 32 per c128 token) + 709,632 B fixed" in text
    assert "B/c128 token (177,408" not in text
    p = plan("deepseek-v4-flash", Serving(page_size=256), memory=40 * GiB)
    lines = dict(line.split(": ", 1) for line in p.cost.lines())
    # every token pool's line prices one of its slots, in the space its slots are, paged 256 / compression
    pages = {"swa": 256, "c4": 256 // 4, "c128": 256 // 128}
    for pool in p.pools:
        if pool.kind != "kv" or pool.unit != "token":
            continue
        space = "c4" if pool.name == "indexer_c4" else pool.token_space
        assert lines[pool.name].startswith(
            f"{pool.bytes_per_slot:,} B/{space} token ({pool.bytes_per_slot * pages[space]:,} B per "
            f"{pages[space]}-token page"
        ), pool.name
    assert {pool.name for pool in p.pools} >= {"kv_swa", "kv_c4", "kv_c128", "indexer_c4"}


@settings(deadline=None, derandomize=True, database=None, max_examples=60)
@given(
    preset=st.sampled_from(["deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v4-flash-fp8-sgl"]),
    tokens=st.integers(0, 4_000_000),
    options=st.fixed_dictionaries(
        {
            "max_running_requests": st.none() | st.integers(1, 512),
            "enable_online_compress": st.booleans(),
            "speculative_algorithm": st.sampled_from([None, "NEXTN"]),
            "swa_full_tokens_ratio": st.sampled_from([0.1, 0.5, 0.8]),
            "tp_size": st.sampled_from([1, 4, 8]),
        }
    ),
)
def test_the_exact_search_probe_is_the_bytes_of_the_pools_it_skips_building(
    preset: str, tokens: int, options: dict[str, object]
) -> None:
    """``exact_bytes`` (the search's probe: no pool values built) equals the bytes of ``exact_pools`` (issue 37):
    the fast probe cannot move the exact answer."""
    try:
        planned = plan(preset, Serving(page_size=256, **options), memory=60 * GiB)  # type: ignore[arg-type]
    except KvpoolsError:
        assume(False)  # a combination SGLang refuses: nothing to lay out
    spec, serving = planned.model, planned.serving
    shape = dsv4_shape(spec, serving)
    assert exact_bytes(spec, serving, shape, tokens) == sum(p.bytes for p in exact_pools(spec, serving, shape, tokens))


def test_the_configurators_request_estimate() -> None:
    """``_get_c128_state_fixed_bytes_for_token_capacity`` (ref-002 lines 701-712) without a request count: SGLang
    estimates ``clamp(int(T / ctx x 512), 2048, 4096)``, at most ``T / 2``.  Through ``plan`` DeepSeek-V4 always has
    one (SGLang's default 256), so this runs the plugin's configurator on a serving that has none: at 60 GiB, TP 8,
    ratio 0.8 the capacity is 1,857,050 tokens of a 1,048,576 context -> 906 -> 2048 requests, the numbers of
    :func:`test_the_numbers_at_60_gib`."""
    from kvpools_plugins.dsv4.sizing import dsv4_cell_size, size_dsv4_pools

    from kvpools_core.parts.sizing import explicit_budget
    from kvpools_core.pipeline import plan_basis

    basis = plan_basis("deepseek-v4-flash", SGLANG)
    serving = attrs.evolve(basis.serving, max_running_requests=None)
    shape = dsv4_shape(basis.spec, serving)
    assert shape.requested_per_worker is None
    assert shape.estimated_requests(1857050) == 2048
    assert shape.estimated_requests(3000) == 1500  # at most T / 2
    sizing = size_dsv4_pools(basis.spec, serving, dsv4_cell_size(basis.spec, serving), explicit_budget(60 * GiB))
    assert (sizing.max_total_num_tokens, sizing.max_running_requests) == (1236992, 2048)
    assert any("2048 request(s) estimated from a capacity of 1,857,050 tokens" in note for note in sizing.notes)


@pytest.mark.parametrize("preset", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_an_exact_plan_lays_the_stage_out_once_and_the_pools_once(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: the exact search read the model's stage (``rank_layer_range`` and every layer's compress ratio)
    again at each probe, and laid the pool set out at each of its probes (8 for deepseek-v4-flash at 40 GiB, then
    once more for the pool values of the answer: 9); the fifth pass laid it out three times (where the solve
    anchors, and at its answer and one page above it, the check).  Since the sixth pass the solve's probes sum the
    separate-KV pool set from the stage (``buffers._SeparateBytes``), so the stage is read once per plan and the
    pools are laid out once, for the pool values of the answer.  The answer is the search's own
    (``tests/dsv4/test_dsv4_exact_solve.py``)."""
    from kvpools_plugins.dsv4 import buffers

    reads: list[object] = []
    layouts: list[object] = []
    original, original_buffers = buffers.rank_layer_range, buffers._buffers

    def counted(*args: object, **kwargs: object) -> tuple[int, int]:
        reads.append(args)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    def laid_out(*args: object, **kwargs: object) -> object:
        layouts.append(args)
        return original_buffers(*args, **kwargs)

    monkeypatch.setattr(buffers, "rank_layer_range", counted)
    monkeypatch.setattr(buffers, "_buffers", laid_out)
    planned = plan(preset, Serving(), memory=40 * GiB)
    assert len(reads) == 1
    assert len(layouts) == 1
    assert planned.max_total_num_tokens > 0
