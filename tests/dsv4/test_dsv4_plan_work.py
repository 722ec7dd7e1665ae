"""What DeepSeek-V4's exact plan no longer redoes (issue 37, sixth pass), and that nothing it keeps goes stale.

The plan's answers themselves are pinned by the sizing and exact-solve tests; these pin the shortcuts: a value
computed once per frozen object is the one computing it again gives, for every object (no answer of another
model or serving can come back)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kvpools_plugins.dsv4 import buffers
from kvpools_plugins.dsv4.buffers import DSV4Sizes
from kvpools_plugins.dsv4.sizing import DSV4Shape, dsv4_shape

from kvpools_core.errors import KvpoolsError
from kvpools_core.pipeline import plan, plan_basis
from kvpools_core.values import ModelSpec, Serving

GiB = 1 << 30

EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
}


def _shape(model: str = "deepseek-v4-flash", options: dict[str, object] | None = None) -> DSV4Shape:
    basis = plan_basis(model, Serving(**(options or {})))  # type: ignore[arg-type]
    return dsv4_shape(basis.spec, basis.serving)


def test_the_flash_coefficient_by_hand() -> None:
    """deepseek-v4-flash (43 layers: 21 c4, 20 c128; rows of 448 + 2 x 64 + 8 = 584 B, indexer 128 + 4 = 132 B,
    c4 states 2 x 2 x 512 x 4 = 8,192 B and 2 x 2 x 128 x 4 = 2,048 B, ring 8 over window 128), SWA ratio 0.1:
    0.1 x 584 x 43 + 584 x 21 / 4 + 584 x 20 / 128 + 132 x 21 / 4 + 0.1 x 8 / 128 x (8,192 + 2,048) x 21
    = 2,511.2 + 3,066 + 91.25 + 693 + 1,075.2 + 268.8 = 7,705.45 B; with an EAGLE draft x 44 / 43."""
    plain = _shape()
    assert plain.bytes_per_full_token == pytest.approx(7705.45)
    assert plain.bytes_per_full_token == plain.raw_bytes_per_full_token
    eagle = _shape(options=EAGLE)
    assert eagle.bytes_per_full_token == pytest.approx(eagle.raw_bytes_per_full_token * 44 / 43)


@pytest.mark.parametrize(
    "options",
    [
        {},
        EAGLE,
        {"tp_size": 4, "swa_full_tokens_ratio": 0.5},
        {"pp_size": 2, "pp_rank": 1},
        {"enable_online_compress": True},
    ],
)
@pytest.mark.parametrize("model", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_the_stored_coefficient_is_the_computed_one(model: str, options: dict[str, object]) -> None:
    """The coefficient is computed when the frozen shape is built; any shape built from another (an ``evolve``
    of a field it reads) computes its own."""
    shape = _shape(model, options)
    assert shape.bytes_per_full_token == shape._coefficient()
    for changes in ({"speculative": not shape.speculative}, {"swa_ratio": 0.33}, {"num_c4": 0}, {"shrink": 2}):
        other = attrs.evolve(shape, **changes)
        assert other.bytes_per_full_token == other._coefficient()
        assert other.bytes_per_full_token != shape.bytes_per_full_token
        assert other != shape


def test_a_shape_of_no_layers_still_fails_where_it_is_read() -> None:
    """Dividing by no layers raised when the figure was read, not when the shape was built: still so (a stage of
    no layers is refused by ``dsv4_problems`` before any plan reads it)."""
    shape = attrs.evolve(_shape(options=EAGLE), num_layers=0)
    with pytest.raises(ZeroDivisionError):
        _ = shape.bytes_per_full_token


# -- the exact solve's probes: the separate-KV pool set summed from the stage, no layout ------------------------

CONFIGS = Path(__file__).with_name("configs")
PROBE_MODELS = [
    "deepseek-v4-flash",
    "deepseek-v4-pro",
    "deepseek-v4-flash-fp8-sgl",
    str(CONFIGS / "dsv41_synthetic.json"),  # V4.1's ratio-1/2 pools: laid out at each probe
]
PROBE_SERVINGS = st.fixed_dictionaries(
    {
        "tp_size": st.sampled_from([1, 4, 8]),
        "max_running_requests": st.none() | st.integers(1, 2048),
        "swa_full_tokens_ratio": st.sampled_from([0.1, 0.5, 0.8]),
        "enable_online_compress": st.booleans(),
        "dsv4_compress_state_dtype": st.sampled_from(["float32", "bfloat16"]),
        "context_length": st.none() | st.sampled_from([8192, 262144]),
    },
    optional={
        "speculative": st.sampled_from(["EAGLE", "DSPARK", "online_mtp"]),
        "disaggregation_mode": st.just("decode"),
        "pp": st.sampled_from([0, 1]),
        "enable_hisparse": st.just(True),
        "dsv4_attn_backend": st.just("trtllm"),
    },
)


def _probe_basis(model: str, options: dict[str, Any]) -> tuple[ModelSpec, Serving] | None:
    options = dict(options)
    speculative = options.pop("speculative", None)
    if speculative == "online_mtp":
        options.update(EAGLE, enable_online_compress=True, enable_online_c128_mtp=True)
    elif speculative == "EAGLE":
        options.update(EAGLE)
    elif speculative == "DSPARK":
        options.update(speculative_algorithm="DSPARK", speculative_draft_num_layers=1, speculative_num_draft_tokens=8)
    if "pp" in options:
        options.update(pp_size=2, pp_rank=options.pop("pp"))
    if options.get("enable_hisparse"):
        options["disable_radix_cache"] = True
    if options.get("dsv4_attn_backend") == "trtllm":
        options["kv_cache_dtype"] = "fp8_e4m3"
    try:
        basis = plan_basis(model, Serving(**{k: v for k, v in options.items() if v is not None}))
    except KvpoolsError:
        return None
    return basis.spec, basis.serving


@settings(deadline=None, derandomize=True, database=None, max_examples=150)
@given(
    model=st.sampled_from(PROBE_MODELS),
    options=PROBE_SERVINGS,
    full_pages=st.integers(1, 40_000),
    swa_share=st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]),
    requests=st.integers(0, 4096),
)
def test_the_probe_is_the_bytes_of_the_pools_it_does_not_lay_out(
    model: str, options: dict[str, Any], full_pages: int, swa_share: float, requests: int
) -> None:
    """At any sizes and request count the probe's bytes are those of the pools ``pool_specs`` builds for them,
    whether it summed them from the stage (V4's separate-KV set) or laid them out (the other sets); and it sums
    from the stage exactly where ``_buffers`` lays V4's separate-KV set out."""
    basis = _probe_basis(model, options)
    assume(basis is not None)
    assert basis is not None
    spec, serving = basis
    assume(serving.page_size == 256)
    page = serving.page_size
    full = full_pages * page
    c128_state = (requests + 1) * 128
    sizes = DSV4Sizes(
        full_tokens=full,
        swa_tokens=int(full * swa_share) // page * page,
        c4_tokens=full // 4,
        c128_tokens=full // 128,
        c4_state_size=int(full * swa_share) // page * page // 128 * 8,
        c128_state_size=c128_state,
    )
    context_len = serving.context_length or spec.context_len
    probe = buffers.pool_bytes_probe(spec, serving, context_len=context_len)
    laid_out = buffers._buffers(probe.stage, spec, serving, sizes, max_running_requests=requests)
    separate_set = not (
        probe.hisparse
        or laid_out.unified is not None
        or laid_out.request_window is not None
        or laid_out.draft_swa_valid_from
        or laid_out.low_ratio.kv
        or laid_out.low_ratio.index
    )
    assert (probe.separate is not None) == separate_set
    pools = buffers.pool_specs(spec, serving, sizes, max_running_requests=requests, context_len=context_len)
    assert probe(sizes, requests) == sum(pool.bytes for pool in pools)


@settings(deadline=None, derandomize=True, database=None, max_examples=100)
@given(
    model=st.sampled_from(PROBE_MODELS[:3]),
    options=PROBE_SERVINGS,
    full_pages=st.integers(4, 40_000),
    requests=st.integers(1, 4096),
    more=st.tuples(st.integers(0, 50), st.integers(0, 50)),
)
def test_the_probes_rates_are_the_pools_growth(
    model: str, options: dict[str, Any], full_pages: int, requests: int, more: tuple[int, int]
) -> None:
    """``linear``'s bytes per page of full tokens and per page of SWA tokens (at a fixed request count): the
    pools ``pool_specs`` builds ``a`` full pages and ``b`` SWA pages further hold exactly ``a`` and ``b`` times
    them more, whenever the probe gives them."""
    basis = _probe_basis(model, options)
    assume(basis is not None)
    assert basis is not None
    spec, serving = basis
    assume(serving.page_size == 256)
    shape = dsv4_shape(spec, serving)
    steps = shape.steps(serving.page_size)
    assume(steps is not None)
    assert steps is not None
    page = serving.page_size
    context_len = serving.context_length or spec.context_len
    probe = buffers.pool_bytes_probe(spec, serving, context_len=context_len)
    swa_pages = max(full_pages // 10, 1)

    def sizes(full: int, swa: int) -> DSV4Sizes:
        return DSV4Sizes(
            full_tokens=full * page,
            swa_tokens=swa * page,
            c4_tokens=full * steps[0].c4_tokens,
            c128_tokens=full * steps[0].c128_tokens,
            c4_state_size=swa * steps[1].c4_state_size,
            c128_state_size=shape.c128_state_pool_size(requests),
        )

    def pools_bytes(at: DSV4Sizes) -> int:
        pools = buffers.pool_specs(spec, serving, at, max_running_requests=requests, context_len=context_len)
        return sum(pool.bytes for pool in pools)

    linear = probe.linear(sizes(full_pages, swa_pages), requests, *steps)
    assume(linear is not None)
    assert linear is not None
    spent, per_page, per_swa_page = linear
    a, b = more
    assert spent == pools_bytes(sizes(full_pages, swa_pages))
    assert pools_bytes(sizes(full_pages + a, swa_pages + b)) == spent + a * per_page + b * per_swa_page


def test_the_probe_sums_flash_by_hand() -> None:
    """deepseek-v4-flash at its 40 GiB answer (19,688 pages of 256 full tokens, 1,968 SWA pages, 256 requests),
    summed from the stage: SWA (503,808 + 256) / 256 = 1,969 pages of ceil_to(256 x 584, 576) = 149,760 B on 43
    layers; c4 KV ceil((1,260,032 + 256) / 64) = 19,692 pages of 37,440 B on 21 layers; c128 (39,376 + 256) / 2
    = 19,816 pages of 1,728 B on 20 layers; the indexer (39,376 x 32 + 256) / 64 = 19,692 pages of 64 x 132 B on
    21 layers; c4 states ceil_to(31,488 + 8 + 1, 4) = 31,500 rows of 8,192 + 2,048 B on 21 layers; the c128 state
    ceil_to(257 slots x 128 + 128 + 1, 128) = 33,152 rows of 2 x 512 x 4 = 4,096 B on 20 layers; with the
    mapping, the request table and both allocators as the pools are built: the plan's pool bytes."""
    planned = plan("deepseek-v4-flash", Serving(), memory=40 * GiB)
    spec, serving = planned.model, planned.serving
    probe = buffers.pool_bytes_probe(spec, serving, context_len=spec.context_len)
    assert probe.separate is not None
    sizes = buffers.DSV4Sizes.from_config(planned.sizing.sglang_config)
    assert (sizes.full_tokens, sizes.swa_tokens) == (19_688 * 256, 1_968 * 256)
    swa = 1_969 * 149_760 * 43
    c4 = 19_692 * 37_440 * 21
    c128 = 19_816 * 1_728 * 20
    indexer = 19_692 * 64 * 132 * 21
    c4_states = 31_500 * (8_192 + 2_048) * 21
    c128_state = 33_152 * 4_096 * 20
    kv = swa + c4 + c128 + indexer + c4_states + c128_state
    named = {"kv_swa", "kv_c4", "kv_c128", "indexer_c4", "c4_state", "c4_indexer_state", "c128_state"}
    assert kv == sum(pool.bytes for pool in planned.sizing.pools if pool.name in named)
    assert probe(sizes, planned.max_running_requests) == planned.sizing.planned_bytes
