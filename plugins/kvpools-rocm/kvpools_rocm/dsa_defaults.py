"""SGLang 0.5.23's DeepSeek sparse attention defaults on HIP, for the options the user leaves unset.

SGLang resolves two things per platform for a DSA model (``is_deepseek_dsa``) before it sizes anything:

* **the DSA backends** (``_dsa_split_backend_resolution``, ``arg_groups/overrides.py``): on HIP both
  ``--dsa-prefill-backend`` and ``--dsa-decode-backend`` default to ``triton`` (``tilelang`` with
  ``--enable-hisparse``: ``_hisparse_default_backend`` in ``arg_groups/hisparse_hook.py``).  ROCm's DSA
  backends read the raw latent row (``calculate_mla_kv_cache_dim``; :data:`kvpools_rocm.TRAITS`'
  ``raw_mla_row_backends``), so with ``--kv-cache-dtype fp8_e4m3`` the latent row is the raw fp8 one, not
  FlashMLA's packed one the CUDA defaults take.  Under ``--dcp-size`` > 1 the model override
  ``_dsa_dcp_overrides`` (``arg_groups/model_overrides/deepseek_v2.py``) sets both to ``trtllm`` first, so this
  plugin leaves them to the ``dsa`` plugin's answer then.
* **the page** (``_deepseek_family_overrides``, same file): ``64 x index_kpool`` (the ``dsa`` plugin's answer)
  only when AITER's preshuffled paged MQA can run (``aiter_can_use_preshuffle_paged_mqa`` in
  ``layers/attention/dsa/utils.py``: ``SGLANG_USE_AITER=1``, not ``SGLANG_DSA_HIP_DISABLE_PRESHUFFLE``, and
  Triton >= 3.5 or ``AITER_ENABLE_AOT_GLUON_PA_MQA_LOGITS=1``), else 1 ("Setting page size to 1 for DeepSeek DSA
  on ROCm").  kvpools reads no environment: ``rocm.dsa_preshuffle`` (:data:`DSA_PRESHUFFLE_OPTION`) says which;
  unset it is ``off``, as SGLang decides with ``SGLANG_USE_AITER`` unset (``get_bool_env_var`` defaults false).

An explicit option wins (the pipeline's ``engine_defaults`` step), and each default becomes a note of the plan.
"""

from __future__ import annotations

from kvpools_core import hookimpl
from kvpools_core.options import option
from kvpools_core.values import EngineDefault, ModelSpec, Serving

PLATFORM = "rocm"

__all__ = ["DSA_PRESHUFFLE_OPTION", "dsa_engine_defaults", "dsa_preshuffle", "validate_dsa_preshuffle"]

DSA_ARCHITECTURE = "dsa"
"""The architecture name kvpools' ``dsa`` plugin gives the DeepSeek sparse attention models."""
DSA_PRESHUFFLE_OPTION = "rocm.dsa_preshuffle"
PRESHUFFLE_VALUES = ("on", "off")
HIP_DSA_BACKEND = "triton"
HIP_HISPARSE_DSA_BACKEND = "tilelang"
LEGACY_PAGE = 1


def dsa_preshuffle(serving: Serving) -> bool:
    """Whether SGLang's ``aiter_can_use_preshuffle_paged_mqa()`` holds (``rocm.dsa_preshuffle``, default off)."""
    return str(serving.plugin_options.get(DSA_PRESHUFFLE_OPTION, "off")) == "on"


@hookimpl(tryfirst=True, specname="engine_defaults")
def dsa_engine_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault] | None:
    """HIP's DSA backends (``triton``; ``tilelang`` with HiSparse) and, without AITER's preshuffled paged MQA,
    page 1; answered before the ``dsa`` plugin's CUDA / ROCm page ``64 x index_kpool``."""
    if serving.platform != PLATFORM or model.architecture != DSA_ARCHITECTURE:
        return None
    answers = []
    if serving.dcp_size == 1:
        backend = HIP_HISPARSE_DSA_BACKEND if serving.enable_hisparse else HIP_DSA_BACKEND
        why = (
            "_hisparse_default_backend in arg_groups/hisparse_hook.py"
            if serving.enable_hisparse
            else "_dsa_split_backend_resolution in arg_groups/overrides.py"
        )
        reason = f"SGLang 0.5.23's DSA backend on ROCm (HIP) ({why})"
        answers += [
            EngineDefault(option="dsa_prefill_backend", value=backend, reason=reason),
            EngineDefault(option="dsa_decode_backend", value=backend, reason=reason),
        ]
    if not dsa_preshuffle(serving):
        answers.append(
            EngineDefault(
                option="page_size",
                value=LEGACY_PAGE,
                reason=(
                    "SGLang 0.5.23's page for DeepSeek DSA on ROCm without AITER's preshuffled paged MQA "
                    "(_deepseek_family_overrides in arg_groups/model_overrides/deepseek_v2.py; "
                    f"{DSA_PRESHUFFLE_OPTION}=on when SGLANG_USE_AITER=1 and Triton >= 3.5 give 64 x index_kpool)"
                ),
            )
        )
    return answers


@hookimpl(specname="validate")
def validate_dsa_preshuffle(model: ModelSpec, serving: Serving) -> list[str] | None:
    """An unknown ``rocm.dsa_preshuffle`` value."""
    if serving.platform != PLATFORM or DSA_PRESHUFFLE_OPTION not in serving.plugin_options:
        return None
    value = serving.plugin_options[DSA_PRESHUFFLE_OPTION]
    if str(value) in PRESHUFFLE_VALUES:
        return None
    return [
        f"{option('plugin_options')} {DSA_PRESHUFFLE_OPTION}={value}: choose on or off (whether SGLang's "
        "aiter_can_use_preshuffle_paged_mqa() holds: SGLANG_USE_AITER=1 and Triton >= 3.5)."
    ]
