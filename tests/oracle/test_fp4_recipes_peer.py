"""kvpools' ``--kv-cache-dtype fp4_mx_block16`` against SGLang 0.5.23's own ``FP4MXBlock16KVCacheMethod`` (issue 33).

``sglang_fp4_peer.py`` runs the installed ``fp4_kv_cache_quant_method.py`` in the peers venv: its
``resolve_kv_cache_quant`` must name both recipes, and the buffers its ``create_buffers`` allocates for the rows
of a kvpools plan's ``kv`` pool (K and V packed, one uint8 scale per 16 values, no dequant workspace) must be
exactly the bytes kvpools plans and builds.  Skips without the peers venv (fails under
``KVPOOLS_REQUIRE_SHARED=1``), as every peer test.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kvpools_core import Serving, build
from kvpools_core.parallel import kv_heads_per_rank
from kvpools_core.pipeline import plan
from tests.oracle import locate

PYTHON, _BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_fp4_peer.py")

CASES = [("llama-3.1-8b", 1, 1), ("llama-3.1-8b", 4, 16), ("qwen3-8b", 2, 64), ("llama-3.1-70b", 8, 1)]


def _peer(cases: list[dict[str, int]]) -> dict[str, object]:
    done = subprocess.run(
        [str(PYTHON), str(PEER)], input=json.dumps(cases), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_fp4_mx_block16_is_sglangs_recipe_byte_for_byte() -> None:
    plans = []
    cases = []
    for model, tp, page in CASES:
        p = plan(model, Serving(kv_cache_dtype="fp4_mx_block16", tp_size=tp, page_size=page), memory="2GiB")
        layer = p.model.layers[0]
        assert all(
            (x.num_kv_heads, x.head_dim, x.v_head_dim) == (layer.num_kv_heads, layer.head_dim, layer.head_dim)
            for x in p.model.layers
        )
        rows = p.max_total_num_tokens + page  # the pool's rows: the tokens and the padding page
        heads = kv_heads_per_rank(layer.num_kv_heads, tp)
        cases.append({"size": rows, "head_num": heads, "head_dim": layer.head_dim, "layer_num": len(p.model.layers)})
        plans.append(p)
    answer = _peer(cases)
    assert answer["resolved"] == {"nvfp4": "nvfp4", "fp4_mx_block16": "fp4_mx_block16", "fp8_e4m3": None, "auto": None}
    for p, case, got in zip(plans, cases, answer["cases"], strict=True):  # type: ignore[call-overload]
        sglang = got["bytes"]
        assert sglang["dq_k_buffer"] == sglang["dq_v_buffer"] == 0  # PLAIN accesses only: no dequant workspace
        assert sum(sglang.values()) == p.pool("kv").bytes, (p.model.name, case, sglang)
        assert got["cell"] == p.cell.bytes_per_token
        assert build(p, "meta").allocated_by_pool()["kv"] == sum(sglang.values())


@pytest.mark.parametrize("name", ["nvfp4", "fp4_mx_block16"])
def test_both_names_are_float4_for_sglang(name: str) -> None:
    """``resolve_kv_cache_quant`` answers each name (and nothing for the other dtypes), so both reach the FP4
    pool path (``_build_fp4_quant_method``, ref-000 lines 327-341)."""
    assert _peer([])["resolved"][name] == name  # type: ignore[index]
