"""``--enable-hisparse`` is refused where SGLang 0.5.23 refuses it (``engine_features`` hook; issue 32).

Pins issue 32's defect: kvpools accepted ``--enable-hisparse`` silently on every model, with the radix cache on,
and planned as without it.  SGLang 0.5.23's ``validate_hisparse`` (``arg_groups/hisparse_hook.py``, run as the
``_hisparse_validation`` post-process of ``arg_groups/overrides.py``) asserts, in this order:

* ``is_deepseek_dsa(hf_config) or is_deepseek_v4(hf_config) or is_minimax_sparse(hf_config)``: "--enable-hisparse
  is only supported for DSA (DeepSeek Sparse Attention) models (e.g., DeepSeek V3.2, GLM-5), DeepSeek V4, and
  MiniMax M3 now." (the ``dsa``, ``dsv4`` and ``minimax_sparse`` plugins say so through ``engine_features``);
* ``cfg.disable_radix_cache``: "Hierarchical sparse attention currently requires --disable-radix-cache."  An
  assert: SGLang does not turn the cache off itself (a PD decode node has it off already).
"""

from __future__ import annotations

import subprocess
import types
from typing import Any

import pytest

from kvpools_core import Registry, Serving, hookimpl, plan
from kvpools_core.errors import PluginResultError, UnsupportedCombinationError

GiB = 1 << 30
HISPARSE = Serving(enable_hisparse=True, disable_radix_cache=True)


def test_a_model_sglang_runs_no_hisparse_on_is_refused() -> None:
    """llama-3.1-8b (architecture mha): SGLang asserts the model class; kvpools planned it as without."""
    with pytest.raises(UnsupportedCombinationError) as caught:
        plan("llama-3.1-8b", HISPARSE, memory=8 * GiB)
    message = str(caught.value)
    assert "refuses enable_hisparse for llama-3.1-8b (architecture 'mha')" in message
    assert "dsa, dsv4, minimax_sparse" in message and "hisparse_hook.py" in message and "[core]" in message
    assert plan("llama-3.1-8b", Serving(disable_radix_cache=True), memory=8 * GiB).max_total_num_tokens


def test_the_cli_refuses_hisparse_on_llama(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """The command of the issue: ``kvpools plan llama-3.1-8b --memory 8GiB --enable-hisparse`` planned silently."""
    args = (kvpools_exe, "plan", "llama-3.1-8b", "--memory", "8GiB", "--enable-hisparse")
    out = subprocess.run(args, env=cli_env, capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "SGLang refuses --enable-hisparse for llama-3.1-8b" in out.stderr
    assert "Drop --enable-hisparse." in out.stderr


@pytest.mark.parametrize("model", ["deepseek-v3.2", "deepseek-v4-flash", "minimax-m3"])
def test_hisparse_with_the_radix_cache_on_is_refused(model: str) -> None:
    """SGLang asserts ``--disable-radix-cache`` with HiSparse on the models it supports (never sets it itself)."""
    with pytest.raises(UnsupportedCombinationError, match=r"radix cache on .*Add disable_radix_cache") as caught:
        plan(model, Serving(enable_hisparse=True, accounting="sglang"), memory=80 * GiB)
    assert "Hierarchical sparse attention currently requires --disable-radix-cache" in str(caught.value)


@pytest.mark.parametrize(("model", "tp"), [("deepseek-v3.2", 1), ("minimax-m3", 4)])
def test_hisparse_on_a_pd_decode_node_is_refused_as_not_modelled(model: str, tp: int) -> None:
    """SGLang's checks pass on a decode node (it resolves the radix cache off there before validating); kvpools
    plans HiSparse only colocated (``tests/dsa/test_dsa_hisparse.py``,
    ``tests/minimax_sparse/test_minimax_hisparse.py``) and refuses the decode node by name, never planning it as if
    HiSparse were off."""
    serving = Serving(tp_size=tp, enable_hisparse=True, disaggregation_mode="decode")
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model enable_hisparse with") as caught:
        plan(model, serving, memory=80 * GiB)
    assert "radix" not in str(caught.value)  # SGLang's own checks passed


@pytest.mark.parametrize(("model", "tp"), [("deepseek-v3.2", 1), ("minimax-m3", 4)])
def test_hisparse_where_sglang_accepts_it_is_planned(model: str, tp: int) -> None:
    """With the radix cache off SGLang starts; kvpools plans its HiSparse pools (a logical token space)."""
    got = plan(model, Serving(tp_size=tp, enable_hisparse=True, disable_radix_cache=True), memory=80 * GiB)
    assert got.sizing.token_counts["hisparse_logical"] == 2 * got.max_total_num_tokens


def _registry(*impls: Any) -> Registry:
    module = types.ModuleType("fake_features")
    for impl in impls:
        setattr(module, impl.__name__, impl)
    return Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"features": module})


def test_a_plugin_claims_hisparse_for_its_own_architecture() -> None:
    """The core names no architecture: a plugin's ``engine_features`` answer is what lets HiSparse through."""

    @hookimpl
    def engine_features() -> dict[str, list[str]]:
        return {"mha": ["hisparse"]}

    assert plan("llama-3.1-8b", HISPARSE, memory=8 * GiB, registry=_registry(engine_features)).max_total_num_tokens


def test_an_answer_of_the_wrong_type_names_the_plugin() -> None:
    @hookimpl
    def engine_features() -> dict[str, str]:
        return {"mha": "hisparse"}

    with pytest.raises(PluginResultError, match=r'"features".*engine_features.*one string'):
        plan("llama-3.1-8b", HISPARSE, memory=8 * GiB, registry=_registry(engine_features))
