"""DeepSeek-V4.1 checkpoints that name their own class, ``DeepseekV41ForCausalLM`` (issue 33).

SGLang 0.5.23 (``configs/deepseek_v41.py`` ``normalize_deepseek_v41_config``, run by ``DeepseekV41Config``, the
config class of ``model_type`` ``deepseek_v41``) folds a nested ``text_config`` into the top level, drops its
``model_type``, sets ``model_type`` ``deepseek_v41`` and rewrites ``architectures == ["DeepseekV41ForCausalLM"]`` to
``["DeepseekV4ForCausalLM"]``, which ``is_deepseek_v4`` recognises; SGLang has no model class of the V4.1 name, so
any other config naming it fails to load.  vLLM 0.33 serves the name as its ``DeepseekV41ForCausalLM`` (registry
L387-390).  kvpools claimed neither: "no architecture plugin recognises" the config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import Serving, plan
from kvpools_core.engines.vllm import plan_vllm
from kvpools_core.errors import UnsupportedCombinationError

CONFIGS = Path(__file__).with_name("configs")
REPLAY = Serving(accounting="sglang", enable_encoder_swa_bounded_replay=True)


def _write(tmp: Path, name: str, config: dict[str, Any]) -> str:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


def _synthetic(source: str = "dsv41_synthetic.json") -> dict[str, Any]:
    return json.loads((CONFIGS / source).read_text())  # type: ignore[no-any-return]


def test_a_v41_named_checkpoint_plans_as_sglang_serves_it(tmp_path: Path) -> None:
    config = {**_synthetic(), "architectures": ["DeepseekV41ForCausalLM"]}
    named = plan(_write(tmp_path, "named", config), REPLAY, memory="20GiB")
    reference = plan(str(CONFIGS / "dsv41_synthetic.json"), REPLAY, memory="20GiB")
    assert named.model.hf_architectures == ("DeepseekV4ForCausalLM",)
    assert named.model.model_type == "deepseek_v41"
    assert named.sizing.sglang_config == reference.sizing.sglang_config
    assert named.max_total_num_tokens == 17_855_232  # test_dsv41_encoder_replay.py's hand count


def test_a_nested_text_config_is_a_v41_model(tmp_path: Path) -> None:
    """The text config's ``model_type`` (``deepseek_v41_text``) is dropped: the model is ``deepseek_v41``, so
    encoder replay (DeepSeek-V4.1 only) plans."""
    text = {k: v for k, v in _synthetic().items() if k not in ("architectures", "_note")}
    text["model_type"] = "deepseek_v41_text"
    config = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "text_config": text}
    p = plan(_write(tmp_path, "nested", config), REPLAY, memory="20GiB")
    assert p.model.model_type == "deepseek_v41"
    assert p.max_total_num_tokens == 17_855_232


@pytest.mark.parametrize(
    "change",
    [{"model_type": "deepseek_v4"}, {"architectures": ["DeepseekV41ForCausalLM", "DeepseekV4ForCausalLMNextN"]}],
    ids=["v4-model-type", "two-architectures"],
)
def test_sglang_cannot_load_the_v41_name_otherwise(tmp_path: Path, change: dict[str, Any]) -> None:
    config = {**_synthetic(), "architectures": ["DeepseekV41ForCausalLM"], **change}
    with pytest.raises(UnsupportedCombinationError, match="only for a model_type 'deepseek_v41' config"):
        plan(_write(tmp_path, "other", config), Serving(accounting="sglang", swa_full_tokens_ratio=0.1), memory="20GiB")


def test_vllm_serves_the_v41_name(tmp_path: Path) -> None:
    config = {**_synthetic("dsv41_vllm_synthetic.json"), "architectures": ["DeepseekV41ForCausalLM"]}
    named = plan_vllm(_write(tmp_path, "named", config), Serving(), memory="20GiB")
    reference = plan_vllm(str(CONFIGS / "dsv41_vllm_synthetic.json"), Serving(), memory="20GiB")
    assert named.plan == reference.plan and named.block_size == reference.block_size
