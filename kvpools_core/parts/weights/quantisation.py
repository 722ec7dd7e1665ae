"""How a ``quantization_config`` stores the quantised Linear weights (values, scales, zeros).

Each method gives the bytes of ``count`` stacked ``out × inner`` weights with what the checkpoint stores beside
them; SGLang loads those tensors as they are, so the same arithmetic sizes one rank's shard.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable
from typing import Protocol

import attrs

from kvpools_core.config import ConfigReader, describe

__all__ = [
    "KNOWN",
    "RUNTIME_METHODS",
    "RUNTIME_SCHEMES",
    "ByModule",
    "Quantisation",
    "RuntimeFp8",
    "mxfp4",
    "quantisation_of",
    "runtime_quantisation",
]


class Weight(Protocol):
    """What a storage rule reads of a tensor (:class:`~kvpools_core.parts.weights.tensors.Tensor` has it): its
    Hugging Face module name, whether it is a Linear weight, and its family."""

    @property
    def family(self) -> str: ...

    @property
    def module(self) -> str: ...

    @property
    def linear(self) -> bool: ...


FLOAT32 = 4
FLOAT16 = 2
KNOWN = (
    "'fp8' (per-tensor or block-wise), 'mxfp4', 'modelopt' (quant_algo 'FP8', 'NVFP4', 'W4A16_NVFP4' or "
    "'MIXED_PRECISION' of those), 'compressed-tensors' nvfp4 and 8-bit fp8 / int8, 'awq' (4-bit) and 'gptq' "
    "(2/4/8-bit)"
)


@attrs.frozen
class Quantisation:
    """How the quantised Linear weights are stored: bytes of ``count × out × inner`` values with their scales."""

    label: str
    bytes_of: Callable[[int, int, int], int]
    excluded: tuple[str, ...]

    def applies_to(self, tensor: Weight) -> bool:
        return tensor.linear and not any(_module_matches(tensor.module, pattern) for pattern in self.excluded)

    def for_tensor(self, tensor: Weight) -> Quantisation | None:
        """The storage of ``tensor``: this one, or ``None`` when it stays in the model dtype."""
        return self if self.applies_to(tensor) else None


@attrs.frozen
class ByModule:
    """A checkpoint that names a storage per module (ModelOpt ``MIXED_PRECISION``'s ``quantized_layers``): a module,
    or a parent of it, listed there is stored so (the LM head too when listed); anything else keeps the dtype."""

    layers: tuple[tuple[str, Quantisation], ...]

    def for_tensor(self, tensor: Weight) -> Quantisation | None:
        if not (tensor.linear or tensor.family == "lm_head"):
            return None
        for module, storage in self.layers:
            if tensor.module == module or tensor.module.startswith(f"{module}."):
                return storage
        return None


_RUNTIME_LABELS = {
    "sglang": "float8_e4m3 (quantised at load) + float32 scale per output row (per expert in MoE)",
    "per_tensor": "float8_e4m3 (quantised at load) + float32 scale per layer (per expert in MoE)",
    "per_channel": "float8_e4m3 (quantised at load) + float32 scale per output row",
    "per_block": "float8_e4m3 (quantised at load) + float32 scale per 128x128 block",
}
RUNTIME_SCHEMES = tuple(_RUNTIME_LABELS)
_BLOCK = 128
_SHARED_SCALE = {"q_proj": "v_proj", "k_proj": "v_proj", "gate_proj": "up_proj"}
"""vLLM's fused Linears: Hugging Face's ``q_proj`` / ``k_proj`` / ``v_proj`` load into one ``qkv_proj``
(``QKVParallelLinear``), ``gate_proj`` / ``up_proj`` into one ``gate_up_proj`` (``MergedColumnParallelLinear``); a
per-layer scale is one for the fused layer, counted on ``v_proj`` / ``up_proj``."""


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@attrs.frozen
class RuntimeFp8:
    """An unquantised checkpoint quantised to fp8 when it loads (``--quantization fp8`` and vLLM's online
    shorthands); ``scheme`` says how its scales are kept.

    * ``"sglang"`` (SGLang's ``fp8``): a Linear (``Fp8LinearMethod.process_weights_after_loading``,
      sglang/srt/layers/quantization/fp8.py, the not-``is_checkpoint_fp8_serialized`` branch) becomes fp8 with one
      float32 scale per output row on CUDA (the cutlass path, ``per_token_group_quant_fp8`` over the whole row;
      ``input_to_float8``'s one scale a tensor only without cutlass fp8): ``out·in + 4·out``. The experts
      (``Fp8MoEMethod.process_weights_after_loading``) become fp8 with one float32 scale per expert for the merged
      ``w13`` (gate and up) and one for ``w2`` (down): the scale of ``w13`` is counted on ``up_proj``.
    * ``"per_tensor"`` (vLLM's ``fp8_per_tensor``, and its ``fp8``: up to 0.30 ``Fp8Config``'s
      own per-tensor methods, from 0.31 ``fp8_per_tensor`` itself): one float32 scale per vLLM layer
      (``Fp8PerTensorOnlineLinearMethod.process_weights_after_loading``, vLLM 0.33
      ``quantization/online/fp8.py`` L237-250: ``amax.reshape(1)``), so ``q``/``k``/``v`` and ``gate``/``up``,
      fused into one layer, share theirs (counted on ``v_proj`` / ``up_proj`` where the model has them); the
      experts one per expert for ``w13`` and one for ``w2`` (``Fp8PerTensorOnlineMoEMethod``, L617-647).
    * ``"per_channel"`` (``fp8_per_channel``): one float32 scale per output row of every Linear
      (``Fp8PtpcOnlineLinearMethod``, L426-440, ``amax`` over the input dimension) and of every expert's ``w13``
      and ``w2`` (``Fp8PtpcOnlineMoEMethod``, L809-838: ``w13_scale`` ``(E, 2·I, 1)``, ``w2_scale`` per row of
      ``w2``): ``out·in + 4·out``.
    * ``"per_block"`` (``fp8_per_block``): one float32 scale per 128 × 128 block (``per_block_cast_to_fp8``,
      vLLM 0.33 utils/deep_gemm.py L1027-1046: ``ceil(out/128) × ceil(in/128)`` scales, the weight unpadded;
      ``Fp8PerBlockOnlineLinearMethod``, L337-350); the experts' hidden size and per-rank intermediate size are
      first rounded up to 128 (``Fp8PerBlockOnlineMoEMethod.maybe_roundup_sizes``, L680-695), the padded weight
      stored, with ``(E, ceil(rows/128), ceil(cols/128))`` scales (L718-742).  The blocks are counted per Hugging
      Face tensor: where a fused layer's parts (q/k/v, gate/up) are not multiples of 128 rows vLLM blocks the fused
      rows and keeps a few row blocks fewer (an upper bound by under one row of blocks a part).

    Embeddings, the LM head (``ParallelLMHead`` is no ``LinearBase``: ``OnlineQuantizationConfig.
    resolve_quant_method_cls``, vLLM 0.33 ``quantization/online/base.py`` L289-299), norms and routers (kept
    unquantised by the checkpoints' model code) stay in the dtype.  ``modules`` are the model's tensors' module
    names, which say which Linears vLLM fuses (the per-layer scale of ``"per_tensor"``).
    """

    scheme: str = attrs.field(default="sglang", validator=attrs.validators.in_(RUNTIME_SCHEMES))
    modules: frozenset[str] = frozenset()

    @property
    def label(self) -> str:
        return _RUNTIME_LABELS[self.scheme]

    def for_tensor(self, tensor: Weight) -> Quantisation | None:
        if not tensor.linear:
            return None
        experts = tensor.family == "moe_experts"
        return Quantisation(self.label, self._bytes_of(tensor.module, experts), ())

    def _bytes_of(self, module: str, experts: bool) -> Callable[[int, int, int], int]:
        if self.scheme == "per_channel" or (self.scheme == "sglang" and not experts):
            return lambda count, out, inner: count * out * (inner + FLOAT32)
        if self.scheme == "per_block":
            return _per_block(experts)
        if experts:  # one scale per expert for w13 (counted on up) and one for w2
            scales = 0 if module.endswith((".gate_proj", ".w1")) else 1
            return lambda count, out, inner: count * (out * inner + scales * FLOAT32)
        parent, _, name = module.rpartition(".")
        shares = name in _SHARED_SCALE and f"{parent}.{_SHARED_SCALE[name]}" in self.modules
        return lambda count, out, inner: count * (out * inner + (0 if shares else FLOAT32))


def _per_block(experts: bool) -> Callable[[int, int, int], int]:
    def bytes_of(count: int, out: int, inner: int) -> int:
        if experts:
            out, inner = _round_up(out, _BLOCK), _round_up(inner, _BLOCK)
        return count * (out * inner + FLOAT32 * math.ceil(out / _BLOCK) * math.ceil(inner / _BLOCK))

    return bytes_of


RUNTIME_METHODS = {"fp8_per_tensor": "per_tensor", "fp8_per_channel": "per_channel", "fp8_per_block": "per_block"}
"""vLLM's online fp8 shorthands and the :class:`RuntimeFp8` scheme of each."""


def runtime_quantisation(
    resolved: str | None,
    checkpoint: Quantisation | ByModule | None,
    engine: str = "sglang",
    modules: frozenset[str] = frozenset(),
) -> Quantisation | ByModule | RuntimeFp8 | None:
    """The storage the engine serves: ``resolved`` is the method its rules accepted against the checkpoint
    (:func:`~kvpools_core.parts.weights.methods.resolve_quantization`, which refuses what the engine's release
    refuses). A quantised checkpoint keeps its own storage (the engine reads its scales; nothing is quantised
    twice); on an unquantised one (:class:`RuntimeFp8`) ``fp8`` is quantised at load as ``engine`` does it (SGLang
    per output row; vLLM per tensor), vLLM's ``fp8_per_tensor`` / ``fp8_per_channel`` /
    ``fp8_per_block`` as they say. ``modules`` are the model's tensors' module names (:class:`RuntimeFp8`)."""
    if checkpoint is not None:
        return checkpoint
    if resolved == "fp8":
        return RuntimeFp8("per_tensor" if engine == "vllm" else "sglang", modules)
    if resolved in RUNTIME_METHODS:
        return RuntimeFp8(RUNTIME_METHODS[resolved], modules)
    return None


def _module_matches(module: str, pattern: str) -> bool:
    """Whether an exclusion pattern names ``module``: the module or a parent of it (``*`` a wildcard, as Hugging
    Face's ``modules_to_not_convert``), or its trailing components (``"gate"`` names ``model.layers.0.mlp.gate``,
    as SGLang's ``is_layer_skipped`` matches by suffix); a ``re:`` prefix is a compressed-tensors regex."""
    parts = module.split(".")
    if pattern.startswith("re:"):
        import re

        return re.match(pattern[3:], module) is not None
    prefixes = (".".join(parts[:end]) for end in range(1, len(parts) + 1))
    suffixes = (".".join(parts[start:]) for start in range(1, len(parts)))
    return any(fnmatch.fnmatchcase(name, pattern) for name in (*prefixes, *suffixes))


def mxfp4(excluded: tuple[str, ...] = ()) -> Quantisation:
    """OCP MX fp4: 4-bit E2M1 values and one E8M0 (1 byte) scale per 32 values along the input dimension."""
    return Quantisation(
        "mxfp4 (4-bit + one e8m0 scale per 32 values)",
        lambda count, out, inner: count * out * (math.ceil(inner / 2) + math.ceil(inner / 32)),
        excluded,
    )


def _nvfp4(group: int, excluded: tuple[str, ...], scalars: int = 2) -> Quantisation:
    """NVFP4 (ModelOpt ``NVFP4``, compressed-tensors ``nvfp4-pack-quantized``): 4-bit E2M1 values, an fp8 e4m3
    scale per ``group`` (16) inputs, and float32 scalars a tensor (``weight_scale_2`` / ``weight_global_scale`` and,
    but for weight-only ``W4A16_NVFP4``, the activation's ``input_scale``); a stacked expert keeps its own."""
    return Quantisation(
        f"nvfp4 (4-bit + fp8 e4m3 scale per {group} values + {scalars} float32 scalar{'s' if scalars > 1 else ''})",
        lambda count, out, inner: count * (out * (math.ceil(inner / 2) + math.ceil(inner / group)) + scalars * FLOAT32),
        excluded,
    )


def _fp8_per_tensor(excluded: tuple[str, ...], scalars: int) -> Quantisation:
    return Quantisation(
        f"float8_e4m3 + {scalars} float32 scalar{'s' if scalars > 1 else ''} per tensor",
        lambda count, out, inner: count * (out * inner + scalars * FLOAT32),
        excluded,
    )


def _awq(quant: ConfigReader, excluded: tuple[str, ...]) -> Quantisation:
    """AutoAWQ's GEMM layout (``WQLinear_GEMM``): ``qweight`` int32 ``[in, out/8]``, ``qzeros`` int32
    ``[in/group, out/8]`` and ``scales`` fp16 ``[in/group, out]``; ``group_size: -1`` is one group."""
    bits = quant.integer("bits", quant.integer("w_bit", 4))
    if bits != 4:
        raise quant.error("bits", f"is {bits}", "AWQ checkpoints are 4-bit; other widths are not modelled.")
    group = _group_size(quant)

    def size(count: int, out: int, inner: int) -> int:
        groups = 1 if group is None else math.ceil(inner / group)
        packed_out = math.ceil(out / 8) * FLOAT32  # eight 4-bit values an int32
        return count * (inner * packed_out + groups * packed_out + groups * out * FLOAT16)

    return Quantisation(f"awq int4 (group {group or 'per-channel'}; fp16 scales, int4 zeros)", size, excluded)


def _gptq(quant: ConfigReader, excluded: tuple[str, ...]) -> Quantisation:
    """AutoGPTQ / GPTQModel's layout: ``qweight`` int32 ``[in·bits/32, out]``, ``qzeros`` int32
    ``[groups, out·bits/32]``, ``scales`` fp16 ``[groups, out]`` and the int32 ``g_idx`` ``[in]`` buffer that both
    libraries save with every layer (whether ``desc_act`` reorders it or not)."""
    bits = quant.integer("bits")
    if bits not in (2, 4, 8):
        raise quant.error("bits", f"is {bits}", "The weights estimate models 2-, 4- and 8-bit GPTQ.")
    group = _group_size(quant)

    def size(count: int, out: int, inner: int) -> int:
        groups = 1 if group is None else math.ceil(inner / group)
        qweight = math.ceil(inner * bits / 32) * out * FLOAT32
        qzeros = groups * math.ceil(out * bits / 32) * FLOAT32
        return count * (qweight + qzeros + groups * out * FLOAT16 + inner * FLOAT32)

    return Quantisation(f"gptq int{bits} (group {group or 'per-channel'}; fp16 scales, g_idx)", size, excluded)


def _group_size(quant: ConfigReader) -> int | None:
    """``group_size`` (``q_group_size`` in AutoAWQ's own configs); ``-1`` means one group per output channel."""
    key = "group_size" if quant.has("group_size") or not quant.has("q_group_size") else "q_group_size"
    value = quant.get(key, 128)
    if value == -1:
        return None
    return quant.integer(key, 128)


def _modelopt(quant: ConfigReader, excluded: tuple[str, ...]) -> Quantisation | ByModule:
    """ModelOpt (``hf_quant_config.json``'s ``quantization`` block, flat or nested, as SGLang's
    ``ModelOptFp4Config.from_config`` reads it): ``quant_algo`` NVFP4 or FP8 (per-tensor weight and input scales),
    or ``MIXED_PRECISION`` with a ``quantized_layers`` map of module → ``quant_algo`` (``FP8``, ``NVFP4``,
    ``W4A16_NVFP4``) and ``group_size``."""
    inner = quant.child("quantization") if quant.has("quantization") else quant
    algo = inner.string("quant_algo")
    excluded = excluded or inner.string_list("exclude_modules")
    if algo == "MIXED_PRECISION":
        layers = inner.child("quantized_layers")
        return ByModule(tuple((module, _modelopt_scheme(layers.child(module), ())) for module in sorted(layers.config)))
    return _modelopt_scheme(inner, excluded)


def _modelopt_scheme(scheme: ConfigReader, excluded: tuple[str, ...]) -> Quantisation:
    algo = scheme.string("quant_algo")
    if algo in ("NVFP4", "W4A16_NVFP4"):
        return _nvfp4(scheme.integer("group_size", 16), excluded, scalars=2 if algo == "NVFP4" else 1)
    if algo == "FP8":
        return _fp8_per_tensor(excluded, scalars=2)
    raise scheme.error(
        "quant_algo",
        f"is {describe(algo or None)}",
        "The weights estimate models ModelOpt 'NVFP4', 'W4A16_NVFP4', 'FP8' and 'MIXED_PRECISION' of those.",
    )


def _compressed_tensors(quant: ConfigReader, excluded: tuple[str, ...]) -> Quantisation:
    """compressed-tensors with one ``config_groups`` scheme targeting every ``Linear``: nvfp4 (``format``
    ``nvfp4-pack-quantized``); mixed schemes by module are refused rather than guessed."""
    groups = quant.child("config_groups")
    names = list(groups.config)
    if len(names) != 1:
        raise groups.error(
            names[1] if len(names) > 1 else "group_0",
            "is one of several schemes" if names else "is missing",
            "The weights estimate models a single compressed-tensors scheme targeting 'Linear'.",
        )
    scheme = groups.child(names[0])
    weights = scheme.child("weights")
    if scheme.string_list("targets") != ("Linear",):
        raise scheme.error("targets", f"is {describe(scheme.get('targets'))}", "Only ['Linear'] is modelled.")
    fmt = quant.string("format")
    if fmt == "nvfp4-pack-quantized" and weights.integer("num_bits") == 4 and weights.string("type") == "float":
        return _nvfp4(weights.integer("group_size", 16), excluded)
    if fmt in ("float-quantized", "int-quantized", "naive-quantized") and weights.integer("num_bits") == 8:
        return _compressed_8bit(scheme, weights, excluded)
    raise quant.error(
        "format",
        f"is {describe(fmt or None)}",
        "The weights estimate models compressed-tensors 'nvfp4-pack-quantized', and 8-bit 'float-quantized' / "
        "'int-quantized' (fp8 / int8, per tensor, channel or block).",
    )


def _compressed_8bit(scheme: ConfigReader, weights: ConfigReader, excluded: tuple[str, ...]) -> Quantisation:
    """compressed-tensors 8-bit weights (fp8 ``float-quantized``, int8 ``int-quantized``): a byte a weight and the
    float32 scales SGLang holds them with (``CompressedTensorsW8A8Fp8.create_weights``,
    sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py L108-141, and the int8
    scheme beside it: ``PerTensorScaleParameter`` /
    ``ChannelQuantScaleParameter`` / ``BlockQuantScaleParameter`` in float32) by ``strategy``: ``tensor`` one,
    ``channel`` one per output row, ``block`` one per ``block_structure`` block; a static activation scheme adds
    its float32 ``input_scale``. Asymmetric weights (zero points) and ``group`` strategies are refused."""
    kind = weights.string("type", "int")
    if kind not in ("float", "int"):
        raise weights.error("type", f"is {describe(kind)}", "8-bit compressed-tensors weights are 'float' or 'int'.")
    if not weights.boolean("symmetric", True):
        raise weights.error("symmetric", "is false", "Asymmetric (zero-point) 8-bit weights are not modelled.")
    name = "float8_e4m3" if kind == "float" else "int8"
    static = 0
    if scheme.has("input_activations") and scheme.get("input_activations") is not None:
        static = 0 if scheme.child("input_activations").boolean("dynamic", False) else FLOAT32
    strategy = weights.string("strategy", "tensor")
    if strategy == "tensor":
        return Quantisation(
            f"{name} + float32 scale per tensor",
            lambda count, out, inner: count * (out * inner + FLOAT32 + static),
            excluded,
        )
    if strategy == "channel":
        return Quantisation(
            f"{name} + float32 scale per output row",
            lambda count, out, inner: count * (out * (inner + FLOAT32) + static),
            excluded,
        )
    if strategy == "block":
        block = weights.integer_list("block_structure", minimum=1, maximum=1 << 20)
        if len(block) != 2:
            raise weights.error("block_structure", f"is {describe(list(block))}", "It must be [rows, columns].")
        rows, cols = block
        return Quantisation(
            f"{name} + float32 scale per {rows}x{cols} block",
            lambda count, out, inner: (
                count * (out * inner + FLOAT32 * math.ceil(out / rows) * math.ceil(inner / cols) + static)
            ),
            excluded,
        )
    raise weights.error(
        "strategy",
        f"is {describe(strategy)}",
        "8-bit compressed-tensors weights are modelled per tensor, channel or block.",
    )


def quantisation_of(reader: ConfigReader) -> Quantisation | ByModule | None:
    """The storage of quantised Linear weights from ``quantization_config``; unknown methods are refused."""
    if not reader.has("quantization_config"):
        return None
    quant = reader.child("quantization_config")
    method = quant.string("quant_method")
    excluded = quant.string_list("modules_to_not_convert") or quant.string_list("ignore")
    if method == "fp8":
        block = quant.integer_list("weight_block_size", minimum=1, maximum=1 << 20)
        if block:
            if len(block) != 2:
                raise quant.error("weight_block_size", f"is {describe(list(block))}", "It must be [rows, columns].")
            rows, cols = block
            return Quantisation(
                f"float8_e4m3 + float32 scale per {rows}x{cols} block",
                lambda count, out, inner: count * (out * inner + 4 * math.ceil(out / rows) * math.ceil(inner / cols)),
                excluded,
            )
        return _fp8_per_tensor(excluded, scalars=1)
    if method == "mxfp4":
        return mxfp4(excluded)
    if method == "modelopt" or (not method and quant.has("quantization")):
        return _modelopt(quant, excluded)
    if method == "compressed-tensors":
        return _compressed_tensors(quant, excluded)
    if method == "awq":
        return _awq(quant, excluded)
    if method == "gptq":
        return _gptq(quant, excluded)
    raise quant.error(
        "quant_method",
        f"is {describe(method or None)}",
        f"The weights estimate knows {KNOWN}; other methods are not modelled.",
    )
