"""``--speculative-draft-model-path`` under ``--accounting sglang`` against SGLang's sizing code (issue 16).

SGLang reads only the draft model's layer count for its token count
(``eagle_draft_num_layers`` / ``dflash_draft_num_layers``: ``int(cell * (1 + D / L))``
or ``ceil(cell * (L + D) / L)``), whatever the draft's geometry; kvpools sizes the
draft's pools from the draft's own plugin, so the two must still agree on the
tokens, requests and cell size while the pools carry the draft's own bytes.
"""

from __future__ import annotations

import pytest

from kvpools_core.values import Serving
from tests.draft_shape import as_sglang_runs

from .adapter import compare, preset_model
from .locate import require_oracle
from .strategies import GiB

pytestmark = pytest.mark.oracle

require_oracle()


@pytest.mark.parametrize("algorithm", ("EAGLE", "EAGLE3", "STANDALONE", "DFLASH"))
@pytest.mark.parametrize(("tp", "page", "memory"), [(4, 1, 40 * GiB), (8, 16, 12 * GiB), (2, 64, 3 * GiB)])
def test_an_own_draft_model_agrees_with_sglang(
    draft_config: str, algorithm: str, tp: int, page: int, memory: int
) -> None:
    spec = {
        "speculative_algorithm": algorithm,
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }
    serving = Serving(
        tp_size=tp,
        page_size=page,
        speculative_draft_num_layers=16,  # what SGLang reads of the draft: its layers
        **as_sglang_runs(spec),  # DFLASH: steps 1 (issue 32)
    )
    want, got = compare(
        "llama-3.1-70b", preset_model("llama-3.1-70b"), serving, memory=memory, draft_model=draft_config
    )
    assert not isinstance(got, Exception) and want.max_total_num_tokens
    assert got.serving.speculative_draft is not None and got.cell.draft is not None
    # the pools are the draft's own: 16 layers x (8 // tp) heads x 64 x (K, V) x 2 B per token
    assert got.pool("draft_kv").bytes_per_slot == 16 * (8 // tp) * 64 * 2 * 2
    assert got.cell.draft.tokens(memory, page)[0] == got.max_total_num_tokens


def test_an_mla_target_with_an_mha_draft_agrees_with_sglang(draft_config: str) -> None:
    """SGLang scales deepseek-v2-lite's MLA cell by 16 / 27 whatever the (MHA) draft stores."""
    from kvpools_core.models import resolve_model_source
    from kvpools_core.registry import get_registry
    from tests.mla.oracle_support import oracle_model

    model = oracle_model(resolve_model_source("deepseek-v2-lite", get_registry())[0])
    for page, memory in ((1, 3 * GiB + 12345), (64, 40 * GiB)):
        serving = Serving(page_size=page, speculative_algorithm="EAGLE", speculative_draft_num_layers=16)
        want, got = compare("deepseek-v2-lite", model, serving, memory=memory, draft_model=draft_config)
        assert not isinstance(got, Exception) and want.max_total_num_tokens
        assert got.provenance["draft_estimate_cell_size"] == ("mha",)
        assert got.pool("draft_kv").bytes_per_slot == 16 * 8 * 64 * 2 * 2  # the draft's own, not 16 MLA rows
