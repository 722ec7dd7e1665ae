"""The DSA indexer's rules as SGLang 0.5.23 builds them: IndexShare, pooled index keys, DCP, ``is_deepseek_dsa``.

Each test pins an issue-32 defect of the planner before this change:

* IndexShare: kvpools charged the index keys on every layer; SGLang's ``_build_dsa_kv_pool`` (ref-000 lines
  1657-1663) gives the layers ``dsa_layer_skips_topk`` marks a 0-row buffer (``IndexKeyCache._layer_num_pages``)
  when ``_should_elide_dsa_index_k`` (lines 109-117: no HiSparse, no HiCache, no PD, not the draft worker);
* ``index_kpool``: a page of ``P`` tokens holds ``P // kpool`` pooled keys (``IndexKeyCache._buffer_shape``), the
  kernels' physical page ``P // kpool`` must be 64 on CUDA and ``P`` a multiple of ``kpool``
  (``DSATokenToKVPool.__init__`` asserts both); kvpools refused ``index_kpool`` 2 at page 128 and accepted it at 64;
* DCP: the index keys are replicated, ``index_buf_size = (S + P) x dcp - P`` (``memory_pool.py`` lines 5337-5343);
  kvpools charged ``S + P``;
* ``is_deepseek_dsa`` names 15 architectures in SGLang 0.5.23; kvpools knew 6, so a GLM5-Next DSA hybrid was
  planned by the mamba plugin with no index keys.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import pytest

from kvpools_core import Serving, plan
from kvpools_core.building import build
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.models import parse_config, resolve_model_source
from kvpools_core.registry import get_registry

from .support import SMALL_DSA

GiB = 1 << 30
FP8 = Serving(tp_size=8, kv_cache_dtype="fp8_e4m3")
NODE = "16TiB"
"""A stated host memory, so the HiCache case never reads this machine's."""


def _glm52(**changes: Any) -> dict[str, Any]:
    config = dict(resolve_model_source("glm-5.2", get_registry())[0])
    return {**config, **changes}


def _spec(config: dict[str, Any]) -> Any:
    return parse_config(config, "generated", get_registry())[0]


# -- IndexShare ---------------------------------------------------------------------------------------------------


def test_glm52_keeps_index_keys_on_21_of_78_layers() -> None:
    """``index_topk_freq`` 4, ``index_skip_topk_offset`` 3: layers 0-2 and every 4th from 6 compute top-k
    (``max(i - 3 + 1, 0) % 4 == 0``), the 57 others reuse it."""
    spec = _spec(_glm52())
    full = [layer.index for layer in spec.layers if not layer.params.get("skips_topk")]
    assert full == [0, 1, 2, *range(6, 78, 4)] and len(full) == 21


def test_indexshare_gains_tokens_under_the_exact_accounting() -> None:
    """GLM-5.2, fp8, TP 8, 60 GiB: 78 x 656 + 21 x 132 = 53,940 B/token instead of 78 x (656 + 132) = 61,464."""
    shared = plan(_spec(_glm52()), FP8, memory=60 * GiB)
    assert shared.cell.bytes_per_token == 78 * 656 + 21 * 132 == 53_940
    assert shared.pool("indexer").bytes == (shared.max_total_num_tokens + 64) * 21 * 132
    every = plan(_spec(_glm52(index_topk_freq=None, index_skip_topk_offset=None, indexer_types=None)), FP8,
                 memory=60 * GiB)  # fmt: skip
    assert every.cell.bytes_per_token == 78 * 788 == 61_464
    assert (every.max_total_num_tokens, shared.max_total_num_tokens) == (908_224, 1_034_944)
    assert round(shared.max_total_num_tokens / every.max_total_num_tokens, 3) == 1.14  # +13.95 %
    assert any("IndexShare: 57 of 78 layer(s)" in note for note in shared.cell.notes)


def test_sglang_accounting_charges_every_layer_as_its_configurator() -> None:
    """ref-002 lines 193-220: ``132 x effective_num_layers``, IndexShare or not; its pools then hold less."""
    got = plan(_spec(_glm52()), attrs.evolve(FP8, accounting="sglang"), memory=60 * GiB)
    assert got.cell.sglang_bytes_per_token == 78 * (576 + 132) == 55_224
    assert got.max_total_num_tokens == 60 * GiB // 55_224 // 64 * 64


@pytest.mark.parametrize(
    "serving",
    [
        attrs.evolve(FP8, enable_hierarchical_cache=True, hicache_ratio=2.0),
        attrs.evolve(FP8, disaggregation_mode="decode"),
        attrs.evolve(FP8, disaggregation_mode="prefill"),
    ],
    ids=["hicache", "pd-decode", "pd-prefill"],
)
def test_no_elision_under_hicache_or_pd(serving: Serving) -> None:
    """``_should_elide_dsa_index_k`` is false there: every layer keeps its index keys."""
    host = {"host_memory": NODE} if serving.enable_hierarchical_cache else {}
    got = plan(_spec(_glm52()), serving, memory=60 * GiB, **host)
    assert got.cell.bytes_per_token == 78 * 788


def test_the_draft_keeps_every_layers_keys() -> None:
    """The draft worker never elides (``is_draft_worker``): one NEXTN layer of 656 + 132 B."""
    got = plan(_spec(_glm52()), attrs.evolve(FP8, speculative_algorithm="NEXTN"), memory=60 * GiB)
    assert got.pool("draft_indexer").bytes_per_slot == 132
    assert got.pool("indexer").bytes_per_slot == 21 * 132


def test_build_gives_shared_layers_zero_row_buffers() -> None:
    spec = _spec({**SMALL_DSA, "indexer_types": ["full", "shared", "full", "shared"]})
    got = plan(spec, Serving(page_size=64), memory=1 * GiB)
    pools = build(got, "meta")
    rows = [buffer.shape[0] for buffer in pools.kv_pool.index_k_with_scale_buffer]
    assert rows[1] == rows[3] == 0 < rows[0] == rows[2] == (got.max_total_num_tokens + 64 + 1) // 64
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}


# -- index_kpool --------------------------------------------------------------------------------------------------


def test_kpool_2_plans_at_page_128() -> None:
    """SGLang's own default for it (``64 x index_kpool``); a page of 128 tokens holds 64 keys of 132 B."""
    spec = _spec({**SMALL_DSA, "index_kpool": 2})
    got = plan(spec, Serving(page_size=128), memory=1 * GiB)
    tokens = got.max_total_num_tokens
    assert got.pool("indexer").bytes == (tokens + 128 + 1) // 128 * (64 * 132) * 4
    assert got.pool("indexer").bytes_per_slot == 4 * 66
    assert build(got, "meta").allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}


def test_kpool_2_is_refused_at_page_64_as_sglang_asserts() -> None:
    """``page_size // index_kpool`` = 32 kernel pages: SGLang asserts 'DSA requires 64-token physical pages'."""
    spec = _spec({**SMALL_DSA, "index_kpool": 2})
    with pytest.raises(UnsupportedCombinationError, match=r"kernel pages of 32 tokens"):
        plan(spec, Serving(page_size=64), memory=1 * GiB)
    with pytest.raises(UnsupportedCombinationError, match=r"must be a multiple of index_kpool 2"):
        plan(spec, Serving(page_size=63), memory=1 * GiB)


def test_kpool_compress_tails_are_paid_per_request() -> None:
    """``_init_kpool_compress_tail_buffers``: per layer a key and a score tail of ``(requests + 1, kpool + draft
    tokens, 128)`` bf16: 2 x (2 + 0) x 128 x 2 B = 1,024 B per request per layer."""
    spec = _spec({**SMALL_DSA, "index_kpool": 2, "index_kpool_compress": True})
    got = plan(spec, Serving(page_size=128), memory=1 * GiB)
    tails = got.pool("index_tail")
    assert tails.bytes == (got.max_running_requests + 1) * 4 * 1_024
    pools = build(got, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}
    assert pools.kv_pool.index_tails[0].shape == (got.max_running_requests + 1, 2, 128)


# -- DCP ----------------------------------------------------------------------------------------------------------


def test_dcp_replicates_the_index_keys() -> None:
    """DeepSeek-V3.2, fp8, TP 8, DCP 2, 60 GiB: ``((S + 64) x 2 - 64 + 64 + 1) // 64`` pages of 64 x 8,052 B.

    Under DCP SGLang's DSA backends default to trtllm (``_dsa_dcp_overrides``, ``engine_defaults``), whose raw
    latent row holds more tokens than FlashMLA's packed one: 1,208,896 (1,107,456 with the packed row)."""
    got = plan("deepseek-v3.2", attrs.evolve(FP8, dcp_size=2), memory=60 * GiB)
    tokens = got.max_total_num_tokens
    assert tokens == 1_208_896
    assert got.pool("indexer").bytes == ((tokens + 64) * 2 + 1) // 64 * 64 * 61 * 132 == 19_469_091_840
    assert build(got, "meta").allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}


def test_dcp_at_page_1_is_refused_as_not_modelled() -> None:
    """ROCm's page 1: ``(S + 1) x dcp + 1`` index rows, which the replicated layout (whole pages of ``dcp`` slots)
    cannot hold exactly; refused rather than planned one row off."""
    serving = Serving(platform="rocm", page_size=1, tp_size=2, dcp_size=2)
    with pytest.raises(UnsupportedCombinationError, match="DSA index buffer under dcp_size 2 at page_size 1"):
        plan(_spec(dict(SMALL_DSA)), serving, memory=1 * GiB)


# -- is_deepseek_dsa ----------------------------------------------------------------------------------------------


def _glm5_next() -> dict[str, Any]:
    """A GLM5-Next-style config (``configs/glm5_next.py``): KDA linear layers, MLA full layers, DSA indexer."""
    layers = 8
    text = {
        "model_type": "glm5_next_text",
        "num_hidden_layers": layers,
        "num_attention_heads": 64,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "layer_types": ["linear_attention" if i % 4 != 3 else "full_attention" for i in range(layers)],
        "linear_attn_config": {
            "full_attn_layers": [i + 1 for i in range(layers) if i % 4 == 3],
            "kda_layers": [i + 1 for i in range(layers) if i % 4 != 3],
            "head_dim": 128,
            "num_heads": 64,
            "short_conv_kernel_size": 4,
        },
        "index_head_dim": 128,
        "index_topk": 2048,
    }
    return {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next", "text_config": text}


def test_glm5_next_dsa_hybrid_is_refused_not_planned_without_index_keys() -> None:
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model GLM5-Next's DSA layers"):
        parse_config(_glm5_next(), "glm5-next", get_registry())
    without = json.loads(json.dumps(_glm5_next()))
    del without["text_config"]["index_topk"]  # not DSA to SGLang: the mamba plugin's KDA hybrid, as before
    assert parse_config(without, "glm5-next", get_registry())[1] == "mamba"


@pytest.mark.parametrize("arch", ["LongcatFlashForCausalLM", "HYV4ForCausalLM", "HYV4ForCausalLMNextN"])
def test_other_unmodelled_dsa_families_are_refused(arch: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model"):
        parse_config({**SMALL_DSA, "architectures": [arch]}, "generated", get_registry())


def test_glm_dsa_nextn_draft_config_is_dsa() -> None:
    """``GlmMoeDsaForCausalLMNextN`` (the draft head's architecture) is DSA to SGLang 0.5.23."""
    spec, plugin = parse_config({**SMALL_DSA, "architectures": ["GlmMoeDsaForCausalLMNextN"]}, "g", get_registry())
    assert plugin == "dsa" and spec.architecture == "dsa"


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"enable_hierarchical_cache": True}, "'DSA DCP does not support HiSparse or HiCache.'"),
        ({"disaggregation_mode": "decode"}, "'DSA DCP does not support PD disaggregation.'"),
        (
            {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 2,
                "speculative_draft_num_layers": 1,
                "speculative_num_draft_tokens": 4,
            },
            "'DSA DCP requires --speculative-eagle-topk 1.'",
        ),
    ],
)
def test_sglangs_dcp_refusals_are_refused_not_planned(options: dict[str, Any], words: str) -> None:
    """``_dsa_dcp_overrides`` (``arg_groups/model_overrides/deepseek_v2.py`` lines 18-25) raises on these beside
    ``--dcp-size`` > 1; kvpools planned them (deepseek-v3.2 with HiCache under DCP: 531,136 tokens). Without DCP the
    same options still plan."""
    host = {"host_memory": "2TiB"} if options.get("enable_hierarchical_cache") else {}
    serving = attrs.evolve(FP8, dcp_size=2, **options)
    with pytest.raises(UnsupportedCombinationError, match=re.escape(words)) as raised:
        plan("deepseek-v3.2", serving, memory=60 * GiB, **host)
    assert "dcp_size" in str(raised.value)
    plan("deepseek-v3.2", attrs.evolve(FP8, **options), memory=60 * GiB, **host)


def test_pooled_index_keys_under_dcp_are_refused() -> None:
    """``_deepseek_family_overrides`` (``arg_groups/model_overrides/deepseek_v2.py`` lines 161-170) raises for
    ``index_kpool`` > 1 with ``--dcp-size`` > 1 on a GPU; kvpools planned it (issue 32: 531,072 tokens for
    deepseek-v3.2 with ``index_kpool`` 2, TP 8, DCP 2, page 128, 40 GiB).  Without DCP it plans."""
    spec = _spec({**SMALL_DSA, "index_kpool": 2})
    serving = Serving(tp_size=4, dcp_size=2, page_size=128)
    words = "--dcp-size > 1 is not supported for DSA with index_kpool=2: a pooled index key spans positions"
    with pytest.raises(UnsupportedCombinationError, match=re.escape(words)):
        plan(spec, serving, memory=40 * GiB)
    assert plan(spec, attrs.evolve(serving, dcp_size=1), memory=40 * GiB).max_total_num_tokens
