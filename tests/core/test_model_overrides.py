"""SGLang 0.5.23's per-model server-arg overrides that change memory, as the architecture plugins answer them.

``docs/sizing.md`` ("The engine's own defaults for unset options") tables all 35 files of
``sglang/srt/arg_groups/model_overrides/``; this module pins each override kvpools models with a plan that
changes, the SGLang source line cited, and the explicit option winning.  The differential twin is
``tests/oracle/test_engine_defaults_sglang.py`` (SGLang's own providers, run in the peers venv).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpools_core import Serving, plan
from kvpools_core.models import resolve_model_source
from kvpools_core.registry import get_registry
from kvpools_core.values import is_unset

GiB = 1 << 30


def _notes(result: object) -> list[str]:
    return list(result.sizing.notes)  # type: ignore[attr-defined]


# -- deepseek_v2.py: DSA decode context parallelism takes TRT-LLM backends ---------------------------------


def test_dsa_under_dcp_takes_sglangs_trtllm_backends_and_their_raw_latent_row() -> None:
    """``_dsa_dcp_overrides`` (``model_overrides/deepseek_v2.py`` lines 18-34, called at line 100 for
    ``is_deepseek_dsa``): with ``--dcp-size`` > 1 both DSA backends unset become ``trtllm``, which reads the raw
    latent row (``calculate_mla_kv_cache_dim``) instead of FlashMLA's packed fp8 one.

    DeepSeek-V3.2, 61 layers, fp8: raw 512 + 64 (rope) = 576 B per layer, 61 x 576 = 35,136 B; packed 512 + 16
    (scales) + 128 (bf16 rope) = 656 B, 61 x 656 = 40,016 B; beside either, the 132 B index keys of every layer
    replicated on the DCP 8 ranks' index buffer (``(S + P) x dcp - P`` rows, ``DSATokenToKVPool``): 8 x 61 x 132 =
    64,416 B.  Before the fix kvpools kept the packed row: 398,336 tokens at 40 GiB where the trtllm row gives
    417,856."""
    serving = Serving(tp_size=8, dcp_size=8, kv_cache_dtype="fp8_e4m3")
    unset = plan("deepseek-v3.2", serving, memory=40 * GiB)
    assert (unset.serving.dsa_prefill_backend, unset.serving.dsa_decode_backend) == ("trtllm", "trtllm")
    assert not is_unset(unset.serving.dsa_prefill_backend)
    assert unset.cell.bytes_per_token == 61 * (512 + 64) + 8 * 61 * 132 == 99_552
    assert unset.max_total_num_tokens == 417_856
    source = "_dsa_dcp_overrides in arg_groups/model_overrides/deepseek_v2.py"
    assert any(note.startswith("dsa_decode_backend trtllm") and source in note for note in _notes(unset))
    given = plan(
        "deepseek-v3.2",
        Serving(
            tp_size=8,
            dcp_size=8,
            kv_cache_dtype="fp8_e4m3",
            dsa_prefill_backend="flashmla_sparse",
            dsa_decode_backend="flashmla_kv",
        ),
        memory=40 * GiB,
    )
    assert given.cell.bytes_per_token == 61 * (512 + 16 + 128) + 8 * 61 * 132 == 104_432
    assert given.max_total_num_tokens == 398_336
    assert not any("dsa_" in note and "overrides it" in note for note in _notes(given))


def test_dsa_without_dcp_keeps_the_generic_backends() -> None:
    """``_dsa_dcp_overrides`` returns nothing at ``dcp_size`` 1 (line 19)."""
    result = plan("deepseek-v3.2", Serving(kv_cache_dtype="fp8_e4m3"), memory=40 * GiB)
    assert "dsa_prefill_backend" in result.serving.unset_options
    assert result.cell.bytes_per_token == 48_068


# -- minimax_m3.py: page 128 on Hopper and Blackwell -----------------------------------------------------------


def test_minimax_m3_takes_page_128_on_cuda() -> None:
    """``_minimax_m3_overrides`` (``model_overrides/minimax_m3.py``): ``page_size`` 128 when unset on SM90 with
    fa3 (lines 178-187) and on SM100 with fa4 / trtllm_mha (lines 147-168), the backends an unset
    ``--attention-backend`` resolves to there.  At TP 8, 40 GiB the page-1 plan's 758,064 tokens round down to
    758,064 // 128 x 128 = 758,016."""
    unset = plan("minimax-m3", Serving(tp_size=8), memory=40 * GiB)
    page_1 = plan("minimax-m3", Serving(tp_size=8, page_size=1), memory=40 * GiB)
    page_128 = plan("minimax-m3", Serving(tp_size=8, page_size=128), memory=40 * GiB)
    assert unset.serving.page_size == 128 and unset.provenance["engine_defaults"] == ("minimax_sparse",)
    assert page_1.max_total_num_tokens == 758_064
    assert unset.max_total_num_tokens == 758_064 // 128 * 128 == 758_016 == page_128.max_total_num_tokens
    assert any(note.startswith("page_size 128") and "minimax_m3.py" in note for note in _notes(unset))
    assert "engine_defaults" not in page_1.provenance


@pytest.mark.parametrize("platform", ["rocm", "cpu"])
def test_minimax_m3_keeps_the_generic_page_off_cuda(platform: str) -> None:
    """ROCm's branch (lines 124-146) declares no page; kvpools answers for CUDA only."""
    result = plan("minimax-m3", Serving(tp_size=8, platform=platform), memory=40 * GiB)
    assert result.serving.page_size == 1 and "engine_defaults" not in result.provenance


# -- gemma2_gemma3.py / is_hybrid_swa_model: one dense pool under SGLang's accounting --------------------------


@pytest.mark.parametrize(
    ("preset", "per_token", "tokens"),
    [
        # 48 layers x 8 KV heads x (256 + 256) x 2 B = 393,216 B; 20 GiB // 393,216 = 54,613
        ("gemma-3-12b-it", 48 * 8 * 512 * 2, 54_613),
        # 42 layers x 8 x (256 + 256) x 2 = 344,064 B; 20 GiB // 344,064 = 62,415
        ("gemma-2-9b", 42 * 8 * 512 * 2, 62_415),
        # 32 layers x 8 x (128 + 128) x 2 = 131,072 B; 20 GiB // 131,072 = 163,840
        ("mistral-7b-v0.1", 32 * 8 * 256 * 2, 163_840),
    ],
)
def test_sglang_accounting_sizes_gemma_2_3_and_mistral_as_one_dense_pool(
    preset: str, per_token: int, tokens: int
) -> None:
    """``gemma2_gemma3.py`` line 26 declares ``disable_hybrid_swa_memory`` for Gemma-2/3, and neither they nor
    Mistral are in ``is_hybrid_swa_model`` (``configs/model_config.py`` lines 2651-2696): SGLang keeps every token
    on every layer, so ``--accounting sglang`` must not apply the hybrid split (it planned 65,536 tokens for
    gemma-3-12b-it here).  The ratio changes nothing, as in SGLang."""
    result = plan(preset, Serving(accounting="sglang"), memory=20 * GiB)
    assert result.cell.sglang_bytes_per_token == per_token
    assert result.max_total_num_tokens == 20 * GiB // per_token == tokens
    assert {pool.name for pool in result.pools if pool.kind == "kv"} == {"kv"}
    assert any("without hybrid SWA pools" in note for note in result.cell.notes)
    other = plan(preset, Serving(accounting="sglang", swa_full_tokens_ratio=0.25), memory=20 * GiB)
    assert other.max_total_num_tokens == tokens
    exact = plan(preset, Serving(), memory=20 * GiB)
    assert "kv_swa" in {pool.name for pool in exact.pools}  # kvpools' own hybrid pools under exact


def test_gemma_4_stays_hybrid_under_sglang_accounting() -> None:
    """``Gemma4ForConditionalGeneration`` is in ``is_hybrid_swa_model`` (line 2668): hybrid pools."""
    result = plan("gemma-4-26b-a4b", Serving(accounting="sglang"), memory=20 * GiB)
    assert "kv_swa" in {pool.name for pool in result.pools}


def test_olmo2_with_a_window_is_dense_in_sglang_even_when_the_config_opts_in(tmp_path: Path) -> None:
    """``olmo2.py`` line 23 declares ``disable_hybrid_swa_memory`` for every ``Olmo2ForCausalLM``, so even a config
    stating ``is_hybrid_swa: true`` (``configs/model_config.py`` lines 2693-2696) gets one dense pool; the same
    config as ``MistralForCausalLM`` opts in.  llama-3.1-8b's geometry, all layers sliding: 32 x 8 x 256 x 2 =
    131,072 B per token dense, 20 GiB // 131,072 = 163,840 tokens."""
    config = {
        **resolve_model_source("llama-3.1-8b", get_registry())[0],
        "sliding_window": 4096,
        "is_hybrid_swa": True,
    }
    olmo = tmp_path / "olmo2.json"
    olmo.write_text(json.dumps({**config, "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2"}))
    mistral = tmp_path / "mistral.json"
    mistral.write_text(json.dumps({**config, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}))
    dense = plan(str(olmo), Serving(accounting="sglang"), memory=20 * GiB)
    assert dense.max_total_num_tokens == 20 * GiB // 131_072 == 163_840
    assert any("olmo2.py" in note for note in dense.cell.notes)
    hybrid = plan(str(mistral), Serving(accounting="sglang"), memory=20 * GiB)
    assert "kv_swa" in {pool.name for pool in hybrid.pools}
