"""``--dtype`` and ``--quantization fp8`` (issue 34, parts 2 and 3): the weights' bytes and ``kv_cache_dtype auto``.

SGLang 0.5.23 resolves ``--dtype`` in ``_get_and_verify_dtype`` (sglang/srt/configs/model_config.py L2284-2344):
``auto`` is the config's dtype, a float32 config going to float16, a Gemma one (``model_type`` ``gemma*``) to
bfloat16; an explicit dtype wins (upcasting to float32 included). vLLM 0.33's ``_get_and_verify_dtype``
(vllm/config/model.py L2467-2520) takes an explicit dtype the same way. ``--quantization fp8`` on an unquantised
checkpoint quantises at load (sglang/srt/layers/quantization/fp8.py ``Fp8LinearMethod.process_weights_after_loading``
L1142-1175: per-channel ``per_token_group_quant_fp8`` on CUDA; ``Fp8MoEMethod.process_weights_after_loading``
L2619-2640: one float32 scale per expert for ``w13`` and for ``w2``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpools_core import Serving, UnsupportedCombinationError, estimate_weights, plan
from kvpools_core.config import ConfigReader, model_dtype
from tests.weights.test_safetensors import CONFIG, checkpoint, llama_tensors

CONFIGS = Path(__file__).parent / "configs"
LLAMA_8B = str(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json")

# Llama-3.1-8B: 8 030 261 248 parameters (tests/weights/test_weights.py), 16 060 522 496 B in bf16.
LLAMA_8B_PARAMETERS = 8_030_261_248


def test_dtype_float32_doubles_the_weights_and_the_kv_cache() -> None:
    """The llm-d-planner run ``llmd-v0.19-llama-3.1-8b-float32`` (benchmarks/data/startup_logs.json) logs 29.98 GiB
    of weights under ``--dtype float32``: 4 B a parameter, 32 121 044 992 B = 29.92 GiB here."""
    assert estimate_weights(LLAMA_8B).bytes_per_rank == 2 * LLAMA_8B_PARAMETERS
    assert estimate_weights(LLAMA_8B, Serving(dtype="float32")).bytes_per_rank == 4 * LLAMA_8B_PARAMETERS
    assert estimate_weights(LLAMA_8B, Serving(dtype="float16")).bytes_per_rank == 2 * LLAMA_8B_PARAMETERS
    # kv_cache_dtype auto follows --dtype: 32 layers x 8 KV heads x 128 x (K and V) x 4 B = 262 144 B a token.
    bf16 = plan("llama-3.1-8b", memory="20GiB")
    fp32 = plan("llama-3.1-8b", Serving(dtype="float32"), memory="20GiB")
    assert bf16.cell.bytes_per_token == 131_072
    assert fp32.cell.bytes_per_token == 262_144
    assert fp32.model.dtype == "float32"
    # An explicit KV dtype does not follow it.
    assert plan("llama-3.1-8b", Serving(dtype="float32", kv_cache_dtype="bf16"), memory="20GiB").cell == bf16.cell


@pytest.mark.parametrize(
    ("config", "served"),
    [
        ({"model_type": "llama", "torch_dtype": "float32"}, "float16"),
        ({"model_type": "gemma", "torch_dtype": "float32"}, "bfloat16"),
        ({"model_type": "gemma2", "torch_dtype": "float32"}, "bfloat16"),
        ({"model_type": "gemma3_text", "dtype": "float32"}, "bfloat16"),
        ({"model_type": "qwen2", "torch_dtype": "float16"}, "float16"),
    ],
)
def test_auto_resolves_a_float32_checkpoint_as_sglang_does(config: dict[str, str], served: str) -> None:
    """The core serves float32 as float16 unless told otherwise; the mha and swa plugins (which parse Gemma) say
    bfloat16 for Gemma, as SGLang's ``_get_and_verify_dtype`` does (the core names no model type)."""
    from kvpools_plugins.mha import float32_served_as as mha_rule
    from kvpools_plugins.swa.config import float32_served_as as swa_rule

    reader = ConfigReader(config, "config")
    assert mha_rule(config["model_type"]) == swa_rule(config["model_type"])
    assert model_dtype(reader, float32_served_as=mha_rule(config["model_type"])) == served
    if config.get("torch_dtype", config.get("dtype")) == "float32":
        assert model_dtype(reader) == "float16"


def test_dtype_spellings() -> None:
    assert Serving(dtype="half").dtype == "float16"
    assert Serving(dtype="float").dtype == "float32"
    assert Serving(dtype="torch.bfloat16").dtype == "bfloat16"
    with pytest.raises(Exception, match="dtype"):
        Serving(dtype="int8")


def test_runtime_fp8_on_llama_3_1_8b() -> None:
    """Per layer the Linears hold 218 103 808 parameters in 43 008 output rows (q 4096, k 1024, v 1024, o 4096,
    gate 14 336, up 14 336, down 4096); 32 layers: 6 979 321 856 fp8 bytes and 1 376 256 float32 row scales
    (5 505 024 B). The embedding and head (2 x 128 256 x 4096) and the norms (65 x 4096) stay bf16:
    2 101 878 784 B. In all 9 086 705 664 B = 8.46 GiB; the llm-d-planner run ``llmd-v0.19-llama-3.1-8b-runtime-fp8``
    logs 8.49 GiB under vLLM (whose per-tensor scales are 5.5 MB fewer)."""
    fp8 = estimate_weights(LLAMA_8B, Serving(quantization="fp8"))
    assert fp8.bytes_per_rank == 6_979_321_856 + 5_505_024 + 2_101_878_784
    assert fp8.parameters == LLAMA_8B_PARAMETERS
    assert any("--quantization fp8" in note for note in fp8.notes)
    # TP 2: the fp8 values halve (3 489 660 928 B); the column-parallel q/k/v/gate/up keep half their rows
    # (17 408), the row-parallel o/down all of theirs (8192): 25 600 scales a layer, 3 276 800 B in all; the
    # vocabulary 128 256 splits in 64 128 rows (embedding and head, 1 050 673 152 B); the norms are whole (532 480 B).
    tp2 = estimate_weights(LLAMA_8B, Serving(quantization="fp8", tp_size=2))
    assert tp2.bytes_per_rank == 3_489_660_928 + 3_276_800 + 1_050_673_152 + 532_480


def test_runtime_fp8_experts_keep_one_scale_per_expert_for_w13_and_for_w2() -> None:
    """Qwen3-30B-A3B: 48 layers of 128 experts (3 x 768 x 2048 each); the experts' fp8 bytes are their parameters,
    plus 2 float32 scales an expert a layer: 48 x 128 x 2 x 4 = 49 152 B."""
    config = str(CONFIGS / "Qwen--Qwen3-30B-A3B.json")
    plain = estimate_weights(config)
    fp8 = estimate_weights(config, Serving(quantization="fp8"))
    experts = 48 * 128 * 3 * 768 * 2048
    assert plain.parameters_by_family["moe_experts"] == experts
    attention = 48 * (2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048)  # q, k, v, o of 32 x 128 / 4 x 128 heads
    attention_rows = 48 * (4096 + 512 + 512 + 2048)
    # bf16 -> fp8 halves the experts and the attention Linears; the scales add on.
    assert plain.bytes_per_rank - fp8.bytes_per_rank == experts + attention - 49_152 - 4 * attention_rows


def test_quantization_matches_an_fp8_checkpoint_and_refuses_another_method() -> None:
    v3 = str(CONFIGS / "deepseek-ai--DeepSeek-V3.json")
    assert estimate_weights(v3, Serving(quantization="fp8")).bytes_per_rank == estimate_weights(v3).bytes_per_rank
    with pytest.raises(UnsupportedCombinationError, match=r"quantization fp8 on a checkpoint quantised with 'mxfp4'"):
        estimate_weights(str(CONFIGS / "openai--gpt-oss-20b.json"), Serving(quantization="fp8"))


def test_a_checkpoint_directory_follows_dtype_and_runtime_fp8(tmp_path: Path) -> None:
    """The tiny Llama of test_safetensors (106 816 parameters): float32 is 427 264 B. Under fp8 each layer's
    Linears take 36 864 B and 512 rows x 4 B of scales (38 912 B; 77 824 B for two), the embedding, head and norms
    stay bf16 (33 088 parameters, 66 176 B): 144 000 B, from the headers as from the config."""
    directory = checkpoint(tmp_path / "tiny", llama_tensors())
    assert estimate_weights(directory, Serving(dtype="float32")).bytes_per_rank == 427_264
    exact = estimate_weights(directory, Serving(quantization="fp8"))
    assert (exact.method, exact.bytes_per_rank) == ("safetensors", 144_000)
    assert estimate_weights(directory / "config.json", Serving(quantization="fp8")).bytes_per_rank == 144_000
    assert CONFIG["torch_dtype"] == "bfloat16"
