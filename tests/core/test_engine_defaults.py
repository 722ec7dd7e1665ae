"""The engine's own defaults for unset options (``engine_defaults`` hook, :mod:`kvpools_core.pipeline.engine_defaults`).

Pins issue 29's defect: DeepSeek-V3.2 (DSA) and DeepSeek-V4 presets failed with default flags because kvpools
planned the generic page 1 (and ratio 0.8) where SGLang 0.5.23 sets the model's own when the user leaves the
option unset.  The values are SGLang 0.5.23's, read from its source:

* DSA: ``arg_groups/model_overrides/deepseek_v2.py`` ``_deepseek_family_overrides``, the ``is_deepseek_dsa``
  branch on CUDA/ROCm: ``page_size = 64 * index_kpool`` (``configs/model_config.py`` ``get_dsa_index_kpool``:
  ``getattr(config, "index_kpool", 1)``);
* DeepSeek-V4: ``arg_groups/model_overrides/deepseek_v4.py`` ``_deepseek_v4_overrides``: ``page_size`` 256 (128
  when ``device == "npu"``) and, unless ``model_type == "deepseek_v41"``, ``swa_full_tokens_ratio`` 0.1 when it is
  ``None``;
* Ascend: ``srt/hardware_backend/npu/utils.py`` ``set_default_server_args``: ``page_size`` 128 when ``None``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest

from kvpools_core import Registry, Serving, hookimpl, plan
from kvpools_core.errors import PluginResultError
from kvpools_core.models import load_model
from kvpools_core.pipeline.engine_defaults import apply_engine_defaults
from kvpools_core.registry import get_registry
from kvpools_core.values import EngineDefault, ModelSpec, is_unset

GiB = 1 << 30


def _stripped(data: Any) -> Any:
    """A plan's JSON without what says how it was decided (notes, provenance)."""
    if isinstance(data, dict):
        return {k: _stripped(v) for k, v in data.items() if k not in ("notes", "provenance")}
    if isinstance(data, list):
        return [_stripped(v) for v in data]
    return data


def _notes(result: Any) -> list[str]:
    return list(result.sizing.notes)


# -- unset is not given ------------------------------------------------------------------------


def test_unset_options_read_as_the_generic_defaults_and_say_so() -> None:
    unset = Serving()
    given = Serving(
        page_size=1,
        swa_full_tokens_ratio=0.8,
        dsa_prefill_backend="flashmla_sparse",
        dsa_decode_backend="flashmla_kv",
        mamba_full_memory_ratio=0.9,
        max_running_requests=4096,
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    )
    assert (unset.page_size, unset.swa_full_tokens_ratio) == (1, 0.8)
    assert (unset.dsa_prefill_backend, unset.dsa_decode_backend) == ("flashmla_sparse", "flashmla_kv")
    assert unset.mamba_full_memory_ratio == 0.9
    assert unset.unset_options == (
        "page_size",
        "swa_full_tokens_ratio",
        "dsa_prefill_backend",
        "dsa_decode_backend",
        "mamba_full_memory_ratio",
        "max_running_requests",
        "speculative_num_steps",  # SGLang's speculative handlers choose them (issue 32)
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
    )
    assert given.unset_options == ()
    assert attrs.evolve(unset, tp_size=2).unset_options == unset.unset_options
    assert not is_unset(attrs.evolve(unset, page_size=64).page_size)


# -- DeepSeek sparse attention: page 64 x index_kpool --------------------------------------------


def test_dsa_plans_with_sglangs_page_64_when_unset() -> None:
    """The defect: ``plan("deepseek-v3.2")`` with default options was refused (page 1 on CUDA)."""
    unset = plan("deepseek-v3.2", Serving(), memory=40 * GiB)
    given = plan("deepseek-v3.2", Serving(page_size=64), memory=40 * GiB)
    assert unset.serving.page_size == 64 and not is_unset(unset.serving.page_size)
    assert unset.provenance["engine_defaults"] == ("dsa",)
    assert "engine_defaults" not in given.provenance
    note = (  # the API names options as Serving's fields (the command line as flags: test_presets_plan_...)
        "page_size 64: SGLang 0.5.23's default for DeepSeek sparse attention (64 x index_kpool 1, "
        "_deepseek_family_overrides in arg_groups/model_overrides/deepseek_v2.py); page_size overrides it"
    )
    assert note in _notes(unset) and note not in _notes(given)
    assert _stripped(unset.to_dict()) == _stripped(given.to_dict())


def test_dsa_page_follows_index_kpool(tmp_path: Path) -> None:
    """``64 x index_kpool``: a config pooling 2 index keys takes page 128 (which CUDA's DSA rule then refuses,
    as kvpools does not model pooled index keys: docs/sizing.md)."""
    registry = get_registry()
    preset = registry.call_named("presets", "Preset")["deepseek-v3.2"][1]
    config = json.loads(Path(preset).read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "index_kpool": 2}))
    spec, _ = load_model(str(tmp_path / "config.json"), registry)
    assert spec.params["index_kpool"] == 2
    # on ROCm only with AITER's preshuffled paged MQA (kvpools-rocm's rocm.dsa_preshuffle); else page 1 there
    rocm = Serving(platform="rocm", plugin_options={"rocm.dsa_preshuffle": "on"})
    serving, notes = apply_engine_defaults(spec, rocm, registry)
    assert serving.page_size == 128
    assert any("64 x index_kpool 2" in note for note in notes)
    serving, _ = apply_engine_defaults(spec, Serving(), registry)
    assert serving.page_size == 128


# -- DeepSeek-V4: page 256, SWA ratio 0.1 -----------------------------------------------------------


def test_dsv4_plans_with_sglangs_page_and_ratio_when_unset() -> None:
    """Unset, DeepSeek-V4 takes page 256 and ratio 0.1; the plan is the one given those explicitly.

    SGLang's bytes per full token at ratio 0.1 (kv row 584 B, indexer 132 B, c4 states 8192 + 2048 B, ring 8
    per SWA page of 128): 0.1 x 584 x 43 = 2511.2; 1/4 x 584 x 21 = 3066; 1/4 x 132 x 21 = 693;
    0.1 x 8/128 x 10240 x 21 = 1344; 1/128 x 584 x 20 = 91.25; sum 7705.45 B (34691.85 B at 0.8).
    """
    unset = plan("deepseek-v4-flash", Serving(tp_size=4), memory=60 * GiB)
    given = plan(
        "deepseek-v4-flash",
        Serving(tp_size=4, page_size=256, swa_full_tokens_ratio=0.1, max_running_requests=256),
        memory=60 * GiB,
    )
    assert (unset.serving.page_size, unset.serving.swa_full_tokens_ratio) == (256, 0.1)
    assert unset.cell.sglang_bytes_per_token == pytest.approx(7705.45)
    assert unset.provenance["engine_defaults"] == ("dsv4",)
    source = "_deepseek_v4_overrides in arg_groups/model_overrides/deepseek_v4.py"
    assert (
        f"page_size 256: SGLang 0.5.23's default for DeepSeek-V4's compressed attention ({source}); "
        "page_size overrides it"
    ) in _notes(unset)
    assert (
        f"swa_full_tokens_ratio 0.1: SGLang 0.5.23's default for DeepSeek-V4 ({source}); "
        "swa_full_tokens_ratio overrides it"
    ) in _notes(unset)
    assert not any("overrides it" in note for note in _notes(given))
    assert _stripped(unset.to_dict()) == _stripped(given.to_dict())
    config = unset.sizing.sglang_config
    assert config["swa_max_total_num_tokens"] == int(config["full_max_total_num_tokens"] * 0.1) // 256 * 256


def test_dsv4_takes_sglangs_256_requests_when_unset() -> None:
    """Issue 32: SGLang 0.5.23 sets ``max_running_requests`` 256 for DeepSeek-V4 when unset
    (``apply_deepseek_v4_defaults``, ``arg_groups/deepseek_v4_hook.py``, run by ``arg_groups/model_hook.py`` for
    ``DeepseekV4ForCausalLM``), so its configurator reserves the c128 state for 256 requests, not for its estimate
    (2,104 at TP 4, 60 GiB: ref-002 ``_get_c128_state_fixed_bytes_for_token_capacity``).  kvpools planned 4,310,784
    tokens and 2,104 requests; SGLang's accounting now gives 8,008,448 (the oracle's answer for 256 requests,
    tests/dsv4/test_dsv4_oracle.py::test_swa_ratio_with_requests), and an explicit value wins."""
    sglang = plan("deepseek-v4-flash", Serving(tp_size=4, accounting="sglang"), memory=60 * GiB)
    assert (sglang.max_total_num_tokens, sglang.max_running_requests) == (8008448, 256)
    assert any(note.startswith("max_running_requests 256: SGLang 0.5.23's default") for note in _notes(sglang))
    exact = plan("deepseek-v4-flash", Serving(tp_size=4), memory=60 * GiB)
    assert exact.max_running_requests == 256 and exact.serving.max_running_requests == 256
    given = plan("deepseek-v4-flash", Serving(tp_size=4, max_running_requests=1024), memory=60 * GiB)
    assert given.serving.max_running_requests == 1024
    assert not any(note.startswith("max_running_requests") for note in _notes(given))
    llama = plan("llama-3.1-8b", Serving(), memory=20 * GiB)
    assert llama.serving.max_running_requests is None


def test_an_explicit_option_wins_over_the_engine_default() -> None:
    """Each option on its own: the given one is kept (and not noted), the unset one still defaults."""
    ratio = plan("deepseek-v4-flash", Serving(tp_size=4, swa_full_tokens_ratio=0.8), memory=60 * GiB)
    assert (ratio.serving.page_size, ratio.serving.swa_full_tokens_ratio) == (256, 0.8)
    assert ratio.cell.sglang_bytes_per_token == pytest.approx(34691.85)  # tests/dsv4/test_dsv4_sizing.py
    assert not any(note.startswith("swa_full_tokens_ratio") for note in _notes(ratio))
    page = plan("deepseek-v4-flash", Serving(tp_size=4, page_size=128, accounting="sglang"), memory=60 * GiB)
    assert (page.serving.page_size, page.serving.swa_full_tokens_ratio) == (128, 0.1)
    assert page.max_total_num_tokens % 128 == 0
    assert not any(note.startswith("page_size") for note in _notes(page))


def test_deepseek_v41_keeps_the_generic_ratio() -> None:
    """SGLang skips the 0.1 ratio for ``model_type`` ``deepseek_v41`` checkpoints; the page is still 256."""
    spec, _ = load_model("deepseek-v4-flash", get_registry())
    v41 = attrs.evolve(spec, model_type="deepseek_v41")
    serving, notes = apply_engine_defaults(v41, Serving(), get_registry())
    assert (serving.page_size, serving.swa_full_tokens_ratio) == (256, 0.8)
    assert serving.unset_options == (
        "swa_full_tokens_ratio",
        "dsa_prefill_backend",
        "dsa_decode_backend",
        "mamba_full_memory_ratio",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
    )
    assert len(notes) == 2  # the page and the request limit (apply_deepseek_v4_defaults runs for V4.1 too)
    assert serving.max_running_requests == 256


# -- the platform answers first ----------------------------------------------------------------------


def test_ascend_pages_every_model_by_128_and_wins_over_the_architecture() -> None:
    llama = plan("llama-3.1-8b", Serving(platform="ascend"), memory=20 * GiB)
    assert llama.serving.page_size == 128 and llama.provenance["engine_defaults"] == ("ascend",)
    dsv4 = plan("deepseek-v4-flash", Serving(platform="ascend", tp_size=4, accounting="sglang"), memory=60 * GiB)
    assert (dsv4.serving.page_size, dsv4.serving.swa_full_tokens_ratio) == (128, 0.1)
    assert dsv4.provenance["engine_defaults"] == ("ascend", "dsv4")


def test_dsv4_exact_on_ascend_is_not_told_to_take_a_page_ascend_refuses() -> None:
    """Ascend's default page 128 once met the exact accounting's CUDA-pool refusal ("Use --page-size 256", which
    Ascend's every-model rule refuses in turn); issue 33: kvpools-ascend plans SGLang's NPU DeepSeek-V4 pools
    itself (``platform_planned_layouts``), at page 128, with no CUDA page assert (SGLang skips it on NPU)."""
    result = plan("deepseek-v4-flash", Serving(platform="ascend", tp_size=4), memory=60 * GiB)
    assert result.serving.page_size == 128 and result.provenance["size_pools"] == ("ascend",)
    assert not any("page_size must be 256" in note for note in _notes(result))


def test_models_without_an_engine_default_keep_the_generic_ones() -> None:
    result = plan("llama-3.1-8b", Serving(), memory=20 * GiB)
    assert result.serving.page_size == 1 and result.serving.unset_options == Serving().unset_options
    assert "engine_defaults" not in result.provenance
    assert not any("overrides it" in note for note in _notes(result))


# -- a plugin's wrong answer is blamed on it ---------------------------------------------------------


def _registry(*impls: Any) -> Registry:
    import types

    module = types.ModuleType("fake_defaults")
    for impl in impls:
        setattr(module, impl.__name__, impl)
    return Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"baddefaults": module})


def test_an_answer_serving_refuses_names_the_plugin() -> None:
    @hookimpl(tryfirst=True)
    def engine_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault]:
        return [EngineDefault(option="page_size", value=0, reason="nonsense")]

    with pytest.raises(PluginResultError, match=r'"baddefaults".*engine_defaults with page_size 0'):
        plan("llama-3.1-8b", Serving(), memory=20 * GiB, registry=_registry(engine_defaults))


def test_a_refused_answer_beside_good_ones_names_its_plugin() -> None:
    """The answers are applied in one validation of the serving; when it refuses them, each is tried alone to name
    the plugin whose answer ``Serving`` refuses (here the page size, beside a good SWA ratio)."""

    @hookimpl(tryfirst=True)
    def engine_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault]:
        return [
            EngineDefault(option="swa_full_tokens_ratio", value=0.5, reason="fine"),
            EngineDefault(option="page_size", value=0, reason="nonsense"),
        ]

    with pytest.raises(PluginResultError, match=r'"baddefaults".*engine_defaults with page_size 0'):
        plan("deepseek-v4-flash", Serving(), memory=20 * GiB, registry=_registry(engine_defaults))


def test_the_answers_are_applied_in_one_validation_of_the_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: each answer was first applied alone (one ``Serving`` validation per answer, to name a refused
    one's plugin) and then all together; DeepSeek-V4's three defaults cost four validations of a plan's serving,
    a third of its basis.  Now one, and the per-answer tries only run when that one refuses."""
    registry = get_registry()
    spec, _ = load_model("deepseek-v4-flash", registry)
    serving = Serving(accounting="exact")
    validations: list[Serving] = []
    original = Serving.__attrs_post_init__

    def counted(self: Serving) -> None:
        validations.append(self)
        original(self)

    monkeypatch.setattr(Serving, "__attrs_post_init__", counted)
    resolved, notes = apply_engine_defaults(spec, serving, registry)
    assert len(validations) == 1
    assert (resolved.page_size, resolved.swa_full_tokens_ratio, resolved.max_running_requests) == (256, 0.1, 256)
    assert len(notes) == 3


def test_an_answer_of_the_wrong_type_names_the_plugin() -> None:
    @hookimpl(tryfirst=True)
    def engine_defaults(model: ModelSpec, serving: Serving) -> Any:
        return {"page_size": 64}

    with pytest.raises(PluginResultError, match=r'"baddefaults".*engine_defaults.*not a list of EngineDefault'):
        plan("llama-3.1-8b", Serving(), memory=20 * GiB, registry=_registry(engine_defaults))


def test_only_engine_defaultable_options_can_be_answered() -> None:
    with pytest.raises(Exception, match="tp_size"):
        EngineDefault(option="tp_size", value=8, reason="no")


# -- the command line ---------------------------------------------------------------------------------


def _run(exe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, "plan", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(
    ("args", "explicit", "notes"),
    [
        (("deepseek-v3.2", "--memory", "40GiB"), ("--page-size", "64"), ["--page-size 64: SGLang 0.5.23's"]),
        (
            ("deepseek-v4-flash", "--memory", "60GiB", "--tp-size", "4"),
            ("--page-size", "256", "--swa-full-tokens-ratio", "0.1"),
            ["--page-size 256: SGLang 0.5.23's", "--swa-full-tokens-ratio 0.1: SGLang 0.5.23's"],
        ),
    ],
)
def test_presets_plan_with_default_flags(
    kvpools_exe: str, cli_env: dict[str, str], args: tuple[str, ...], explicit: tuple[str, ...], notes: list[str]
) -> None:
    """``kvpools plan deepseek-v3.2 --memory 40GiB`` and ``kvpools plan deepseek-v4-flash --memory 60GiB
    --tp-size 4`` succeed with default flags, note the defaults, and equal the plans given them explicitly."""
    text = _run(kvpools_exe, cli_env, *args)
    assert text.returncode == 0, text.stderr
    for note in notes:
        assert f"note: {note}" in text.stdout
    unset = _run(kvpools_exe, cli_env, *args, "--json")
    given = _run(kvpools_exe, cli_env, *args, *explicit, "--json")
    assert unset.returncode == given.returncode == 0, unset.stderr + given.stderr
    assert _stripped(json.loads(unset.stdout)) == _stripped(json.loads(given.stdout))
    refused = _run(kvpools_exe, cli_env, *args, "--page-size", "1")
    assert refused.returncode != 0 and "--page-size 1" in refused.stderr + refused.stdout
