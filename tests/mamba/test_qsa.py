"""QSA (Qwen sparse attention) pools: SGLang 0.5.23's ``QSATokenToKVPool`` (issue 33, ledger row 000-109).

No public checkpoint carries a QSA profile (none in ``../shared/model-configs``, none found by search), so the
config is generated: the ``qwen4-exp-defaults`` preset (48 layers, full attention every 4th: 12 full layers, 2
KV heads x 256) with the indexer fields ``parse_qsa_profile`` reads (``layers/attention/qsa/config.py``):
16 index heads, 1 index KV head of 128 dims, budget 2,048, compress ratio 4.

Hand-computed from ``mem_cache/qsa_kv_pool.py``: compressed keys 1 x 128 x 2 B // 4 x 12 layers = 768 B per token
(``qsa_bytes_per_token``), ``ceil((size + page) / 4)`` rows per layer in one flat tensor; the pending key ring
``R x 4`` rows of 1 x 128 bf16 per layer = 12,288 B per request-table row; the MRoPE ring ``R x 4 x 3`` int64 =
96 B per row (``R`` = ``req_to_token.shape[0]`` = requests + 1).
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import Serving, build, plan
from kvpools_core.errors import ConfigError, KvpoolsError
from tests.oracle import locate

from .support import parse, preset_config

GiB = 1 << 30
INDEXER = {
    "indexer_n_heads": 16,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 128,
    "indexer_budget": 2048,
    "indexer_compress_ratio": 4,
}


def qsa_config(**indexer: Any) -> dict[str, Any]:
    config = copy.deepcopy(preset_config("qwen4-exp-defaults"))
    config["text_config"].update({**INDEXER, **indexer})
    return config


@pytest.mark.parametrize("accounting", ["exact", "sglang"])
def test_qsa_pools_hand_computed_and_built_exactly(accounting: str) -> None:
    model = parse(qsa_config(), "qsa-generated")
    got = plan(model, Serving(accounting=accounting, max_running_requests=64), memory=20 * GiB)
    assert got.serving.page_size == 64  # SGLang's Qwen4-Exp override for a QSA profile
    rows = got.max_total_num_tokens + 64
    table_rows = got.max_running_requests + 1
    compressed = got.pool("qsa_compressed_k")
    assert compressed.bytes == 12 * (rows // 4) * 1 * 128 * 2 == rows * 768
    assert got.pool("qsa_key_state").bytes == table_rows * 4 * 128 * 2 * 12 == table_rows * 12_288
    assert got.pool("qsa_rope_positions").bytes == table_rows * 96
    assert not compressed.sglang_charged  # the reference's cell (ref-002) does not count them
    assert (
        got.cell.sglang_bytes_per_token
        == plan(
            parse(preset_config("qwen4-exp-defaults"), "bare"),
            Serving(accounting=accounting, max_running_requests=64, page_size=64),
            memory=20 * GiB,
        ).cell.sglang_bytes_per_token
    )
    pools = build(got, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in got.pools}
    qsa = pools.kv_pool.qsa
    assert tuple(qsa.compressed_k(0).shape) == (rows // 4, 1, 128)
    assert tuple(qsa.key_state[0].shape) == (table_rows * 4, 1, 128)
    if accounting == "exact":
        assert got.planned_bytes <= 20 * GiB


def test_fp8_indexer_halves_the_compressed_keys() -> None:
    """``--qsa-indexer-dtype fp8_e4m3``: 1 x 128 x 1 B // 4 x 12 = 384 B per token; the pending ring stays bf16."""
    got = plan(
        parse(qsa_config(), "qsa"), Serving(max_running_requests=64, qsa_indexer_dtype="fp8_e4m3"), memory=20 * GiB
    )
    assert got.pool("qsa_compressed_k").bytes == (got.max_total_num_tokens + 64) * 384
    assert got.pool("qsa_key_state").bytes == (got.max_running_requests + 1) * 12_288
    assert build(got, "meta").allocated_by_pool() == {p.name: p.bytes for p in got.pools}


def test_only_qwen4_exp_defaults_the_page_to_64() -> None:
    """SGLang's page override for QSA is Qwen4-Exp's; a Qwen3-Next config with a QSA profile keeps page 1, which
    ``QSATokenToKVPool`` refuses."""
    config = copy.deepcopy(preset_config("qwen3-next-80b-a3b-thinking"))
    config.get("text_config", config).update(INDEXER)
    with pytest.raises(KvpoolsError, match="page_size=1, ratio=4"):
        plan(parse(config, "qsa-next"), Serving(max_running_requests=64), memory=20 * GiB)


def test_the_indexer_dtype_needs_a_qsa_model() -> None:
    with pytest.raises(KvpoolsError, match="needs a model with a compressed QSA indexer"):
        plan("llama-3.1-8b", Serving(qsa_indexer_dtype="bfloat16"), memory=20 * GiB)


def test_qsa_layer_types_plan_with_a_profile() -> None:
    config = qsa_config()
    config["text_config"]["layer_types"] = [
        "qwen_sparse_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)
    ]
    config["text_config"].pop("full_attention_interval", None)
    got = plan(parse(config, "qsa-layers"), Serving(max_running_requests=32), memory=20 * GiB)
    assert got.pool("qsa_compressed_k").bytes == (got.max_total_num_tokens + 64) * 768
    assert build(got, "meta").allocated_by_pool() == {p.name: p.bytes for p in got.pools}


@pytest.mark.parametrize(
    ("indexer", "words"),
    [
        ({"indexer_kv_heads": 2}, "the QSA MQA operators require indexer_kv_heads=1"),
        ({"indexer_compress_ratio": 1, "indexer_budget": 512}, "QSA requires indexer_compress_ratio >= 2, got 1"),
        ({"indexer_budget": 2050}, "indexer_budget must be divisible by indexer_compress_ratio, got 2050 / 4"),
        ({"indexer_budget": 4096}, "to be one of [512, 2048], got 1024"),
        ({"indexer_head_dim": None}, "QSA config is missing required fields: ['indexer_head_dim']"),
    ],
)
def test_sglangs_profile_errors(indexer: dict[str, Any], words: str) -> None:
    config = qsa_config(**indexer)
    if indexer.get("indexer_head_dim", 0) is None:
        del config["text_config"]["indexer_head_dim"]
    with pytest.raises(ConfigError) as refused:
        parse(config, "bad-qsa")
    assert words in str(refused.value)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"page_size": 1}, "compressed QSA requires a paged full-KV cache with the page a multiple of the compress"),
        ({"page_size": 18}, "page_size=18, ratio=4"),
        (
            {
                "speculative_algorithm": "EAGLE",
                "speculative_draft_num_layers": 1,
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
            },
            "the draft worker's own QSA pool",
        ),
        ({"enable_hierarchical_cache": True}, "kvpools does not model QSA (Qwen sparse attention) pools with"),
    ],
)
def test_qsa_refusals(options: dict[str, Any], words: str) -> None:
    with pytest.raises(KvpoolsError) as refused:
        plan(parse(qsa_config(), "qsa"), Serving(max_running_requests=64, **options), memory=20 * GiB)
    assert words in str(refused.value)


def test_qsa_is_sglangs_own_parsing_and_charge() -> None:
    """SGLang's own ``parse_qsa_profile``, ``QSATokenToKVPool.qsa_bytes_per_token`` and ``QSATokenToKVPool``'s QSA
    buffers (peers venv, CPU) agree with kvpools' profile, per-token charge and pools, and raise where kvpools
    refuses."""
    python, _ = locate.require_sglang_peer()
    variants: list[tuple[dict[str, Any], str]] = [
        ({}, "auto"),
        ({}, "fp8_e4m3"),
        ({"indexer_head_dim": 64, "indexer_compress_ratio": 8, "indexer_budget": 4096}, "bfloat16"),
        ({"indexer_kv_heads": 2}, "auto"),
    ]
    cases, plans = [], []
    for indexer, dtype in variants:
        config = qsa_config(**indexer)
        case: dict[str, Any] = {"config": {**INDEXER, **indexer}, "layers": 12, "indexer_dtype": dtype}
        try:
            serving = Serving(max_running_requests=64, qsa_indexer_dtype=dtype)
            got = plan(parse(config, "qsa"), serving, memory=20 * GiB)
        except ConfigError as error:
            plans.append(error)
        else:
            plans.append(got)
            case.update(size=got.max_total_num_tokens, page_size=64, request_slots=got.max_running_requests + 1)
        cases.append(case)
    done = subprocess.run(
        [str(python), str(Path(__file__).with_name("qsa_peer.py"))],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for got, sglang in zip(plans, json.loads(done.stdout), strict=True):
        if "error" in sglang:
            assert isinstance(got, ConfigError) and sglang["error"] in str(got)
            continue
        assert not isinstance(got, ConfigError)
        assert dict(got.model.params["qsa"]) == sglang["profile"]
        assert got.pool("qsa_compressed_k").bytes_per_slot == sglang["bytes_per_token"]
        # SGLang's own QSATokenToKVPool.__init__ on CPU allocates exactly the planned (and built) QSA pools
        assert sglang["pools"] == {name: got.pool(name).bytes for name in sglang["pools"]}
        built = build(got, "meta").allocated_by_pool()
        assert sglang["pools"] == {name: built[name] for name in sglang["pools"]}


@pytest.mark.parametrize("memory", [20 * GiB, 60 * GiB + 12345])
def test_sglang_accounting_is_the_reference_configurators(memory: int) -> None:
    """The oracle runs the reference's ``MambaPoolConfigurator`` on the QSA config: the reference cell counts no QSA
    buffer, so ``--accounting sglang`` gives its tokens, requests, cell and K exactly."""
    from tests.oracle.locate import require_oracle

    from .support import compare_hybrid

    require_oracle()
    # Qwen3-Next (which the oracle's config reading knows) with the same QSA profile: 12 full layers
    config = copy.deepcopy(preset_config("qwen3-next-80b-a3b-thinking"))
    text = config.get("text_config", config)
    text.update(INDEXER)
    serving = Serving(page_size=64, max_running_requests=64)
    _, got = compare_hybrid(parse(config, "qsa-next"), config, serving, memory=memory)
    assert not isinstance(got, Exception)
    assert got.pool("qsa_compressed_k").bytes == (got.max_total_num_tokens + 64) * 768
