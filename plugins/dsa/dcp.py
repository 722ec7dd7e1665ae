"""What SGLang 0.5.23 refuses beside decode context parallelism on DeepSeek sparse attention.

``_dsa_dcp_overrides`` (``arg_groups/model_overrides/deepseek_v2.py`` lines 18-25) raises, for a DSA model with
``--dcp-size`` above 1, on HiSparse or HiCache, on PD disaggregation, and on an EAGLE top-k other than 1; kvpools
planned those combinations as if SGLang started them.  ``_deepseek_family_overrides`` (lines 161-170 of the same
file) also raises for a config pooling index keys (``index_kpool`` above 1) under DCP on a GPU:
:func:`kpool_dcp_problems`.
"""

from __future__ import annotations

from kvpools_core.options import option
from kvpools_core.values import ModelSpec, Serving

SOURCE = "_dsa_dcp_overrides in SGLang 0.5.23's arg_groups/model_overrides/deepseek_v2.py"


def dcp_problems(serving: Serving) -> list[str]:
    """SGLang's refusals of DSA under ``dcp_size`` > 1, each naming the option and the fix."""
    if serving.dcp_size <= 1:
        return []
    o = option
    dcp = f"{o('dcp_size')} {serving.dcp_size}"
    problems = []
    for name, on in (
        ("enable_hisparse", serving.enable_hisparse),
        ("enable_hierarchical_cache", serving.enable_hierarchical_cache),
    ):
        if on:
            problems.append(
                f"SGLang refuses DeepSeek sparse attention with {dcp} and {o(name)} ('DSA DCP does not support "
                f"HiSparse or HiCache.', {SOURCE}). Drop {o(name)} or {o('dcp_size')}."
            )
    if serving.disaggregation_mode != "null":
        problems.append(
            f"SGLang refuses DeepSeek sparse attention with {dcp} on a PD {serving.disaggregation_mode} node ('DSA "
            f"DCP does not support PD disaggregation.', {SOURCE}). Drop {o('disaggregation_mode')} or "
            f"{o('dcp_size')}."
        )
    if serving.speculative_eagle_topk not in (None, 1):
        problems.append(
            f"SGLang refuses DeepSeek sparse attention with {dcp} and {o('speculative_eagle_topk')} "
            f"{serving.speculative_eagle_topk} ('DSA DCP requires --speculative-eagle-topk 1.', {SOURCE}). Use "
            f"{o('speculative_eagle_topk')} 1 or drop {o('dcp_size')}."
        )
    return problems


def kpool_dcp_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """``index_kpool`` above 1 with ``dcp_size`` above 1: SGLang raises on CUDA and ROCm ("a pooled index key spans
    positions owned by different DCP ranks"); kvpools plans no DCP index buffer of pooled keys on any platform."""
    kpool = int(model.params.get("index_kpool", 1))
    if serving.dcp_size <= 1 or kpool <= 1:
        return []
    o = option
    return [
        f"SGLang refuses {o('dcp_size')} {serving.dcp_size} for {model.name}, whose config pools index keys "
        f"(index_kpool {kpool}): '--dcp-size > 1 is not supported for DSA with index_kpool={kpool}: a pooled index "
        f"key spans positions owned by different DCP ranks.' (_deepseek_family_overrides in SGLang 0.5.23's "
        f"arg_groups/model_overrides/deepseek_v2.py). Drop {o('dcp_size')}."
    ]
