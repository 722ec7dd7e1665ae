"""KV-cache element types: how many bytes SGLang charges, and how kvpools stores them.

SGLang's ``kv_size`` is ``torch._utils._element_size(kv_cache_dtype)``; packed
fp4 (``float4_e2m1fn_x2``) is one byte that holds two values, so formulas that
charge fp4 halve the data term and add a scale term.  fp8 is stored as uint8
because ``index_put`` is not implemented for fp8 tensors.
"""

from __future__ import annotations

import attrs

from kvpools_core.errors import ConfigError
from kvpools_core.options import option

MODEL_DTYPES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
"""Model (activation) dtypes a config may name, with their element size."""


@attrs.frozen
class KVDtype:
    """One resolved ``--kv-cache-dtype``.

    ``element_bytes`` is SGLang's ``kv_size``; ``values_per_element`` is 2 for
    packed fp4; ``scale_block`` is how many values share one scale byte (fp4: 16,
    mxfp8: 32), or ``None`` for unscaled types.
    """

    name: str
    torch_dtype: str
    element_bytes: int
    storage_dtype: str
    values_per_element: int = 1
    scale_block: int | None = None

    @property
    def is_fp4(self) -> bool:
        """Packed fp4 (``float4_e2m1fn_x2``): ``fp4_e2m1`` and SGLang 0.5.23's recipe names ``fp4_mx_block16``
        and ``nvfp4``."""
        return self.values_per_element == 2

    @property
    def is_fp8(self) -> bool:
        return self.name in ("fp8_e4m3", "fp8_e5m2", "mxfp8")


_FIXED: dict[str, KVDtype] = {
    "bf16": KVDtype("bf16", "bfloat16", 2, "bfloat16"),
    "fp16": KVDtype("fp16", "float16", 2, "float16"),
    "fp32": KVDtype("fp32", "float32", 4, "float32"),
    "fp8_e4m3": KVDtype("fp8_e4m3", "float8_e4m3fn", 1, "uint8"),
    "fp8_e5m2": KVDtype("fp8_e5m2", "float8_e5m2", 1, "uint8"),
    "fp4_e2m1": KVDtype("fp4_e2m1", "float4_e2m1fn_x2", 1, "uint8", values_per_element=2, scale_block=16),
    # SGLang 0.5.23's two FP4 recipes (``--kv-cache-dtype`` choices, ``arg_groups/fields/model.py`` lines 195-222):
    # both store ``float4_e2m1fn_x2`` (``mem_cache/kv_cache_dtype.py`` lines 76-88).  fp4_mx_block16 keeps one
    # uint8 scale per 16 values and no dequant workspace (``FP4MXBlock16KVCacheMethod``): fp4_e2m1's bytes.
    "fp4_mx_block16": KVDtype("fp4_mx_block16", "float4_e2m1fn_x2", 1, "uint8", values_per_element=2, scale_block=16),
    # nvfp4's MHA pool (``NVFP4KVCacheMethod``) depends on the attention backends and the GPU (parts/nvfp4.py);
    # its MLA pool (``MLATokenToKVPoolFP4``, no quant method) is fp4_e2m1's
    "nvfp4": KVDtype("nvfp4", "float4_e2m1fn_x2", 1, "uint8", values_per_element=2, scale_block=16),
    "mxfp8": KVDtype("mxfp8", "float8_e4m3fn", 1, "uint8", scale_block=32),
}
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "fp8": "fp8_e4m3"}
_FROM_MODEL = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}

KV_DTYPE_CHOICES: tuple[str, ...] = ("auto", *_FIXED)
"""Every accepted ``--kv-cache-dtype`` spelling's canonical name."""

KV_DTYPE_SPELLINGS: tuple[str, ...] = (*KV_DTYPE_CHOICES, *_ALIASES)
"""What ``--kv-cache-dtype`` accepts: the canonical names and the engines' own spellings of them (vLLM's ``fp8``,
``bfloat16``, ``float16``), so a user's ``vllm serve`` flags work as they are; plans name the canonical one."""

NVFP4_MHA_REFUSAL = (
    "kvpools does not model {flag} nvfp4 on MHA layers of this architecture yet: SGLang 0.5.23's "
    "NVFP4KVCacheMethod (layers/quantization/fp4_kv_cache_quant_method.py) allocates token-linear and/or "
    "SM100-native block-scale buffers and an fp8 dequant workspace by the attention backends and the GPU, which "
    "kvpools models for dense MHA models only (kvpools_core/parts/nvfp4.py). Use {flag} fp4_mx_block16 (packed "
    "fp4 plus one scale byte per 16 values, no workspace), which kvpools plans exactly."
)
"""Why ``nvfp4`` is refused for MHA-cell layers (format with ``flag=option('kv_cache_dtype')``)."""


def canonical_kv_dtype(name: str) -> str:
    """Normalise a ``--kv-cache-dtype`` spelling, or raise a ConfigError listing the choices."""
    if not isinstance(name, str):
        raise ConfigError(f"{option('kv_cache_dtype')} must be a string, got {name!r}.")
    key = _ALIASES.get(name.lower(), name.lower())
    if key == "auto" or key in _FIXED:
        return key
    raise ConfigError(f"Unsupported {option('kv_cache_dtype')} {name!r}. Choose one of: {', '.join(KV_DTYPE_CHOICES)}.")


def resolve_kv_dtype(name: str, model_dtype: str) -> KVDtype:
    """The KV dtype actually stored: ``auto`` follows the model dtype."""
    key = canonical_kv_dtype(name)
    if key == "auto":
        if model_dtype not in _FROM_MODEL:
            raise ConfigError(
                f"Model dtype {model_dtype!r} has no KV-cache counterpart; "
                f"pass {option('kv_cache_dtype')} explicitly ({', '.join(_FIXED)})."
            )
        key = _FROM_MODEL[model_dtype]
    return _FIXED[key]
