"""The speculative decoding SGLang 0.5.23 runs on DeepSeek-V4 (issue 32).

``apply_deepseek_v4_defaults`` (``arg_groups/deepseek_v4_hook.py`` lines 137-159), which
``handle_model_specific_adjustments`` runs for ``DeepseekV4ForCausalLM`` before the speculative hook resolves
anything:

* ``--max-running-requests`` unset becomes 256 (so the speculative hooks' own default of 48, which they declare
  only while the option is still unset, never applies to DeepSeek-V4: the ``dsv4`` plugin's ``engine_defaults``
  answers 256 before the ``speculative`` plugin's ``trylast`` 48);
* the algorithm must be ``EAGLE`` or ``DSPARK`` (asserted on the spelling as given, before ``NEXTN`` is aliased
  to ``EAGLE``: ``NEXTN``, ``EAGLE3``, ``STANDALONE``, ``NGRAM`` and ``DFLASH`` are refused);
* ``EAGLE`` needs ``--speculative-eagle-topk`` 1, asserted before ``_auto_choose_speculative_params`` fills an
  unset top-k in, so an unset one is refused too.
"""

from __future__ import annotations

from kvpools_core.options import option
from kvpools_core.values import Serving

SGLANG_ARCHITECTURE = "DeepseekV4ForCausalLM"
DSV4_SPECULATIVE_ALGORITHMS = ("EAGLE", "DSPARK")
"""The algorithms ``apply_deepseek_v4_defaults`` lets through (deepseek_v4_hook.py lines 148-154)."""
ALGORITHMS_MESSAGE = f"Only EAGLE and DSPARK speculative algorithms are supported for {SGLANG_ARCHITECTURE}"
TOPK_MESSAGE = f"Only EAGLE speculative algorithm with topk == 1 is supported for {SGLANG_ARCHITECTURE}"


def speculative_problems(serving: Serving) -> list[str]:
    """What ``apply_deepseek_v4_defaults`` asserts about speculative decoding, with SGLang's own messages."""
    algorithm = serving.speculative_algorithm
    o = option
    if algorithm is None:
        return []
    if algorithm not in DSV4_SPECULATIVE_ALGORITHMS:
        return [
            f"{o('speculative_algorithm')} {algorithm}: SGLang 0.5.23 asserts '{ALGORITHMS_MESSAGE}' "
            "(apply_deepseek_v4_defaults, arg_groups/deepseek_v4_hook.py). Use EAGLE with "
            f"{o('speculative_eagle_topk')} 1 and {o('speculative_draft_num_layers')} N (the checkpoint's MTP "
            "layers), or DSPARK."
        ]
    if algorithm == "EAGLE" and serving.speculative_eagle_topk != 1:
        seen = "unset" if serving.speculative_eagle_topk is None else str(serving.speculative_eagle_topk)
        return [
            f"{o('speculative_eagle_topk')} {seen} with {o('speculative_algorithm')} EAGLE: SGLang 0.5.23 asserts "
            f"'{TOPK_MESSAGE}' (apply_deepseek_v4_defaults, before it would choose a top-k itself). Pass "
            f"{o('speculative_eagle_topk')} 1."
        ]
    return []
