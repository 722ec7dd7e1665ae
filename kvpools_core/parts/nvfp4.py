"""``--kv-cache-dtype nvfp4`` on MHA layers: SGLang 0.5.23's ``NVFP4KVCacheMethod`` buffers (issue 33).

SGLang resolves the recipe's attention backends from the GPU and ``--prefill-kv-cache-dequant-dtype``
(``handle_nvfp4_prefill_kv_dequant_dtype``, ``arg_groups/kv_cache_hook.py`` lines 34-96): ``auto`` is ``nvfp4``
(native NVFP4 prefill) on SM100 and ``fp8_e4m3`` on SM120; ``fp8_e4m3`` prefills with ``flashinfer`` from an fp8
dequant workspace, ``nvfp4`` with ``trtllm_mha``; decode is always ``trtllm_mha``.  The recipe's access rules
(``KV_CACHE_ATTENTION_ACCESS_REGISTRY``, ``layers/quantization/fp4_kv_cache_quant_method.py``) then decide what
``NVFP4KVCacheMethod.create_buffers`` allocates for ``m`` rows, ``n`` heads of ``k`` dims, per layer:

* ``k_buffer`` / ``v_buffer`` ``(m, n, k // 2)`` uint8, always (packed e2m1 pairs; V at the K width);
* token-linear scales ``(m, n, k // 16)`` uint8 for K and V where a dequant workspace is read or the native
  reader is not SM100's (``needs_linear_scale_buffer``);
* SM100 TRT-LLM GenMHA native scales ``(m // page, n, page, k // 16)`` uint8 for K and V
  (``needs_native_fp4_scales``: a native reader on SM100);

and once for all layers the fp8 dequant workspace ``dq_k_buffer`` / ``dq_v_buffer`` ``(m, n, k)`` where flashinfer
prefills.  So: SM100 default, data + native scales; SM100 with ``fp8_e4m3`` prefill, data + both scale layouts +
workspace; SM120, data + linear scales + workspace.  kvpools cannot see the GPU: ``--nvfp4-sm`` says which.
"""

from __future__ import annotations

import attrs

from kvpools_core.options import option
from kvpools_core.values import Serving

NVFP4_SM_CHOICES = (100, 120)
PREFILL_DEQUANT_DTYPES = ("auto", "fp8_e4m3", "nvfp4")
SCALE_BLOCK = 16
TRTLLM_MHA_PAGE_SIZES = (16, 32, 64, 128)
"""The pages ``trtllm_mha`` (nvfp4's decode backend) runs (``_mla_backend_page_constraints``,
``arg_groups/overrides.py``): another becomes 64, an unset one too (:data:`TRTLLM_MHA_DEFAULT_PAGE`)."""
TRTLLM_MHA_DEFAULT_PAGE = 64
"""``NVFP4KVCacheMethod.SCALE_BLOCK_SIZE``: one fp8 e4m3 scale per 16 values."""


@attrs.frozen
class Nvfp4Layout:
    """What SGLang's ``NVFP4KVCacheMethod`` allocates beside the packed K/V for one resolved server."""

    sm: int
    prefill_dequant_dtype: str
    """The resolved ``--prefill-kv-cache-dequant-dtype``: ``fp8_e4m3`` (flashinfer) or ``nvfp4`` (trtllm_mha)."""
    linear_scales: bool
    native_scales: bool
    workspace: bool

    @property
    def prefill_backend(self) -> str:
        return "flashinfer" if self.prefill_dequant_dtype == "fp8_e4m3" else "trtllm_mha"

    @property
    def describe(self) -> str:
        held = ["packed K/V"]
        if self.linear_scales:
            held.append("token-linear scales")
        if self.native_scales:
            held.append("SM100 native scales")
        if self.workspace:
            held.append("an fp8 dequant workspace")
        return (
            f"nvfp4 on SM{self.sm}, prefill {self.prefill_backend} ({self.prefill_dequant_dtype}), decode trtllm_mha: "
            + ", ".join(held)
        )


def nvfp4_layout(serving: Serving) -> Nvfp4Layout | None:
    """The resolved layout, or None where ``--nvfp4-sm`` is unset or SGLang refuses the combination
    (:func:`nvfp4_problems` says why)."""
    sm = serving.nvfp4_sm
    if sm is None:
        return None
    requested = serving.prefill_kv_cache_dequant_dtype
    if requested == "auto":
        requested = "nvfp4" if sm == 100 else "fp8_e4m3"
    if requested == "nvfp4" and sm != 100:
        return None
    workspace = requested == "fp8_e4m3"  # flashinfer prefill reads the DEQUANT_WORKSPACE access
    native_reader = True  # decode is trtllm_mha, a NATIVE_FP4 access
    native_layout = sm == 100  # use_trtllm_gen_native_scale_layout = get_platform().is_sm100
    return Nvfp4Layout(
        sm=sm,
        prefill_dequant_dtype=requested,
        linear_scales=workspace or (native_reader and not native_layout),
        native_scales=native_reader and native_layout,
        workspace=workspace,
    )


def nvfp4_problems(serving: Serving, head_dims: tuple[int, ...], v_head_dims: tuple[int, ...]) -> list[str]:
    """What SGLang refuses (or kvpools does not model) of nvfp4 MHA layers of these head dims on this server."""
    o = option
    flag = f"{o('kv_cache_dtype')} nvfp4"
    if serving.nvfp4_sm is None:
        return [
            f"{flag} on MHA layers: SGLang 0.5.23's NVFP4KVCacheMethod allocates its scale buffers and dequant "
            f"workspace by the GPU (SM100 or SM120) and the prefill backend, which kvpools cannot see. Pass "
            f"{o('nvfp4_sm')} 100 or 120 (and {o('prefill_kv_cache_dequant_dtype')} if SGLang is given "
            f"--prefill-kv-cache-dequant-dtype), or use {o('kv_cache_dtype')} fp4_mx_block16."
        ]
    layout = nvfp4_layout(serving)
    if layout is None:
        return [
            f"{flag} with {o('prefill_kv_cache_dequant_dtype')} nvfp4 on SM{serving.nvfp4_sm}: SGLang raises 'Native "
            "NVFP4 prefill currently requires SM100; use --prefill-kv-cache-dequant-dtype=fp8_e4m3 on this "
            f"platform.' Use {o('prefill_kv_cache_dequant_dtype')} fp8_e4m3 or auto."
        ]
    problems = []
    if serving.platform != "cuda":
        problems.append(
            f"{flag} on the {serving.platform} platform: SGLang's NVFP4 KV cache runs on CUDA Blackwell (SM100, "
            f"SM120) only ('--kv-cache-dtype=nvfp4 requires Blackwell SM100 or SM120'). Use the cuda platform."
        )
    if any(v != k for k, v in zip(head_dims, v_head_dims, strict=True)):
        problems.append(
            f"{flag}: NVFP4KVCacheMethod stores V at the K head dim; kvpools does not model nvfp4 on layers whose "
            "V head dim differs from K's yet. Use fp4_mx_block16 or fp8_e4m3."
        )
    if serving.page_size not in TRTLLM_MHA_PAGE_SIZES:
        problems.append(
            f"{flag} with {o('page_size')} {serving.page_size}: SGLang decodes nvfp4 with trtllm_mha and replaces the "
            f"page ('TensorRT-LLM MHA only supports page_size of 16, 32, 64 or 128, changing page_size from "
            f"{serving.page_size} to 64.', _mla_backend_page_constraints), which kvpools does not model. Pass "
            f"{o('page_size')} 64 (or 16, 32, 128), or leave it unset (64)."
        )
    native = layout.native_scales  # on SM100 every page of 16..128 is divisible by 4 ('Native NVFP4 requires ...')
    if native:
        odd = sorted({d for d in head_dims if d % 64})
        if odd:
            problems.append(
                f"{flag} on SM100 (native scales): SGLang raises 'Native NVFP4 requires head_dim divisible by 64, "
                f"got {odd[0]}.'"
            )
        problems += _sm100_native_problems(serving)
    elif serving.enable_hierarchical_cache:
        problems.append(
            f"{flag} on SM{layout.sm} with {o('enable_hierarchical_cache')}: kvpools does not model the host tier of "
            "an NVFP4 pool (its scale buffers and workspace) yet. Drop the host tier or use fp4_mx_block16."
        )
    if layout.workspace and serving.speculative and serving.speculative_algorithm != "NGRAM":
        problems.append(
            f"{flag} with the fp8 dequant workspace ({layout.describe}) and {o('speculative_algorithm')} "
            f"{serving.speculative_algorithm}: kvpools does not model the draft pool's own workspace yet. Use "
            f"{o('nvfp4_sm')} 100 with {o('prefill_kv_cache_dequant_dtype')} auto, or no draft."
        )
    if serving.disaggregation_decode_retraction_backup == "host_pool":
        problems.append(
            f"{flag} with {o('disaggregation_decode_retraction_backup')} host_pool: kvpools does not model an NVFP4 "
            "retraction host pool yet. Use cpu_tensor or none."
        )
    return problems


def _sm100_native_problems(serving: Serving) -> list[str]:
    """``handle_kv4_compatibility`` (``arg_groups/kv_cache_hook.py`` lines 139-258) on SM100 with trtllm_mha."""
    o = option
    flag = f"{o('kv_cache_dtype')} nvfp4"
    problems = []
    algorithm = serving.speculative_algorithm
    if algorithm in ("DFLASH", "DSPARK"):
        problems.append(
            f"{flag} on SM100 with {o('speculative_algorithm')} {algorithm}: SGLang raises 'SM100 native NVFP4 "
            f"speculative decoding does not yet support {algorithm}; use EAGLE/NEXTN or NGRAM.'"
        )
    elif algorithm == "STANDALONE":
        problems.append(
            f"{flag} on SM100 with {o('speculative_algorithm')} STANDALONE: SGLang raises 'SM100 native NVFP4 "
            "speculative decoding supports EAGLE, EAGLE3, NEXTN, and breadth-1 NGRAM; got STANDALONE.'"
        )
    elif algorithm == "NGRAM":
        problems.append(
            f"{flag} on SM100 with {o('speculative_algorithm')} NGRAM: SGLang raises 'SM100 native NVFP4 NGRAM "
            "speculative decoding requires --speculative-ngram-max-bfs-breadth=1' (its default is 10), an option "
            "kvpools does not have. Use EAGLE or NEXTN."
        )
    if serving.disaggregation_mode != "null":
        problems.append(
            f"{flag} on SM100 with {o('disaggregation_mode')} {serving.disaggregation_mode}: SGLang raises 'SM100 "
            "native NVFP4 with trtllm_mha does not yet support PD disaggregation because its physical block-scale "
            "layout is not implemented by the KV transfer path.'"
        )
    if serving.enable_hierarchical_cache:
        problems.append(
            f"{flag} on SM100 with {o('enable_hierarchical_cache')}: SGLang raises 'SM100 native NVFP4 with "
            "trtllm_mha does not yet support hierarchical KV cache or LMCache because their host pools do not "
            "preserve the physical block-scale layout.'"
        )
    return problems
