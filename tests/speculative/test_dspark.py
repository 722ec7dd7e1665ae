"""DSPARK speculative decoding (issue 33, ledger row 002-13).

SGLang's ``DefaultPoolConfigurator`` scales the target's cell for the whole DFLASH family, DFLASH and DSPARK
(``mr.spec_algorithm.is_dflash_family()``, ``002_50706b73e02ffb67.txt`` lines 159-175):
``scale_kv_cell_size_per_token_for_dflash`` = ``ceil(cell * (L + D) / L)``.  What ``_handle_dspark``
(SGLang 0.5.23 ``arg_groups/speculative_hook.py``) refuses is refused with its words; what it resolves and
kvpools does not model (top-k and steps overridden to 1, the draft-token count from the draft checkpoint) is
refused naming the value.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import attrs
import pytest

from kvpools_core import Serving, build
from kvpools_core.errors import KvpoolsError
from kvpools_core.pipeline import plan
from tests.oracle import locate

GiB = 1 << 30
DSPARK = Serving(speculative_algorithm="DSPARK", speculative_draft_num_layers=1, speculative_num_draft_tokens=8)


@pytest.mark.parametrize(("draft", "want"), ((1, 135_168), (5, 151_552)))
def test_dspark_scales_the_cell_like_dflash(draft: int, want: int) -> None:
    """Llama-3.1-8B bf16: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B/token.  DSPARK, D draft
    layers: ceil(131,072 x (32 + D) / 32) = 135,168 (D=1), 151,552 (D=5); the exact parts add D layers of
    4,096 B (draft_k + draft_v)."""
    got = plan("llama-3.1-8b", attrs.evolve(DSPARK, speculative_draft_num_layers=draft), memory=40 * GiB)
    assert got.cell.sglang_bytes_per_token == want
    assert got.cell.bytes_per_token == 131_072 + draft * 4_096
    assert got.pool("draft_kv").bytes == (got.max_total_num_tokens + 1) * draft * 4_096
    dflash = plan(
        "llama-3.1-8b",
        attrs.evolve(DSPARK, speculative_algorithm="DFLASH", speculative_draft_num_layers=draft),
        memory=40 * GiB,
    )
    assert got.max_total_num_tokens == dflash.max_total_num_tokens


def test_dspark_builds_on_meta_exactly() -> None:
    """Every pool of a DSPARK plan (target KV, the draft worker's KV, request table, allocator) allocates exactly
    the bytes planned."""
    planned = plan("qwen3-8b", attrs.evolve(DSPARK, tp_size=2, page_size=16), memory=8 * GiB)
    assert planned.pool("draft_kv").bytes > 0
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}


def test_dspark_on_a_pd_prefill_node_may_split_the_pipeline() -> None:
    """'DSpark pipeline parallelism requires PD prefill': a prefill node with PP 2 is planned."""
    got = plan("llama-3.1-8b", attrs.evolve(DSPARK, pp_size=2, disaggregation_mode="prefill"), memory=40 * GiB)
    assert got.cell.sglang_bytes_per_token == -(-65_536 * 17 // 16)  # 16 stage layers, 1 draft layer


@pytest.mark.parametrize(
    ("options", "words"),
    (
        ({"platform": "cpu"}, "DSpark speculative decoding only supports CUDA, NPU or XPU device."),
        ({"pp_size": 2}, "DSpark pipeline parallelism requires PD prefill"),
        (
            {"tp_size": 4, "dp_size": 2, "enable_dp_attention": True, "attn_cp_size": 2},
            "DSpark with dp attention does not support context parallel (attn_cp_size=2).",
        ),
        ({"speculative_eagle_topk": 4}, "DSpark only supports speculative_eagle_topk == 1"),
        ({"speculative_num_steps": 3}, "DSpark only supports speculative_num_steps == 1"),
        ({"speculative_num_draft_tokens": None}, "(8 with the default gamma 7)"),
        ({"speculative_num_draft_tokens": 1}, "DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), got 1."),
        ({"speculative_draft_num_layers": None}, "charges the draft model's KV cache"),
    ),
)
def test_dspark_refusals_give_sglangs_reason(options: dict[str, object], words: str) -> None:
    with pytest.raises(KvpoolsError) as refused:
        plan("llama-3.1-8b", attrs.evolve(DSPARK, **options), memory=40 * GiB)
    assert words in str(refused.value)


def test_dspark_cell_is_sglangs_own_scaling() -> None:
    """SGLang 0.5.23's own ``scale_kv_cell_size_per_token_for_dflash`` (peers venv) gives kvpools' DSPARK cell,
    and its ``is_dflash_family`` names DFLASH and DSPARK."""
    python, _ = locate.require_sglang_peer()
    cases = []
    plans = []
    for model, tp, draft in (("llama-3.1-8b", 1, 1), ("qwen3-8b", 2, 3), ("llama-3.1-70b", 8, 2)):
        got = plan(model, attrs.evolve(DSPARK, tp_size=tp, speculative_draft_num_layers=draft), memory=40 * GiB)
        target = plan(model, Serving(tp_size=tp), memory=40 * GiB)
        cases.append([int(target.cell.sglang_bytes_per_token), got.cell.num_layers, draft])
        plans.append(got)
    done = subprocess.run(
        [str(python), str(Path(__file__).parents[1] / "oracle" / "sglang_dflash_peer.py")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["dflash_family"] == ["DFLASH", "DSPARK"]
    assert answer["cells"] == [p.cell.sglang_bytes_per_token for p in plans]


def test_dspark_draft_rides_on_the_targets_host_slots() -> None:
    """HiCache: the DSPARK draft pool is a sidecar host pool (``build_full_draft_pools``) with the target's host
    slots (hicache_ratio 2 x the device slots), 1 layer x 4,096 B each, as every non-MTP draft."""
    got = plan(
        "llama-3.1-8b",
        attrs.evolve(DSPARK, enable_hierarchical_cache=True, hicache_ratio=2),
        memory=20 * GiB,
        host_memory=512 * GiB,
    )
    assert got.host is not None
    host = {pool.name: pool for pool in got.host.pools}
    assert host["draft_kv"].rides_on == "kv"
    assert host["draft_kv"].slots == host["kv"].slots
    assert host["draft_kv"].bytes == host["kv"].slots * 4_096
