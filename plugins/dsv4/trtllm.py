"""DeepSeek-V4's attention backend option: what ``--dsv4-attn-backend`` forces and refuses (issue 33).

SGLang 0.5.23's ``--dsv4-attn-backend`` (``Serving.dsv4_attn_backend``; ``arg_groups/fields/exec_.py``) is
``auto`` / ``flashmla`` / ``flashmla_mega`` / ``trtllm``.  ``auto`` resolves to ``flashmla_mega`` only where the
layout already resolves to V4.1 (``_default_dsv4_attention_backend``: a ``deepseek_v41`` checkpoint on SM100 with
``SGLANG_DSV4_KV_LAYOUT`` auto / v41 / v41_new), so it changes no pool; ``flashmla`` changes none either.

* ``flashmla_mega``: ``select_dsv4_kv_layout`` plans every mode but ``v41_new`` as ``v41``
  (:func:`.layouts.layout_mode`); ``apply_deepseek_v4_defaults`` asserts a ``deepseek_v41`` checkpoint on an
  SM100 / SM103 CUDA GPU.
* ``trtllm``: ``select_dsv4_kv_layout`` returns V4 (asserting mode auto / v4 and option auto / fp8) and
  ``DeepSeekV4TokenToKVPool`` (``uniform_fp8``) builds the SWA, c4, c128 and ratio-1/2 pools as
  ``DeepSeekV4UniformFP8KVPool``: ``qk_nope_head_dim + qk_rope_head_dim`` e4m3 bytes a token (asserted 512), a page
  exactly ``page_size`` rows (:data:`.layouts.UNIFORM_FP8`).  The configurator charges the same 512 B a row
  (``pool_configurator.py``: ``kv_bytes = attn_head_dim``, and ``_get_paged_kv_bytes_per_token`` adds no page pad).
  ``apply_deepseek_v4_defaults`` asserts an SM100 / SM103 CUDA GPU, ``kv_cache_dtype`` auto / fp8_e4m3, no HiSparse,
  no context parallelism, no PD disaggregation and chunked prefill; each is refused here in SGLang's words.

With ``--enable-hierarchical-cache`` the uniform pools are mirrored like any other (:mod:`.host`): the host page of
each is the device pool's ``bytes_per_page_padded`` = ``page_size x 512`` B, with no padding.  DSPARK runs on it
too (``deepseek_v4_trtllm_backend.py`` attends the DSpark draft noncausally): off encoder replay
(``uses_draft_swa_ring`` is False) the draft worker's pool takes the same ``else`` branch of
``DeepSeekV4TokenToKVPool.__init__`` as the target, so its SWA rows are ``DeepSeekV4UniformFP8KVPool`` as well.
"""

from __future__ import annotations

from kvpools_core.options import option
from kvpools_core.values import ModelSpec, Serving

from .layouts import SM100_MAJOR, gpu_capability, uniform_fp8

__all__ = ["UNIFORM_FP8_ROW", "backend_notes", "backend_problems"]

UNIFORM_FP8_ROW = 512
"""``DeepSeekV4UniformFP8KVPool.create_buffer`` asserts ``qk_nope_head_dim + qk_rope_head_dim == 512``."""
SGLANG_TRTLLM_LAYOUT_MESSAGE = "trtllm uses uniform FP8 pools, not the packed V4.1 KV layouts"
SGLANG_TRTLLM_GPU_MESSAGE = "--dsv4-attn-backend trtllm requires an SM100/SM103 (Blackwell) GPU."
SGLANG_MEGA_MESSAGE = "--dsv4-attn-backend flashmla_mega requires DeepSeek-V4.1 on SM100/SM103."
V41_MODEL_TYPE = "deepseek_v41"


def _off_sm100(serving: Serving) -> bool:
    """Whether the plan's GPU is known not to be a CUDA SM100 / SM103 one (``cfg.device == "cuda" and
    is_sm100_supported()``)."""
    capability = gpu_capability(serving)
    return serving.platform != "cuda" or (capability is not None and capability[0] != SM100_MAJOR)


def _where(serving: Serving) -> str:
    capability = gpu_capability(serving)
    if serving.platform != "cuda":
        return f"the {serving.platform} platform"
    if capability is None:
        return "a GPU kvpools does not know"
    return f"a GPU of compute capability {capability[0]}.{capability[1]}"


def backend_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang asserts away for ``--dsv4-attn-backend``, in its words."""
    backend = serving.dsv4_attn_backend
    if backend in ("auto", "flashmla"):
        return []
    o = option
    flag = f"{o('dsv4_attn_backend')} {backend}"
    if backend == "flashmla_mega":
        problems = []
        if model.model_type != V41_MODEL_TYPE:
            problems.append(
                f"{flag}: SGLang asserts '{SGLANG_MEGA_MESSAGE}' and {model.name} is model_type "
                f"{model.model_type or 'unknown'!r}, not {V41_MODEL_TYPE!r}. Use {o('dsv4_attn_backend')} auto."
            )
        if _off_sm100(serving):
            problems.append(
                f"{flag} on {_where(serving)}: SGLang asserts '{SGLANG_MEGA_MESSAGE}' Use {o('dsv4_attn_backend')} "
                f"auto, or {o('gpu')} b200."
            )
        return problems
    return _trtllm_problems(model, serving, flag)


def _trtllm_problems(model: ModelSpec, serving: Serving, flag: str) -> list[str]:
    o = option
    refused: list[tuple[bool, str, str]] = [
        (
            _off_sm100(serving),
            SGLANG_TRTLLM_GPU_MESSAGE,
            f"The plan is on {_where(serving)}: use {o('dsv4_attn_backend')} auto, or plan a Blackwell GPU "
            f"({o('gpu')} b200)",
        ),
        (
            serving.kv_cache_dtype not in ("auto", "fp8_e4m3"),
            f"--dsv4-attn-backend trtllm requires kv_cache_dtype=fp8_e4m3, got {serving.kv_cache_dtype}.",
            f"Use {o('kv_cache_dtype')} fp8_e4m3 (or auto)",
        ),
        (
            serving.enable_hisparse,
            "--dsv4-attn-backend trtllm does not support enable_hisparse.",
            f"Drop {o('enable_hisparse')}",
        ),
        (
            serving.attn_cp_size > 1 or serving.dcp_size > 1,
            "--dsv4-attn-backend trtllm does not support context parallelism (prefill CP, attention CP, or decode CP).",
            f"Drop {o('attn_cp_size')} / {o('dcp_size')}",
        ),
        (
            serving.disaggregation_mode != "null",
            "--dsv4-attn-backend trtllm does not support PD disaggregation yet (untested; see "
            "https://github.com/sgl-project/sglang/issues/37838).",
            f"Drop {o('disaggregation_mode')}",
        ),
        (
            not serving.chunked_prefill_size or serving.chunked_prefill_size <= 0,
            "--dsv4-attn-backend trtllm requires chunked prefill (--chunked-prefill-size > 0).",
            f"Set {o('chunked_prefill_size')}",
        ),
        (
            serving.dsv4_kv_layout not in ("auto", "v4") or serving.dsv4_compressed_kv_layout not in ("auto", "fp8"),
            SGLANG_TRTLLM_LAYOUT_MESSAGE,
            f"Use {o('dsv4_kv_layout')} auto / v4 with {o('dsv4_compressed_kv_layout')} auto / fp8",
        ),
    ]
    problems = [f"{flag}: SGLang asserts '{message}' {fix}." for hit, message, fix in refused if hit]
    first = model.layers[0].params if model.layers else {}
    latent = int(first.get("qk_nope_head_dim", 0)) + int(first.get("qk_rope_head_dim", 0))
    if latent != UNIFORM_FP8_ROW:
        problems.append(
            f"{flag}: DeepSeekV4UniformFP8KVPool stores a {UNIFORM_FP8_ROW}-byte row and {model.name} has "
            f"qk_nope_head_dim + qk_rope_head_dim = {latent} (SGLang asserts 'DSV4 uniform-FP8 KV layout: "
            f"qk_nope_head_dim (448) + qk_rope_head_dim (64), all e4m3 = 512 bytes/token'). Drop {flag}."
        )
    return problems


def backend_notes(serving: Serving) -> list[str]:
    """What the plan says about the backend: the uniform fp8 rows, and the GPU the plan could not check."""
    if not uniform_fp8(serving):
        return []
    o = option
    notes = [
        f"{o('dsv4_attn_backend')} trtllm: SGLang forces the V4 layout and stores the SWA / compressed pools as "
        f"DeepSeekV4UniformFP8KVPool rows of {UNIFORM_FP8_ROW} B (448 nope + 64 rope e4m3, no scales, no page "
        f"padding); its configurator charges the same {UNIFORM_FP8_ROW} B a row."
    ]
    if gpu_capability(serving) is None:
        notes.append(
            f"{o('dsv4_attn_backend')} trtllm needs an SM100 / SM103 GPU (SGLang asserts it); kvpools does not know "
            f"the GPU (pass {o('gpu')} b200 to check)."
        )
    return notes
