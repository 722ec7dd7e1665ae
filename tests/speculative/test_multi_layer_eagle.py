"""``--enable-multi-layer-eagle`` (issue 33): SGLang 0.5.23 runs ``MultiLayerEagleWorkerV2`` only for an EAGLE-family
algorithm (``speculative/spec_info.py``: ``if self.is_eagle() and cfg.enable_multi_layer_eagle``), one draft runner
per step.  kvpools plans it for Inkling-class MTP heads (``tests/mamba/test_inkling.py``) and refuses it elsewhere."""

from __future__ import annotations

import pytest

from kvpools_core import Serving, plan
from kvpools_core.errors import KvpoolsError

EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
}


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gpt-oss-20b", "deepseek-v4-flash"])
def test_the_flag_is_refused_where_kvpools_does_not_model_it(model: str) -> None:
    """Also where the architecture sizes its draft itself (SWA, DeepSeek-V4: ``CellSize.draft_included``): never
    planned as one draft."""
    with pytest.raises(KvpoolsError, match=rf"does not model enable_multi_layer_eagle for {model}"):
        plan(model, Serving(enable_multi_layer_eagle=True, **EAGLE), memory="60GiB")


@pytest.mark.parametrize("algorithm", [None, "STANDALONE", "NGRAM"])
def test_the_flag_changes_nothing_without_an_eagle_algorithm(algorithm: str | None) -> None:
    spec = {**EAGLE, "speculative_algorithm": algorithm} if algorithm else {}
    with pytest.raises(KvpoolsError, match=r"enable_multi_layer_eagle changes nothing with speculative_algorithm"):
        plan("llama-3.1-8b", Serving(enable_multi_layer_eagle=True, **spec), memory="20GiB")


def test_without_the_flag_the_plan_is_unchanged() -> None:
    assert plan("llama-3.1-8b", Serving(**EAGLE), memory="20GiB").planned_bytes > 0


def test_adaptive_speculation_falls_back_to_the_static_parameters() -> None:
    """``adaptive_unsupported_reason`` (speculative/adaptive_spec_params.py): "enable_multi_layer_eagle=True is not
    supported (MultiLayerEagleWorkerV2 does not implement adaptive)": SGLang keeps the static parameters."""
    spec = {**EAGLE, "speculative_adaptive": True}
    assert Serving(**spec).adaptive_speculation
    serving = Serving(enable_multi_layer_eagle=True, **spec)
    assert not serving.adaptive_speculation
    assert serving.max_speculative_num_draft_tokens == 4
