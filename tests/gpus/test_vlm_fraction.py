"""SGLang's default ``mem_fraction_static`` of a multimodal model (``adjust_mem_fraction_for_vlm``, issue 34).

SGLang 0.5.23 (``arg_groups/memory_hook.py`` L330-337, L417-462) multiplies a multimodal model's default fraction
by ``0.95 x clamp(1 - 0.1 x (L x H^2 / (24 x 1024^2) - 1), 0.8, 1.05)``, ``L`` and ``H`` the vision tower's
``num_hidden_layers`` and ``hidden_size`` (defaults 24 and 1024).  kvpools reads them from the checkpoint's
``vision_config`` (``ModelSpec.vision_tower``) and refuses by name a multimodal model whose config has none.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpools_core import ConfigError, Serving
from kvpools_core.cli import main
from kvpools_core.models import load_model
from kvpools_core.pipeline.gpus import sglang_memory_defaults, vlm_fraction_factor
from kvpools_core.registry import get_registry
from tests.oracle import locate

CONFIGS = Path(__file__).parents[1] / "weights" / "configs"


def test_gemma3_siglip_factor_by_hand() -> None:
    """Gemma-3's SigLIP tower: 27 layers x 1152^2 = 35,831,808 against 24 x 1024^2 = 25,165,824, complexity
    1.423828125; 1 - 0.1 x 0.423828125 = 0.9576171875; x 0.95 = 0.909736328125."""
    factor, why = vlm_fraction_factor(27, 1152)
    assert factor == pytest.approx(0.909736328125, abs=1e-12)
    assert "27 x 1152^2" in why


@pytest.mark.parametrize(
    ("layers", "hidden", "factor"),
    [(24, 1024, 0.95), (1, 64, 0.95 * 1.05), (48, 4096, 0.95 * 0.8)],  # ViT-L/14 itself; the clamp's two ends
)
def test_factor_clamps(layers: int, hidden: int, factor: float) -> None:
    assert vlm_fraction_factor(layers, hidden)[0] == pytest.approx(factor, abs=1e-12)


def test_gemma3_preset_reads_its_tower_from_the_complete_config() -> None:
    """The preset holds the KV fields; ``full/gemma-3-12b-it.json`` (its ``_weights_config``) holds SigLIP's."""
    spec = load_model("gemma-3-12b-it", get_registry())[0]
    assert spec.is_multimodal and spec.vision_tower == (27, 1152)


def test_the_default_fraction_of_gemma3_on_an_h100() -> None:
    """81559 MiB, chunk 8192, max_bs 256, no prefill graph (multimodal): reserved 512 + 12288 + 128 + 512 = 13440
    MiB; round((81559 - 13440) / 81559, 3) = 0.835; x 0.909736328125 = 0.759629833984375."""
    spec = load_model("gemma-3-12b-it", get_registry())[0]
    defaults = sglang_memory_defaults(81559, spec, Serving(chunked_prefill_size=8192))
    assert defaults.reserved_mb == 13440
    assert defaults.mem_fraction_static == pytest.approx(0.835 * 0.909736328125, abs=1e-12)
    assert "adjust_mem_fraction_for_vlm" in defaults.terms[-1]


def test_a_pd_decode_node_takes_no_vlm_factor() -> None:
    """``is_vlm`` is false on a decode node (``memory_hook.py`` L283-288)."""
    spec = load_model("gemma-3-12b-it", get_registry())[0]
    decode = sglang_memory_defaults(81559, spec, Serving(chunked_prefill_size=8192, disaggregation_mode="decode"))
    assert not any("adjust_mem_fraction_for_vlm" in term for term in decode.terms)


def test_a_multimodal_model_without_a_vision_config_is_refused_by_name() -> None:
    spec = load_model("llama-3.1-8b", get_registry())[0]
    with pytest.raises(ConfigError, match="no vision_config"):
        sglang_memory_defaults(81559, attrs.evolve(spec, is_multimodal=True), Serving())


def test_plan_from_the_gemma3_preset_on_a_gpu() -> None:
    """``kvpools plan gemma-3-12b-it --gpu h100`` was refused ("adjust_mem_fraction_for_vlm, which kvpools does not
    model"); it plans with SGLang's fraction now."""
    result = CliRunner().invoke(main, ["plan", "gemma-3-12b-it", "--gpu", "h100", "--json"])
    assert result.exit_code == 0, result.output
    budget = json.loads(result.output)["plan"]["budget"]
    assert budget["mem_fraction_static"] == pytest.approx(0.835 * 0.909736328125, abs=1e-12)


@functools.cache
def _sglangs_adjust() -> Any:
    """SGLang 0.5.23's own ``adjust_mem_fraction_for_vlm``, compiled from the installed ``memory_hook.py`` (pure
    Python over ``getattr``; the module itself imports SGLang's server stack, which the --no-deps peers venv lacks)."""
    paths = list(locate.PEERS_VENV.glob("lib/python*/site-packages/sglang/srt/arg_groups/memory_hook.py"))
    if not paths:
        locate.skip_or_fail(f"SGLang 0.5.23 is not installed in {locate.PEERS_VENV} (KVPOOLS_PEERS_VENV)")
    tree = ast.parse(paths[0].read_text())
    (function,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "adjust_mem_fraction_for_vlm"]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[function], type_ignores=[]), str(paths[0]), "exec"), namespace)
    return namespace["adjust_mem_fraction_for_vlm"]


@settings(deadline=None)  # the first example compiles SGLang's function
@given(
    layers=st.integers(1, 80),
    hidden=st.integers(16, 8192),
    fraction=st.floats(0.3, 0.95),
)
def test_the_factor_is_sglangs(layers: int, hidden: int, fraction: float) -> None:
    adjust = _sglangs_adjust()
    config = SimpleNamespace(
        hf_config=SimpleNamespace(vision_config=SimpleNamespace(num_hidden_layers=layers, hidden_size=hidden))
    )
    ours = fraction * vlm_fraction_factor(layers, hidden)[0]
    assert ours == pytest.approx(adjust(fraction, config, False, 81559), rel=1e-12)
