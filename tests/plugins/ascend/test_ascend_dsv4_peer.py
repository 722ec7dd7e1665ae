"""DeepSeek-V4's NPU pools against SGLang 0.5.23's own classes (issue 33).

``sglang_dsv4_npu_peer.py`` builds, in the peers venv on ``meta``, the installed ``DSV4NPUTokenToKVPool`` (with its
bases ``DeepSeekV4TokenToKVPool``, ``DeepSeekV4SingleKVPool``, ``DeepSeekV4IndexerPool``, ``CompressStatePool``),
``DSV4NPUReqToTokenPool`` over ``ReqToTokenPool`` and ``DSV4NPUTokenToKVPoolAllocator``'s c128 part, unchanged but
for stand-ins of ``torch_npu``, the runtime contexts and the allocators' bases (the peer's docstring), for the sizes
of kvpools' plans; every buffer's bytes must be the plan's pool's.  Skips without the peers venv (fails under
``KVPOOLS_REQUIRE_SHARED=1``), as every peer test.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import attrs

from kvpools_core import Plan, Serving, plan
from kvpools_core.parallel import rank_layer_range
from tests.oracle import locate

PYTHON, _BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_dsv4_npu_peer.py")
FLASH = Serving(platform="ascend", tp_size=4)
EAGLE: dict[str, Any] = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
}
NPU_POOLS = (
    "kv_swa",
    "kv_c4",
    "kv_c128",
    "indexer_c4",
    "index_k_c4",
    "index_scale_c4",
    "c4_state",
    "c4_indexer_state",
    "c128_state",
    "req_to_token",
    "req_to_c128_sidecar",
    "c128_page_refcount",
    "draft_kv_swa",
)


def _peer(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(PYTHON), str(PEER)], input=json.dumps(cases), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _case(p: Plan, **changes: Any) -> dict[str, Any]:
    config = p.sizing.sglang_config
    first = p.model.layers[0].params
    start, end = rank_layer_range(p.model, p.serving)
    row_len = p.pool("req_to_token").bytes_per_slot // 4
    return {
        "arch35": p.serving.plugin_options.get("ascend.soc") == "arch35",
        "c128_page_size": int(p.serving.plugin_options.get("ascend.c128_page_size", 16)),
        "max_num_reqs": p.max_running_requests + p.serving.decode_extra_slots,
        "max_context_len": row_len,
        "swa_size": config["swa_max_total_num_tokens"],
        "c4_size": config["c4_max_total_num_tokens"],
        "c128_size": config["c128_max_total_num_tokens"],
        "c4_state_pool_size": config["c4_state_pool_size"],
        "c128_state_pool_size": config["c128_state_pool_size"],
        "page_size": p.serving.page_size,
        "window": int(first["window_size"]),
        "nope": int(first["qk_nope_head_dim"]),
        "rope": int(first["qk_rope_head_dim"]),
        "index_dim": int(p.model.params["index_head_dim"]),
        "start": start,
        "end": end,
        "ratios": [int(layer.params.get("compress_ratio", 0)) for layer in p.model.layers],
        "full_size": config["full_max_total_num_tokens"],
        "draft_tokens": (p.serving.speculative_num_draft_tokens or 0) if p.serving.speculative else 0,
        "draft_layers": (p.serving.speculative_draft_num_layers or 1) if p.serving.speculative else 0,
        **changes,
    }


PLANS = {
    "flash": (FLASH, "deepseek-v4-flash", "60GiB"),
    "pp-stage-1": (attrs.evolve(FLASH, pp_size=2, pp_rank=1), "deepseek-v4-flash", "60GiB"),
    "arch35": (attrs.evolve(FLASH, plugin_options={"ascend.soc": "arch35"}), "deepseek-v4-flash", "60GiB"),
    "arch35-many-requests": (
        attrs.evolve(FLASH, plugin_options={"ascend.soc": "arch35"}, max_running_requests=4096),
        "deepseek-v4-flash",
        "60GiB",
    ),
    "c128-page-64": (
        attrs.evolve(FLASH, plugin_options={"ascend.c128_page_size": "64"}, max_running_requests=32),
        "deepseek-v4-flash",
        "20GiB",
    ),
    "pro": (Serving(platform="ascend", tp_size=8), "deepseek-v4-pro", "60GiB"),
    "eagle": (attrs.evolve(FLASH, **EAGLE), "deepseek-v4-flash", "60GiB"),
    "eagle-arch35": (
        attrs.evolve(FLASH, **EAGLE, plugin_options={"ascend.soc": "arch35"}),
        "deepseek-v4-flash",
        "60GiB",
    ),
}


def test_every_npu_buffer_is_sglangs() -> None:
    plans = {name: plan(model, serving, memory=memory) for name, (serving, model, memory) in PLANS.items()}
    answers = _peer([_case(p) for p in plans.values()])
    for (name, p), sglang in zip(plans.items(), answers, strict=True):
        assert "error" not in sglang, (name, sglang)
        ours = {pool.name: pool.bytes for pool in p.pools if pool.name in NPU_POOLS}
        assert sglang["bytes"] == ours, name
        # NPUPagedTokenToKVPoolAllocator(c128_size, page_size=c128_page_size): size // page free pages
        size, page, pages = sglang["c128_allocator"]
        assert size == p.sizing.sglang_config["c128_max_total_num_tokens"], name
        assert (page, pages) == (_case(p)["c128_page_size"], p.pool("c128_allocator").slots), name


def test_sglang_refuses_hisparse_on_npu() -> None:
    """kvpools refuses ``--enable-hisparse`` on ascend with the assertion SGLang's NPU pool raises."""
    (answer,) = _peer([_case(plan("deepseek-v4-flash", FLASH, memory="60GiB"), hisparse=True)])
    assert answer["error"] == (
        "AssertionError: enable_hisparse is not supported on the NPU DSV4 KV pool (got c4 pool class "
        "HiSparseC4DevicePool)."
    )
    from kvpools_ascend.dsv4 import SGLANG_HISPARSE

    assert answer["error"].removeprefix("AssertionError: ") == SGLANG_HISPARSE
