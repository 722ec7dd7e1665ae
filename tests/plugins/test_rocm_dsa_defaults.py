"""kvpools-rocm's DeepSeek sparse attention defaults (issue 32): SGLang 0.5.23 picks other DSA backends and,
without AITER's preshuffled paged MQA, another page on ROCm when the user leaves them unset.

SGLang: ``_dsa_split_backend_resolution`` (``arg_groups/overrides.py``): on HIP both DSA backends ``triton``
(``tilelang`` with HiSparse, ``_hisparse_default_backend``); ``_deepseek_family_overrides``
(``arg_groups/model_overrides/deepseek_v2.py``): page 1 on HIP unless ``aiter_can_use_preshuffle_paged_mqa()``,
else ``64 x index_kpool``; ``_dsa_dcp_overrides``: ``trtllm`` under ``--dcp-size`` > 1, declared first.

The bytes, by hand: DeepSeek-V3.2 latent ``kv_lora_rank`` 512 + rope 64; with ``--kv-cache-dtype fp8_e4m3``
FlashMLA's packed row (CUDA's ``flashmla_kv``) is 512 + 4 x 4 (fp32 scales) + 64 x 2 = 656 B per layer, the raw
fp8 row ROCm's ``triton`` backend reads (``calculate_mla_kv_cache_dim``) 576 B; the index key 132 B.  61 layers:
(656 + 132) x 61 = 48,068 B per token on CUDA, (576 + 132) x 61 = 43,188 B on ROCm.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvpools_core import Serving, plan
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.values import Plan

pytestmark = pytest.mark.usefixtures("rocm_platform")
FP8: dict[str, Any] = {"kv_cache_dtype": "fp8_e4m3"}


def _notes(result: Plan) -> str:
    return " ".join(result.sizing.notes)


def test_unset_backends_take_triton_and_the_raw_row() -> None:
    rocm = plan("deepseek-v3.2", Serving(platform="rocm", **FP8), memory="40GiB")
    assert (rocm.serving.dsa_prefill_backend, rocm.serving.dsa_decode_backend) == ("triton", "triton")
    assert rocm.cell.bytes_per_token == (576 + 132) * 61
    cuda = plan("deepseek-v3.2", Serving(**FP8), memory="40GiB")
    assert cuda.cell.bytes_per_token == (656 + 132) * 61
    assert "dsa_decode_backend triton: SGLang 0.5.23's DSA backend on ROCm (HIP)" in _notes(rocm)
    assert "dsa_decode_backend overrides it" in _notes(rocm)


def test_without_preshuffle_the_page_is_1_and_with_it_64() -> None:
    legacy = plan("deepseek-v3.2", Serving(platform="rocm", **FP8), memory="40GiB")
    assert legacy.serving.page_size == 1
    assert "page_size 1: SGLang 0.5.23's page for DeepSeek DSA on ROCm" in _notes(legacy)
    pre = plan(
        "deepseek-v3.2", Serving(platform="rocm", plugin_options={"rocm.dsa_preshuffle": "on"}, **FP8), memory="40GiB"
    )
    assert pre.serving.page_size == 64  # the dsa plugin's 64 x index_kpool 1


def test_explicit_options_win() -> None:
    given = Serving(
        platform="rocm", page_size=64, dsa_prefill_backend="flashmla_sparse", dsa_decode_backend="flashmla_kv", **FP8
    )
    result = plan("deepseek-v3.2", given, memory="40GiB")
    assert (result.serving.page_size, result.serving.dsa_prefill_backend, result.serving.dsa_decode_backend) == (
        64,
        "flashmla_sparse",
        "flashmla_kv",
    )
    assert result.cell.bytes_per_token == (656 + 132) * 61
    assert "on ROCm" not in _notes(result)


def test_hisparse_takes_tilelang() -> None:
    serving = Serving(platform="rocm", enable_hisparse=True, disable_radix_cache=True, **FP8)
    result = plan("deepseek-v3.2", serving, memory="40GiB")
    assert (result.serving.dsa_prefill_backend, result.serving.dsa_decode_backend) == ("tilelang", "tilelang")
    assert "_hisparse_default_backend" in _notes(result)


def test_dcp_keeps_the_model_overrides_trtllm() -> None:
    serving = Serving(platform="rocm", tp_size=8, dcp_size=2, plugin_options={"rocm.dsa_preshuffle": "on"})
    result = plan("deepseek-v3.2", serving, memory="40GiB")
    assert (result.serving.dsa_prefill_backend, result.serving.dsa_decode_backend) == ("trtllm", "trtllm")


def test_other_models_and_platforms_are_left_alone() -> None:
    assert plan("deepseek-v3", Serving(platform="rocm"), memory="40GiB").serving.dsa_decode_backend == "flashmla_kv"
    cuda = plan("deepseek-v3.2", Serving(), memory="40GiB")
    assert (cuda.serving.page_size, cuda.serving.dsa_decode_backend) == (64, "flashmla_kv")


def test_unknown_preshuffle_value_is_refused() -> None:
    with pytest.raises(UnsupportedCombinationError, match=r"rocm.dsa_preshuffle=maybe: choose on or off"):
        plan("deepseek-v3.2", Serving(platform="rocm", plugin_options={"rocm.dsa_preshuffle": "maybe"}), memory="8GiB")


# -- against SGLang's own override and resolution code (peers venv) -----------------------------------------------

PEER_CASES: list[tuple[str, dict[str, Any], bool, dict[str, Any]]] = [
    # (label, server args given, preshuffle, kvpools Serving options)
    ("bf16", {}, False, {}),
    ("fp8", {"kv_cache_dtype": "fp8_e4m3"}, False, FP8),
    ("preshuffle", {}, True, {"plugin_options": {"rocm.dsa_preshuffle": "on"}}),
    ("hisparse", {"enable_hisparse": True}, False, {"enable_hisparse": True, "disable_radix_cache": True}),
    ("dcp 2", {"dcp_size": 2}, True, {"dcp_size": 2, "tp_size": 4, "plugin_options": {"rocm.dsa_preshuffle": "on"}}),
    ("explicit decode", {"dsa_decode_backend": "tilelang"}, False, {"dsa_decode_backend": "tilelang"}),
]


@pytest.mark.parametrize(("label", "given", "preshuffle", "options"), PEER_CASES, ids=[c[0] for c in PEER_CASES])
def test_defaults_are_sglangs_on_hip(
    label: str, given: dict[str, Any], preshuffle: bool, options: dict[str, Any]
) -> None:
    """SGLang's ``_deepseek_family_overrides`` then ``_dsa_split_backend_resolution`` on a HIP platform, run by
    ``tests/oracle/sglang_overrides_peer.py``: the page and both DSA backends kvpools-rocm applies are SGLang's."""
    import json
    import subprocess
    from pathlib import Path

    from kvpools_core.models import load_model
    from kvpools_core.pipeline.engine_defaults import apply_engine_defaults
    from kvpools_core.registry import get_registry
    from tests.oracle import locate

    python, bench = locate.require_sglang_peer()
    registry = get_registry()
    preset = registry.call_named("presets", "Preset")["deepseek-v3.2"][1]
    config = json.loads(Path(preset).read_text())
    case = {
        "architecture": config["architectures"][0],
        "hf_config": config,
        "device": "hip",
        "server_args": given,
        "preshuffle": preshuffle,
        "resolve_backends": True,
    }
    peer = Path(__file__).parents[1] / "oracle" / "sglang_overrides_peer.py"
    out = subprocess.run(
        [str(python), str(peer), str(bench)], input=json.dumps([case]), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    (declared,) = json.loads(out.stdout)
    spec, _ = load_model(str(preset), registry)
    serving, _ = apply_engine_defaults(spec, Serving(platform="rocm", **options), registry)
    for name in ("page_size", "dsa_prefill_backend", "dsa_decode_backend"):
        want = given.get(name, declared.get(name))
        assert want is not None, (label, name, declared)
        assert getattr(serving, name) == want, (label, name)
