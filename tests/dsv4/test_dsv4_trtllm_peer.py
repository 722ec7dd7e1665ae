"""``--dsv4-attn-backend`` against SGLang 0.5.23's own code (issue 33).

``sglang_dsv4_trtllm_peer.py`` runs, in the peers venv, the installed ``select_dsv4_kv_layout`` with the backend
set (``get_exec().kernel.dsv4_attn_backend``), and ``DeepSeekV4UniformFP8KVPool.get_bytes_per_token`` /
``create_buffer`` (on ``meta``) of ``srt/mem_cache/deepseek_v4_memory_pool.py``, unchanged.  Skips without the
peers venv (fails under ``KVPOOLS_REQUIRE_SHARED=1``), as every peer test.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from kvpools_plugins.dsv4.layouts import UNIFORM_FP8, layout_mode, layout_problems, main_layout
from kvpools_plugins.dsv4.trtllm import backend_problems

from kvpools_core import Serving, build
from kvpools_core.pipeline import plan
from kvpools_core.values import PlatformTraits
from tests.dsv4.peers import run_peer
from tests.oracle import locate

PYTHON, _BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_dsv4_trtllm_peer.py")
CONFIGS = Path(__file__).with_name("configs")
V41 = str(CONFIGS / "dsv41_synthetic.json")
V4_SOURCES = str(CONFIGS / "dsv4_kv_source_synthetic.json")
BACKENDS = ("trtllm", "flashmla_mega")
MODES = ("auto", "v4", "v41", "v41_new")
OPTIONS = ("auto", "fp8", "fp4")


def test_backend_layout_selection_is_select_dsv4_kv_layout() -> None:
    """Every (backend, mode, option) on an SM100 GPU: where SGLang asserts, kvpools refuses with its words; where
    it returns, kvpools plans its layout (trtllm: SGLang's V4, built as the uniform fp8 rows)."""
    grid = list(itertools.product(BACKENDS, MODES, OPTIONS))
    answer = run_peer(PYTHON, PEER, {"selections": [[b, m, o, 10] for b, m, o in grid], "buffers": []})
    model = plan(V41, Serving(), memory="20GiB").model
    for (backend, mode, opt), sglang in zip(grid, answer["selections"], strict=True):
        serving = Serving(
            platform_traits=PlatformTraits(platform="cuda", compute_capability=(10, 0)),
            dsv4_attn_backend=backend,
            dsv4_kv_layout=mode,
            dsv4_compressed_kv_layout=opt,
        )
        problems = [*layout_problems(model, serving), *backend_problems(model, serving)]
        case = (backend, mode, opt)
        if "error" in sglang:
            assert any(sglang["error"] in p for p in problems), (case, sglang, problems)
            continue
        assert not problems, (case, problems)
        if backend == "trtllm":
            assert layout_mode(serving) == sglang["main"] == "v4" and sglang["option"] is None, case
            assert main_layout(serving) is UNIFORM_FP8, case
        else:
            assert main_layout(serving).name == sglang["main"], case


@pytest.mark.parametrize(
    ("model", "serving"),
    [
        ("deepseek-v4-flash", Serving(tp_size=4, dsv4_attn_backend="trtllm", max_running_requests=256)),
        (V41, Serving(dsv4_attn_backend="trtllm")),
        (V4_SOURCES, Serving(dsv4_attn_backend="trtllm", speculative_algorithm="EAGLE", speculative_num_steps=3,
                             speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                             speculative_draft_num_layers=1)),
    ],
    ids=["flash", "v41-low-ratio", "eagle-draft"],
)  # fmt: skip
def test_built_rows_are_create_buffers(model: str, serving: Serving) -> None:
    """Every KV row pool kvpools builds (SWA, c4, c128, the draft's SWA, the ratio-1/2 pools), per layer, against
    the tensor ``DeepSeekV4UniformFP8KVPool.create_buffer`` allocates for the same page size and page count."""
    p = plan(model, serving, memory="20GiB")
    pool = build(p, "meta").kv_pool
    rows = [pool.swa_kv_pool, pool.c4_kv_pool, pool.c128_kv_pool, pool.draft_swa_kv_pool]
    rows = [r for r in (*rows, *pool.low_ratio_kv_pools.values()) if r is not None]
    assert len(rows) >= 3
    nope, rope = rows[0].nope, rows[0].rope
    answer = run_peer(
        PYTHON, PEER, {"selections": [], "buffers": [[nope, rope, r.page_size, r.geo.pages] for r in rows]}
    )
    for r, sglang in zip(rows, answer["buffers"], strict=True):
        assert r.layout is UNIFORM_FP8, r.name
        assert sglang["bytes_per_token"] == r.geo.row_bytes == 512, r.name
        assert sglang["page_bytes"] == r.geo.page_bytes, r.name
        for layer in r.geo.layers:
            t = r.buffer(layer)
            assert t.numel() * t.element_size() == sglang["nbytes"], (r.name, layer)
            assert list(t.shape) == sglang["shape"], (r.name, layer)


def test_a_non_512_latent_is_refused_as_create_buffer_asserts() -> None:
    from .test_dsv4_pool import small_model  # 128 nope + 64 rope

    answer = run_peer(PYTHON, PEER, {"selections": [], "buffers": [[128, 64, 256, 1]]})
    problems = backend_problems(small_model(), Serving(dsv4_attn_backend="trtllm"))
    assert any(answer["buffers"][0]["error"] in p for p in problems), problems
