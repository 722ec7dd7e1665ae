"""Differential: a GLM5-Next DSA hybrid's index keys against SGLang 0.5.23's own code, run on CPU (peers venv).

``tests/dsa/sglang_dsa_peer.py`` compiles ``is_deepseek_dsa`` and ``dsa_layer_skips_topk`` from the installed
``configs/model_config.py`` and builds the installed ``IndexKeyCache`` (``mem_cache/index_key_cache.py``) on
``meta``.  ``_build_hybrid_linear_kv_pool`` passes ``skip_topk_layers=[dsa_layer_skips_topk(config, i) for i in
full_attention_layer_ids]`` and ``HybridLinearKVPool`` gives its ``DSATokenToKVPool`` ``layer_num`` = the full
layers' count (``index_buf_size`` = ``size`` without DCP or HiSparse); the pool classes need a GPU, so the test
states those two lines and lets SGLang's code answer the rest.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import Serving, plan
from tests.oracle import locate

from .test_glm5_next_dsa import FULL, _spec, glm5_next

PYTHON, BENCH = locate.require_sglang_peer()
PEER = Path(__file__).parents[1] / "dsa" / "sglang_dsa_peer.py"
GiB = 1 << 30


def _peer(cases: list[dict[str, Any]]) -> list[Any]:
    out = subprocess.run(
        [str(PYTHON), str(PEER), str(BENCH)], input=json.dumps(cases), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    answers: list[Any] = json.loads(out.stdout)
    return answers


def _served(config: dict[str, Any]) -> dict[str, Any]:
    """The fields SGLang reads off ``hf_config`` (``Glm5NextConfig`` copies the top-level keys into its text
    config; here every key is given at the top level, which both read)."""
    return {**config["text_config"], "architectures": config["architectures"]}


CASES = {
    "IndexShare pattern": glm5_next(),
    "freq 2 offset 3": glm5_next(index_topk_pattern=None, index_topk_freq=2, index_skip_topk_offset=3),
    "every layer": glm5_next(index_topk_pattern=None),
    "index_kpool 2": glm5_next(index_kpool=2),
}


@pytest.mark.parametrize("label", list(CASES))
def test_index_keys_match_sglang(label: str) -> None:
    """SGLang's ``is_deepseek_dsa`` holds, its ``skip_topk_layers`` over the full layers are kvpools', and its
    ``IndexKeyCache`` for the plan's pool arguments holds exactly the plan's ``indexer`` bytes."""
    config = CASES[label]
    spec = _spec(config)
    got = plan(spec, Serving(), memory=4 * GiB)
    [answer] = _peer([{"op": "skips", "config": _served(config), "num_layers": spec.num_layers}])
    assert answer["is_deepseek_dsa"] is True
    skips = [answer["skips"][i] for i in FULL]
    assert [bool(spec.layers[i].params.get("skips_topk")) for i in FULL] == skips
    [buffers] = _peer(
        [
            {
                "op": "index_cache",
                "page_size": got.serving.page_size,
                "index_kpool": config["text_config"].get("index_kpool", 1),
                "skip_topk_layers": skips,
                "index_buf_size": got.max_total_num_tokens,
            }
        ]
    )
    planned = {pool.name: pool.bytes for pool in got.pools}
    assert planned.get("indexer", 0) == sum(buffers)  # "freq 2 offset 3": every full layer skips, no pool
    assert [nbytes == 0 for nbytes in buffers] == skips
