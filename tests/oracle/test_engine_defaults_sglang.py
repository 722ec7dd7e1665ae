"""Differential: the ``engine_defaults`` kvpools applies equal what SGLang 0.5.23's own override code declares.

``sglang_overrides_peer.py`` runs the installed ``_deepseek_family_overrides`` (``model_overrides/deepseek_v2.py``),
``_deepseek_v4_overrides`` (``model_overrides/deepseek_v4.py``) and ``_minimax_m3_overrides``
(``model_overrides/minimax_m3.py``, on a Hopper and a Blackwell platform) in the peers venv on the bundled presets
and variants of them (DSA under decode context parallelism too); kvpools answers through the real registry
(``apply_engine_defaults``).  On an NPU SGLang first declares the platform's page 128 when unset
(``set_default_server_args``, ``hardware_backend/npu/utils.py``), then the model override, the last writer
winning; the peer runs the model overrides, the NPU default is that constant.

Only the options left unset are compared: SGLang 0.5.23 declares DeepSeek's pages unconditionally, so it replaces
even an explicit ``--page-size`` (last writer wins), where kvpools keeps the user's value (and refuses what
SGLang's pools cannot build).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpools_core.models import parse_config
from kvpools_core.pipeline.engine_defaults import apply_engine_defaults
from kvpools_core.registry import get_registry
from kvpools_core.values import Serving
from tests.oracle import locate

PYTHON, BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_overrides_peer.py")
NPU_PAGE_SIZE = 128
"""``set_default_server_args``: ``page_size=128`` when unset on an NPU."""
PLATFORMS = {"cuda": "cuda", "npu": "ascend"}


def _preset(name: str) -> dict[str, Any]:
    path = get_registry().call_named("presets", "Preset")[name][1]
    return dict(json.loads(Path(path).read_text()))


Case = tuple[str, dict[str, Any], str, dict[str, Any], dict[str, Any], str | None]
"""(label, config, SGLang device, explicit server args, other Serving options, CUDA generation)."""


def _cases() -> list[Case]:
    """Each DSA, DeepSeek-V4 and MiniMax-M3 preset and variant."""
    cases: list[Case] = []
    for device in PLATFORMS:
        for name in ("deepseek-v3.2", "deepseek-v3.2-exp", "deepseek-v4-flash", "deepseek-v4-pro"):
            cases.append((name, _preset(name), device, {}, {}, None))
        cases.append(("deepseek-v4-flash-fp8-sgl", _preset("deepseek-v4-flash-fp8-sgl"), device, {}, {}, None))
    v32, v4, m3 = _preset("deepseek-v3.2"), _preset("deepseek-v4-flash"), _preset("minimax-m3")
    cases += [
        ("index_kpool 2", {**v32, "index_kpool": 2}, "cuda", {}, {}, None),
        ("index_kpool 4", {**v32, "index_kpool": 4}, "cuda", {}, {}, None),
        ("DeepSeek-V4.1", {**v4, "model_type": "deepseek_v41"}, "cuda", {}, {}, None),
        ("explicit ratio", v4, "cuda", {"swa_full_tokens_ratio": 0.5}, {}, None),
        ("explicit page", v4, "cuda", {"page_size": 128}, {}, None),
        ("explicit page (DSA)", v32, "cuda", {"page_size": 1}, {}, None),
        ("DSA DCP 8", v32, "cuda", {"dcp_size": 8}, {"tp_size": 8}, None),
        ("DSA DCP 2, fp8", v32, "cuda", {"dcp_size": 2, "kv_cache_dtype": "fp8_e4m3"}, {"tp_size": 4}, None),
        (
            "DSA DCP 8, explicit backend",
            v32,
            "cuda",
            {"dcp_size": 8, "dsa_decode_backend": "flashmla_kv"},
            {"tp_size": 8},
            None,
        ),
        ("MiniMax-M3 Hopper", m3, "cuda", {}, {}, "sm90"),
        ("MiniMax-M3 Blackwell", m3, "cuda", {}, {}, "sm100"),
        ("MiniMax-M3 Blackwell fp8", m3, "cuda", {"kv_cache_dtype": "fp8_e4m3"}, {}, "sm100"),
        ("MiniMax-M3 explicit page", m3, "cuda", {"page_size": 64}, {}, "sm90"),
        ("MiniMax-M3 NPU", m3, "npu", {}, {}, None),
    ]
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def sglang_declared() -> list[dict[str, Any]]:
    """What SGLang's providers declare for every case (one peer process)."""
    payload = [
        {
            "architecture": config["architectures"][0],
            "hf_config": config,
            "device": device,
            "server_args": explicit,
            "gpu": gpu,
        }
        for _, config, device, explicit, _, gpu in CASES
    ]
    out = subprocess.run(
        [str(PYTHON), str(PEER), str(BENCH)], input=json.dumps(payload), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    declared: list[dict[str, Any]] = json.loads(out.stdout)
    return declared


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_kvpools_defaults_are_sglangs(index: int, sglang_declared: list[dict[str, Any]]) -> None:
    label, config, device, explicit, other, _ = CASES[index]
    serving = Serving(platform=PLATFORMS[device], **explicit, **other)
    unset = set(serving.unset_options)
    expected = {"page_size": NPU_PAGE_SIZE} if device == "npu" else {}
    expected.update(sglang_declared[index])
    if config["architectures"][0] == "DeepseekV4ForCausalLM":
        # arg_groups/model_hook.py then runs apply_deepseek_v4_defaults (test_dsv4_request_default_is_sglangs)
        expected["max_running_requests"] = _installed_dsv4_request_default()
    expected = {name: value for name, value in expected.items() if name in unset}

    registry = get_registry()
    spec, _ = parse_config(config, f"{label}.json", registry)
    resolved, notes = apply_engine_defaults(spec, serving, registry)
    ours = {name: getattr(resolved, name) for name in unset if name not in resolved.unset_options}
    assert ours == expected, f"{label} on {device}: kvpools {ours}, SGLang {expected}"
    assert len(notes) == len(expected)
    for name, value in explicit.items():
        assert getattr(resolved, name) == value  # the user's value is kept


def _installed_dsv4_request_default() -> int:
    """The ``max_running_requests`` the installed ``apply_deepseek_v4_defaults`` declares when it is unset, read
    from ``arg_groups/deepseek_v4_hook.py`` (its ``declare_resolution(..., max_running_requests=N)`` call)."""
    import ast

    (path,) = locate.PEERS_VENV.glob("lib/python*/site-packages/sglang/srt/arg_groups/deepseek_v4_hook.py")
    tree = ast.parse(path.read_text())
    (function,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_deepseek_v4_defaults"]
    values = [
        keyword.value.value
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "declare_resolution"
        for keyword in node.keywords
        if keyword.arg == "max_running_requests" and isinstance(keyword.value, ast.Constant)
    ]
    assert len(values) == 1, values
    return int(values[0])


def test_dsv4_request_default_is_sglangs() -> None:
    """SGLang 0.5.23 declares ``max_running_requests`` 256 for DeepSeek-V4 when unset (``apply_deepseek_v4_defaults``,
    called by ``arg_groups/model_hook.py`` for ``DeepseekV4ForCausalLM``); kvpools' dsv4 plugin applies the same."""
    from kvpools_plugins.dsv4 import DSV4_MAX_RUNNING_REQUESTS

    assert _installed_dsv4_request_default() == DSV4_MAX_RUNNING_REQUESTS == 256
    hook = next(locate.PEERS_VENV.glob("lib/python*/site-packages/sglang/srt/arg_groups/model_hook.py")).read_text()
    assert "apply_deepseek_v4_defaults(server_args, model_arch)" in hook
