"""HiSparse on DeepSeek sparse attention, planned and built as SGLang 0.5.23 builds it (issue 32).

Pins the defect: ``kvpools plan deepseek-v3.2 --enable-hisparse`` planned 531,136 tokens with or without it, then
was refused as not modelled.  SGLang 0.5.23 builds, for ``S = max_total_num_tokens`` and ``r =
host_to_device_ratio`` (``_build_dsa_kv_pool``, ``000_fbd4f47288598fb9.txt`` lines 1639-1645; the allocator at
lines 2129-2144):

* ``HiSparseDSATokenToKVPool(size=S, host_to_device_ratio=r)`` (``mem_cache/hisparse_memory_pool.py``): the
  latent rows of ``S + P`` slots, the index keys of ``index_buf_size = S x r`` slots, i.e.
  ``(S r + P + 1) // P`` pages of ``P x 132`` B per layer (``IndexKeyCache.__init__``);
* ``HiSparseTokenToKVPoolAllocator(S, ..., host_to_device_ratio=r)`` (``mem_cache/allocator/hisparse.py``
  lines 22-80): ``size_full = S x r``, a logical paged allocator of ``S x r``, a device one of ``S`` and an int64
  ``full_to_hisparse_device_index_mapping`` of ``S r + P`` zeros and one ``-1``.

SGLang's configurator (ref-002 lines 193-220) charges the 132 B index key once per layer, whatever ``r``.
"""

from __future__ import annotations

import json

import attrs
import pytest
import torch

from kvpools_core import Plan, Serving, plan
from kvpools_core.building import build
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parts.hisparse import LOGICAL_TOKENS
from kvpools_core.pools.hisparse import HiSparseAllocator

GiB = 1 << 30
RATIO4 = '{"host_to_device_ratio": 4}'
V32_HISPARSE = Serving(tp_size=8, enable_hisparse=True, disable_radix_cache=True, hisparse_config=RATIO4)

LATENT = 61 * (512 + 64) * 2
"""DeepSeek-V3.2 bf16: 61 layers of a (512 + 64)-element bf16 latent row = 70,272 B per token."""
INDEX = 61 * 132
"""61 layers of a 128-byte fp8 key and one fp32 scale = 8,052 B per token."""


def _exact_bytes(tokens: int, requests: int) -> int:
    """Every pool of the exact HiSparse plan at ``tokens`` device tokens, page 64, ratio 4."""
    page, logical = 64, 4 * tokens
    kv = (tokens + page) * LATENT
    index = (logical + page + 1) // page * page * INDEX
    table = (requests + 1) * (163840 + 4) * 4  # int32 rows of context 163,840 + 4 (SGLang's req_to_token)
    logical_allocator = 8 * (logical // page) + 8 * page  # the core's paged free stack + in-page offsets
    device_allocator = 8 * (tokens // page) + 8 * page
    mapping = (logical + page + 1) * 8
    return kv + index + table + logical_allocator + device_allocator + mapping


def test_deepseek_v32_ratio_4_exact_plan() -> None:
    """The issue's command: 615,296 device tokens, 2,461,184 logical ones, every pool in the 60 GiB."""
    got = plan("deepseek-v3.2", V32_HISPARSE, memory=60 * GiB)
    tokens, requests = got.max_total_num_tokens, got.max_running_requests
    assert (tokens, requests) == (615_296, 2048)
    assert got.sizing.token_counts == {"full": 615_296, LOGICAL_TOKENS: 4 * 615_296}
    assert got.pool("kv").bytes == (615_296 + 64) * 70_272
    assert got.pool("indexer").bytes == (4 * 615_296 + 64) * 8_052 == 19_817_968_896
    assert got.pool("hisparse_mapping").bytes == (4 * 615_296 + 65) * 8
    assert got.planned_bytes == _exact_bytes(tokens, requests) == 64_423_487_816
    assert _exact_bytes(tokens + 64, requests) > 60 * GiB  # one page more does not fit
    assert any("HiSparse (host_to_device_ratio 4)" in note for note in got.sizing.notes)
    assert got.problems() == []
    assert Plan.from_dict(json.loads(got.to_json())) == got  # the logical token space survives the round trip


def test_without_hisparse_the_plan_is_unchanged() -> None:
    """No HiSparse: no logical space, the core sizes the pools (``size_pools: core``)."""
    got = plan("deepseek-v3.2", Serving(tp_size=8), memory=60 * GiB)
    assert got.max_total_num_tokens == 801_472
    assert set(got.sizing.token_counts) == {"full"}
    assert got.provenance["size_pools"] == ("core",)


def test_sglang_accounting_keeps_sglang_count_and_says_what_it_leaves_out() -> None:
    """SGLang's count: 60 GiB // (70,272 + 8,052) = 822,538 -> 822,528; its index keys need 4x what it charged."""
    got = plan("deepseek-v3.2", attrs.evolve(V32_HISPARSE, accounting="sglang"), memory=60 * GiB)
    assert got.max_total_num_tokens == 60 * GiB // (LATENT + INDEX) // 64 * 64 == 822_528
    assert got.pool("indexer").bytes == (4 * 822_528 + 64) * 8_052
    assert any("charges the logical pools (indexer) per device token, not 4 times" in note for note in got.sizing.notes)


@pytest.mark.parametrize("ratio", [1, 2, 3])
def test_the_default_and_other_ratios(ratio: int) -> None:
    """Without ``--hisparse-config`` the ratio is SGLang's default 2 (``SparseConfig.host_to_device_ratio``)."""
    config = None if ratio == 2 else f'{{"host_to_device_ratio": {ratio}}}'
    serving = Serving(tp_size=8, enable_hisparse=True, disable_radix_cache=True, hisparse_config=config)
    got = plan("deepseek-v3.2", serving, memory=40 * GiB)
    tokens = got.max_total_num_tokens
    assert got.sizing.token_counts[LOGICAL_TOKENS] == ratio * tokens
    assert got.pool("indexer").bytes == (ratio * tokens + 64) * INDEX


def test_build_on_meta_allocates_what_the_plan_says() -> None:
    got = plan("deepseek-v3.2", V32_HISPARSE, memory=60 * GiB)
    pools = build(got, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}
    assert isinstance(pools.allocator, HiSparseAllocator)
    assert (pools.allocator.size_full, pools.allocator.size_hisparse) == (4 * 615_296, 615_296)
    assert all(buffer.shape == (38_457, 64 * 132) for buffer in pools.kv_pool.index_k_with_scale_buffer)


@pytest.mark.parametrize(
    ("serving", "words"),
    [
        (attrs.evolve(V32_HISPARSE, kv_cache_dtype="fp8_e5m2"), "HiSparse requires one of ('bfloat16', 'fp8_e4m3')"),
        (attrs.evolve(V32_HISPARSE, speculative_algorithm="NEXTN"), "kvpools does not model enable_hisparse with spec"),
        (attrs.evolve(V32_HISPARSE, dcp_size=2), "kvpools does not model enable_hisparse with dcp_size 2"),
        (attrs.evolve(V32_HISPARSE, enable_hierarchical_cache=True), "with enable_hierarchical_cache"),
    ],
)
def test_refusals(serving: Serving, words: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        plan("deepseek-v3.2", serving, memory=60 * GiB)


def test_the_allocator_maps_logical_slots_to_device_slots() -> None:
    """``alloc`` takes both sides and maps them; ``free`` returns both and clears the map (SGLang's contract)."""
    allocator = HiSparseAllocator(8, 1, 4, device="cpu")
    assert (allocator.size, allocator.available_size()) == (32, 8)  # the device side binds
    assert allocator.mapping.shape == (32 + 1 + 1,) and int(allocator.mapping[-1]) == -1
    logical = allocator.alloc(3)
    assert logical is not None
    device = allocator.mapping[logical]
    assert bool((device >= 1).all()) and len(set(device.tolist())) == 3
    assert allocator.alloc(6) is None and allocator.available_size() == 5  # short on device: nothing changes
    allocator.free(logical)
    assert allocator.available_size() == 8 and bool((allocator.mapping[:-1] == 0).all())


def test_the_paged_allocator_extends_both_sides() -> None:
    allocator = HiSparseAllocator(16, 4, 2, device="cpu")
    prefix, seq = torch.tensor([0, 0]), torch.tensor([5, 3])
    logical = allocator.alloc_extend(prefix, seq, torch.tensor([-1, -1]), 8)
    assert logical is not None and logical.numel() == 8
    assert allocator.device_allocator.available_size() == 16 - 3 * 4
    assert allocator.logical.available_size() == 32 - 3 * 4
    allocator.free(logical)
    assert allocator.available_size() == 16
