"""``--accounting sglang`` for a GLM5-Next DSA hybrid against SGLang's sizing oracle (ref-002's configurator).

The reference cell (ref-002 lines 193-220) charges an MLA hybrid ``(kv_lora_rank + qk_rope_head_dim) x full
layers x kv bytes`` and, when ``is_deepseek_dsa(hf_config)``, ``132 x full layers`` B of indexer more.  The
shared oracle's stand-ins predate SGLang 0.5.23's wider ``is_deepseek_dsa`` (they list six DSA architectures,
``Glm5NextForConditionalGeneration`` not among them), so ``GlmMoeDsaForCausalLM`` stands in for it: the
configurator reads only ``is_deepseek_dsa`` and ``index_head_dim`` off the architecture.  The KDA layers are the
oracle's Kimi-Linear reading of the same layout (``tests/mamba/support.py``, 1-based ``kda_layers``).
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import pytest

from kvpools_core import Serving, plan
from tests.oracle.locate import require_oracle

from .support import hybrid_oracle, oracle_model
from .test_glm5_next_dsa import _spec, glm5_next

require_oracle()

from tests.oracle.adapter import OracleModel  # noqa: E402  (needs the oracle on sys.path)

GiB = 1 << 30


def _oracle_model(config: dict[str, Any], serving: Serving) -> Any:
    text = copy.deepcopy(config["text_config"])
    text["model_type"] = "kimi_linear"  # the oracle reads KDA layouts Kimi-Linear's way: 1-based
    text["linear_attn_config"]["kda_layers"] = [i + 1 for i in text["linear_attn_config"]["kda_layers"]]
    model = oracle_model({"architectures": ["KimiLinearForCausalLM"], "text_config": text}, serving)
    params = {
        **model.params,
        "architecture": "GlmMoeDsaForCausalLM",  # is_deepseek_dsa in the oracle's stand-ins (see above)
        "index_topk": text["index_topk"],
        "index_head_dim": text["index_head_dim"],
    }
    return OracleModel(params=params, num_nextn_predict_layers=model.num_nextn_predict_layers)


@pytest.mark.parametrize(
    "serving",
    [Serving(page_size=64), Serving(page_size=64, kv_cache_dtype="fp8_e4m3"), Serving(page_size=64, tp_size=2)],
    ids=["bf16", "fp8", "tp2"],
)
def test_sglang_accounting_is_the_reference_configurators(serving: Serving) -> None:
    """Tokens, requests, cell and state slots as the configurator's (bf16: 4 x (1,152 + 132) = 5,136 B)."""
    serving = attrs.evolve(serving, accounting="sglang")
    want = hybrid_oracle(_oracle_model(glm5_next(), serving), serving, memory=4 * GiB)
    got = plan(_spec(glm5_next()), serving, memory=4 * GiB)
    ours = (
        got.max_total_num_tokens,
        got.max_running_requests,
        got.cell.sglang_bytes_per_token,
        got.sizing.sglang_config["max_mamba_cache_size"],
    )
    assert ours == (want.max_total_num_tokens, want.max_running_requests, want.cell_size, want.max_mamba_cache_size)
