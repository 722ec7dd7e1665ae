"""The public functions the CLI and the service share (:mod:`kvpools_core.planning.engine_version`), called as a
library: ``apply_engine_version`` applies ``--engine-version`` to an options mapping and returns the vLLM profile
version; ``plan_vllm`` drops that profile under a ``--memory`` budget (the exact path plans the budget unchanged)."""

from __future__ import annotations

import pytest

from kvpools_core import ConfigError, Serving
from kvpools_core.engines.vllm.runtime_memory import PROFILE_ALIASES, PROFILE_VERSIONS
from kvpools_core.planning.engine_version import RUNTIME_PROFILES, apply_engine_version, plan_vllm


def test_runtime_profiles_are_the_profile_files_and_their_aliases() -> None:
    assert set(RUNTIME_PROFILES) == {*PROFILE_VERSIONS, *PROFILE_ALIASES}
    assert list(RUNTIME_PROFILES) == sorted(RUNTIME_PROFILES)


def test_apply_engine_version_sets_the_accounting_and_vllms_profile() -> None:
    options: dict[str, object] = {"engine_version": " VLLM==0.33 ", "runtime_profile": None}
    assert apply_engine_version(options) == "0.33"
    assert options == {"accounting": "vllm", "runtime_profile": "0.33"}
    sglang: dict[str, object] = {"engine_version": "sglang==0.5.23", "accounting": "sglang"}
    assert apply_engine_version(sglang) is None
    assert sglang == {"accounting": "sglang"}
    untouched: dict[str, object] = {"accounting": "exact"}
    assert apply_engine_version(untouched) is None and untouched == {"accounting": "exact"}


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"engine_version": "vllm"}, "must look like ENGINE==X.Y"),
        ({"engine_version": "vllm==0.33", "accounting": "sglang"}, "plans for vllm but --accounting is sglang"),
        ({"engine_version": "vllm==0.33", "runtime_profile": "0.19"}, "but --runtime-profile is 0.19"),
        ({"engine_version": "trtllm==1.2"}, "kvpools does not model trtllm's per-version runtime memory yet"),
    ],
)
def test_apply_engine_version_refuses_what_names_something_else(options: dict[str, object], refusal: str) -> None:
    with pytest.raises(ConfigError, match=refusal):
        apply_engine_version(dict(options))


def test_plan_vllm_keeps_a_given_kv_budget_whatever_the_engine_versions_profile() -> None:
    """``--engine-version vllm==0.33 --memory 20GiB`` plans the 20 GiB as ``--accounting vllm --memory 8GiB`` does:
    the profile estimates what a GPU's total leaves, which a given budget skips."""
    serving = Serving(accounting="vllm")
    plain = plan_vllm("llama-3.1-8b", serving, "20GiB", None, None, None, {})
    versioned = plan_vllm(
        "llama-3.1-8b",
        serving,
        "20GiB",
        None,
        None,
        None,
        {"runtime_profile": "0.33", "engine_version_profile": "0.33"},
    )
    assert versioned.to_dict() == plain.to_dict()
    assert versioned.runtime_memory is None and versioned.kv_cache_memory_bytes == 20 << 30
