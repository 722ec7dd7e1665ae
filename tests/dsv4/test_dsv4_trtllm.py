"""``--dsv4-attn-backend``: the trtllm uniform fp8 pools and the layouts the backends force (issue 33).

Sources (SGLang 0.5.23): ``srt/mem_cache/deepseek_v4_memory_pool.py`` ``select_dsv4_kv_layout`` (L198-241:
``flashmla_mega`` makes every mode but ``v41_new`` ``v41``; ``trtllm`` asserts mode auto / v4 and option auto / fp8
and returns ``(V4, None)``), ``DeepSeekV4UniformFP8KVPool`` (L383-436: ``qk_nope_head_dim + qk_rope_head_dim`` e4m3
bytes a token, asserted 512, pages of exactly ``page_size x 512`` B) and ``DeepSeekV4TokenToKVPool.__init__``
(L1031-1037, L1227-1243: ``uniform_fp8`` builds the SWA and compressed pools with it);
``srt/model_executor/pool_configurator.py`` L1104-1105 (``kv_bytes = self.attn_head_dim`` under trtllm) and
L1356 (no page pad); ``srt/arg_groups/deepseek_v4_hook.py`` L92-137 (the asserts refused here).
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
import torch
from kvpools_plugins.dsv4.layouts import UNIFORM_FP8, V4, V41, V41_NEW, auto_is_v41, compressed_layout, main_layout

from kvpools_core import Serving, build
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.values import PlatformTraits

FLASH = "deepseek-v4-flash"
CONFIGS = Path(__file__).with_name("configs")
V41_MODEL = str(CONFIGS / "dsv41_synthetic.json")
V4_SOURCES = str(CONFIGS / "dsv4_kv_source_synthetic.json")
TRTLLM = Serving(tp_size=4, dsv4_attn_backend="trtllm")
EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
}


def _on(capability: tuple[int, int] | None, platform: str = "cuda", **options: object) -> Serving:
    traits = PlatformTraits(platform=platform, compute_capability=capability)
    return Serving(platform=platform, platform_traits=traits, **options)  # type: ignore[arg-type]


def test_uniform_fp8_pages_by_hand() -> None:
    """deepseek-v4-flash (43 layers: 21 c4, 20 c128), TP 4, page 256: every pool 512 B a token, no page padding."""
    p = plan(FLASH, TRTLLM, memory="60GiB")
    c = {k: int(v) for k, v in p.sizing.sglang_config.items()}
    swa, c4, c128 = c["swa_max_total_num_tokens"], c["c4_max_total_num_tokens"], c["c128_max_total_num_tokens"]
    # _num_dsv4_physical_kv_pages = ceil((size + global_page) / page), global_page 256 (L166-171, L1579-1589)
    # SWA: 256 x 512 = 131,072 B a page (the V4 page is 256 x 584 = 149,504 padded to 149,760 B)
    assert p.pool("kv_swa").bytes == -(-(swa + 256) // 256) * 131_072 * 43
    # c4: 64-token pages of 32,768 B; c128: 2-token pages of 1,024 B (V4 pads 1,168 to 1,728)
    assert p.pool("kv_c4").bytes == -(-(c4 + 256) // 64) * 32_768 * 21
    assert p.pool("kv_c128").bytes == -(-(c128 + 256) // 2) * 1_024 * 20
    assert any("DeepSeekV4UniformFP8KVPool rows of 512 B" in note for note in p.sizing.notes)


def test_sglang_accounting_charges_512_bytes_a_row() -> None:
    """``_get_bytes_per_full_token`` under trtllm: ``kv_bytes = attn_head_dim`` = 448 + 64 = 512 instead of
    ``nope + 2 rope + 8`` = 584, for the SWA rows (swa_full_tokens_ratio 0.1 x 43 layers), the c4 rows (1/4 x 21)
    and the c128 rows (1/128 x 20); the indexer and the compressor states are unchanged."""
    base = plan(FLASH, Serving(tp_size=4, accounting="sglang"), memory="60GiB")
    trt = plan(FLASH, attrs.evolve(TRTLLM, accounting="sglang"), memory="60GiB")
    rows = 0.1 * 43 + 21 / 4 + 20 / 128
    assert trt.cell.sglang_bytes_per_token == pytest.approx(base.cell.sglang_bytes_per_token - 72 * rows)
    assert int(trt.sizing.sglang_config["max_total_num_tokens"]) > int(
        base.sizing.sglang_config["max_total_num_tokens"]
    )


@pytest.mark.parametrize(
    ("model", "serving"),
    [
        (FLASH, TRTLLM),
        (FLASH, attrs.evolve(TRTLLM, accounting="sglang")),
        (V41_MODEL, Serving(dsv4_attn_backend="trtllm")),
        (V4_SOURCES, Serving(dsv4_attn_backend="trtllm", **EAGLE)),  # type: ignore[arg-type]
    ],
    ids=["flash", "flash-sglang", "v41-low-ratio", "eagle-draft"],
)
def test_meta_build_allocates_what_the_plan_charges(model: str, serving: Serving) -> None:
    if model == FLASH:
        serving = attrs.evolve(serving, max_running_requests=256)
    p = plan(model, serving, memory="20GiB")
    assert build(p, "meta").allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools}
    kv = [pool for pool in p.pools if pool.name.startswith(("kv_", "draft_kv"))]
    assert kv and all(pool.bytes % 512 == 0 for pool in kv)


def test_uniform_rows_round_trip_on_cpu() -> None:
    """``set_key_buffer_fused``: the finished row cast to e4m3, stored at ``loc``'s 512-byte row of its page."""
    p = plan(FLASH, attrs.evolve(TRTLLM, max_running_requests=2, context_length=4096), memory="2GiB")
    pool = build(p, "cpu").kv_pool
    swa = pool.swa_kv_pool
    assert swa.layout is UNIFORM_FP8
    loc = torch.tensor([0, 5, 257])
    gen = torch.Generator().manual_seed(0)
    nope, rope = torch.randn(3, 448, generator=gen), torch.randn(3, 64, generator=gen)
    swa.set_kv(0, loc, nope, rope)
    got_nope, got_rope = swa.get_kv(0, loc, torch.float32)
    assert torch.equal(got_nope, nope.to(torch.float8_e4m3fn).float())
    assert torch.equal(got_rope, rope.to(torch.float8_e4m3fn).float())
    # slot 257: page 1, row 1 -> bytes 512..1023 of page 1
    row = swa.buffer(0)[1, 512:1024]
    assert torch.equal(row, torch.cat((nope[2], rope[2])).to(torch.float8_e4m3fn).view(torch.uint8))


def test_backends_force_the_layout() -> None:
    """``select_dsv4_kv_layout``: flashmla_mega turns v4 / auto into v41 (v41_new stays); trtllm keeps V4 and
    its pools are uniform fp8, so ``auto`` on a Blackwell GPU is not V4.1 under it."""
    assert main_layout(_on((10, 0), dsv4_attn_backend="flashmla_mega", dsv4_kv_layout="v4")) is V41
    assert main_layout(_on((10, 0), dsv4_attn_backend="flashmla_mega", dsv4_kv_layout="v41_new")) is V41_NEW
    assert main_layout(_on(None, dsv4_attn_backend="flashmla_mega")) is V41
    blackwell_trt = _on((10, 0), dsv4_attn_backend="trtllm")
    assert not auto_is_v41(blackwell_trt) and auto_is_v41(_on((10, 0)))
    assert main_layout(blackwell_trt) is UNIFORM_FP8
    assert {compressed_layout(blackwell_trt, r) for r in (1, 2, 4, 128)} == {UNIFORM_FP8}
    assert main_layout(_on((10, 0), dsv4_attn_backend="flashmla")) is V41
    assert main_layout(_on((9, 0), dsv4_attn_backend="flashmla")) is V4


def test_trtllm_on_b200_plans_without_the_gpu_note() -> None:
    p = plan(FLASH, Serving(tp_size=4, dsv4_attn_backend="trtllm"), gpu="b200")
    assert main_layout(p.serving) is UNIFORM_FP8
    assert not [note for note in p.sizing.notes if "auto planned as" in note or "kvpools does not know" in note]


@pytest.mark.parametrize(
    ("model", "args", "message"),
    [
        (FLASH, {"kv_cache_dtype": "bf16"}, "--dsv4-attn-backend trtllm requires kv_cache_dtype=fp8_e4m3, got bf16."),
        (FLASH, {"enable_hisparse": True, "disable_radix_cache": True},
         "--dsv4-attn-backend trtllm does not support enable_hisparse."),
        (FLASH, {"attn_cp_size": 2, "tp_size": 4}, "--dsv4-attn-backend trtllm does not support context parallelism"),
        (FLASH, {"disaggregation_mode": "decode"}, "--dsv4-attn-backend trtllm does not support PD disaggregation yet"),
        (FLASH, {"chunked_prefill_size": None},
         "--dsv4-attn-backend trtllm requires chunked prefill (--chunked-prefill-size > 0)."),
        (FLASH, {"dsv4_kv_layout": "v41"}, "trtllm uses uniform FP8 pools, not the packed V4.1 KV layouts"),
        (FLASH, {"dsv4_compressed_kv_layout": "fp4"}, "trtllm uses uniform FP8 pools, not the packed V4.1 KV layouts"),
    ],
    ids=["bf16", "hisparse", "cp", "pd", "no-chunk", "v41", "fp4"],
)  # fmt: skip
def test_trtllm_refusals(model: str, args: dict[str, object], message: str) -> None:
    serving = Serving(dsv4_attn_backend="trtllm", **args)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedCombinationError, match=re.escape(message)):
        plan(model, serving, memory="60GiB")


def test_trtllm_off_blackwell_is_refused() -> None:
    with pytest.raises(UnsupportedCombinationError, match=re.escape("requires an SM100/SM103 (Blackwell) GPU.")):
        plan(FLASH, Serving(tp_size=4, dsv4_attn_backend="trtllm"), gpu="h100")


def test_flashmla_mega_needs_deepseek_v41_on_blackwell() -> None:
    message = "--dsv4-attn-backend flashmla_mega requires DeepSeek-V4.1 on SM100/SM103."
    with pytest.raises(UnsupportedCombinationError, match=re.escape(message)) as caught:
        plan(FLASH, Serving(tp_size=4, dsv4_attn_backend="flashmla_mega"), memory="60GiB")
    assert "'deepseek_v4'" in str(caught.value)
    with pytest.raises(UnsupportedCombinationError, match=re.escape(message)):
        plan(V41_MODEL, Serving(dsv4_attn_backend="flashmla_mega"), gpu="h100")
    p = plan(V41_MODEL, Serving(dsv4_attn_backend="flashmla_mega", dsv4_kv_layout="v4"), memory="20GiB")
    assert main_layout(p.serving) is V41


def test_vllm_accounting_refuses_the_backend() -> None:
    from kvpools_core.engines.vllm import plan_vllm

    with pytest.raises(ConfigError, match=re.escape("dsv4_attn_backend is SGLang's option; accounting vllm")):
        plan_vllm(FLASH, Serving(tp_size=4, dsv4_attn_backend="trtllm"), memory="60GiB")


def test_trtllm_off_cuda_is_refused_with_sglangs_reason() -> None:
    """``apply_deepseek_v4_defaults`` asserts ``cfg.device == "cuda" and is_sm100_supported()``: a ROCm server
    (SGLang's HIP build has no SM100) is refused, whatever the pool layout its platform selects."""
    from kvpools_plugins.dsv4.trtllm import backend_problems

    model = plan(FLASH, Serving(tp_size=4), memory="60GiB").model
    problems = backend_problems(model, _on(None, platform="rocm", dsv4_attn_backend="trtllm"))
    assert any("requires an SM100/SM103 (Blackwell) GPU." in p and "the rocm platform" in p for p in problems)
    assert backend_problems(model, _on(None, dsv4_attn_backend="trtllm")) == []
    assert backend_problems(model, _on((10, 3), dsv4_attn_backend="trtllm")) == []
