"""The recurrent state one request slot holds per layer on one TP rank, and which layers a rank holds.

Shapes follow SGLang's mamba cache params (``configs/mamba_utils.py``):

* Mamba2 (Nemotron-H, Falcon-H1, Granite-4.0-H): ``n_groups`` is first padded to
  the TP size when TP does not divide it (``extra_groups_for_head_shards``),
  ``conv_dim = intermediate + 2 x n_groups x state_size``; conv state
  ``(conv_dim / tp, conv_kernel - 1)``, SSM state ``(heads / tp, head_dim, state_size)``.
* Gated DeltaNet (Qwen3-Next, Qwen3.5): the conv runs over the concatenated
  query, key and value (``conv_dim = 2 x key_heads x key_head_dim + value_heads
  x value_head_dim``, key groups padded like Mamba2's); SSM state
  ``(value_heads / tp, key_head_dim, value_head_dim)``.
* Mamba-1 (Jamba): conv ``(d_inner / tp, d_conv - 1)``, SSM ``(d_inner / tp, d_state)``.
* KDA (Kimi-Linear, ``KimiLinearStateShape.create``): the short conv over q, k
  and v, each ``heads x head_dim`` sharded on its own, stored window-first as
  one ``(conv_kernel - 1, 3 x heads x head_dim / tp)`` tensor; SSM state
  ``(heads / tp, head_dim, head_dim)``.  SGLang does not pass the config to
  ``mamba2_state_dtype`` here, so a config's ``mamba_ssm_dtype`` does not count.

The conv state is stored in the model dtype (SGLang's default conv dtype is
bfloat16, the same two bytes), the SSM state in float32 unless the config's
``mamba_ssm_dtype`` or ``--mamba-ssm-dtype`` says otherwise.  TP is the
attention TP size (Falcon-H1: the whole TP group).
"""

from __future__ import annotations

import math

import attrs

from kvpools_core.dtypes import MODEL_DTYPES
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parallel import pp_layer_range, rank_layer_range
from kvpools_core.parts.unified import state_parts
from kvpools_core.values import LayerSpec, ModelSpec, Serving

from .config import GDN, KDA, KV_KINDS, MAMBA1, STATE_KINDS

SCONV = "sconv"
"""The mixer of Inkling-class models: short convolutions only (:mod:`.inkling`)."""
SCONV_DTYPE = "bfloat16"
"""``InklingStateDType``'s conv dtype, whatever the model's."""


@attrs.frozen
class StateShape:
    """One layer's state in one slot on one rank: conv tensor shapes and the SSM tensor shape, with dtypes."""

    conv: tuple[tuple[int, ...], ...]
    ssm: tuple[int, ...]
    conv_dtype: str
    ssm_dtype: str
    conv_window_first: bool = attrs.field(default=False, kw_only=True)
    """Whether the conv rows are ``(window, channels)`` (KDA) rather than ``(channels, window)``: a
    platform that stores the window first (SGLang's NPU) must know which axis is which."""

    @property
    def conv_bytes(self) -> int:
        return sum(math.prod(shape) for shape in self.conv) * MODEL_DTYPES[self.conv_dtype]

    @property
    def ssm_bytes(self) -> int:
        return math.prod(self.ssm) * MODEL_DTYPES[self.ssm_dtype]

    @property
    def bytes(self) -> int:
        """Bytes of one layer's state in one slot (SGLang's ``mamba_cache_per_req`` over one layer)."""
        return self.conv_bytes + self.ssm_bytes

    def describe(self) -> str:
        conv = " + ".join(f"{'x'.join(map(str, c))}" for c in self.conv)
        return f"conv {conv} {self.conv_dtype} + SSM {'x'.join(map(str, self.ssm))} {self.ssm_dtype}"


def state_entry_parts(shape: StateShape) -> tuple[tuple[str, int], ...]:
    """One layer's state parts in SGLang's unified Mamba entry order (``MambaSubPoolSpec``: each conv tensor, then
    the temporal state; ``build_mamba_entry_views`` lays them out part-major), in bytes."""
    conv = [math.prod(c) * MODEL_DTYPES[shape.conv_dtype] for c in shape.conv]
    return state_parts(conv, shape.ssm_bytes)


def state_tp_size(model: ModelSpec, serving: Serving) -> int:
    """The TP width the state is sharded over."""
    return serving.tp_size if model.params.get("state_tp") == "tensor" else serving.attn_tp_size


def state_shape(model: ModelSpec, serving: Serving) -> StateShape:
    """The per-layer, per-slot state of this rank; raises when TP does not divide the state's heads."""
    mixer = model.params["mixer"]
    if mixer == SCONV:
        return sconv_state_shape(model, serving)
    geometry = model.params["state"]
    tp = state_tp_size(model, serving)
    # --enable-linear-replayssm-spec with --mamba-ssm-dtype unset resolves it to float32 (SGLang 0.5.23
    # arg_groups/attention_hook.py: declare_resolution(mamba_ssm_dtype="float32")), over the config's own.
    replay = "float32" if serving.enable_linear_replayssm_spec else None
    ssm_dtype = serving.mamba_ssm_dtype or replay or model.params.get("ssm_dtype") or "float32"
    if mixer == MAMBA1:
        inner = _divide(geometry["intermediate_size"], tp, "the Mamba-1 inner size (mamba_expand x hidden_size)")
        kernel = geometry["conv_kernel"] - 1
        return StateShape(((inner, kernel),), (inner, geometry["state_size"]), model.dtype, ssm_dtype)
    if mixer == KDA:
        heads, head_dim = geometry["num_heads"], geometry["head_dim"]
        local_heads = _divide(heads, tp, "the KDA heads (linear_attn_config.num_heads)")
        proj = _divide(heads * head_dim, tp, "the KDA projection (num_heads x head_dim)")
        conv = (geometry["conv_kernel"] - 1, 3 * proj)  # q, k and v channels, window axis first
        return StateShape((conv,), (local_heads, head_dim, head_dim), model.dtype, ssm_dtype, conv_window_first=True)
    if mixer == GDN:
        groups, heads = geometry["num_k_heads"], geometry["num_v_heads"]
        inner, state_size, head_dim = heads * geometry["v_head_dim"], geometry["k_head_dim"], geometry["v_head_dim"]
    else:
        groups, heads = geometry["n_groups"], geometry["num_heads"]
        inner, state_size, head_dim = geometry["intermediate_size"], geometry["state_size"], geometry["head_dim"]
    local_heads = _divide(heads, tp, "the value heads" if mixer == GDN else "the mamba heads")
    if groups % tp:  # SGLang's extra_groups_for_head_shards: replicate groups so each head shard has its own
        groups += tp - groups
    conv_dim = inner + 2 * groups * state_size
    conv = (_divide(conv_dim, tp, f"the conv width ({conv_dim} after padding the groups)"), geometry["conv_kernel"] - 1)
    ssm = (local_heads, state_size, head_dim) if mixer == GDN else (local_heads, head_dim, state_size)
    return StateShape((conv,), ssm, model.dtype, ssm_dtype)


def sconv_state_shape(model: ModelSpec, serving: Serving) -> StateShape:
    """One layer's short-conv state in one slot on this rank (``InklingModelConfig.mamba2_cache_params``).

    Six conv windows of ``sconv_kernel_size - 1`` rows, window axis first: two over the full-attention KV width
    (``max(1, num_key_value_heads // attn_tp) x head_dim``), two over the SWA KV width, two over the hidden stream
    (SGLang's scattered sconv, which shards the stream, is off by default and not modelled); no temporal state.
    The dtype is bf16 whatever the model's (``InklingStateDType``).
    """
    g = model.params["sconv"]
    tp = serving.attn_tp_size
    window = g["kernel"] - 1
    full = max(1, g["num_kv_heads"] // tp) * g["head_dim"]
    swa = max(1, g["swa_num_kv_heads"] // tp) * g["swa_head_dim"]
    stream = g["hidden_size"]
    conv = tuple((window, width) for width in (full, full, swa, swa, stream, stream))
    return StateShape(conv, (0, 0, 0), SCONV_DTYPE, SCONV_DTYPE, conv_window_first=True)


def state_layer_ids(model: ModelSpec) -> list[int]:
    """Global ids of every layer with a recurrent state (SGLang's ``mamba2_cache_params.layers``; an Inkling-class
    model's short-conv state is on every layer, ``conv_layer_ids``)."""
    if model.params.get("mixer") == SCONV:
        return [layer.index for layer in model.layers]
    return [layer.index for layer in model.layers if layer.kind in STATE_KINDS]


def rank_state_layer_ids(model: ModelSpec, serving: Serving) -> list[int]:
    start, end = rank_layer_range(model, serving)
    return [i for i in state_layer_ids(model) if start <= i < end]


def rank_full_attention_layers(model: ModelSpec, serving: Serving) -> tuple[LayerSpec, ...]:
    """This rank's layers with attention KV, in order (their ``index`` is the global layer id)."""
    start, end = rank_layer_range(model, serving)
    return tuple(layer for layer in model.layers[start:end] if layer.kind in KV_KINDS)


def state_bytes_per_slot(model: ModelSpec, serving: Serving) -> int:
    """What one state slot holds on this rank: every local state layer's conv and SSM state."""
    return state_shape(model, serving).bytes * len(rank_state_layer_ids(model, serving))


def sglang_stage_per_req(model: ModelSpec, serving: Serving) -> int:
    """SGLang's per-slot charge: ``mamba_cache_per_req`` scaled to the *largest* pipeline stage's share.

    ``int(total x (max_stage_layers / all_layers))`` in float, as
    ``_handle_max_mamba_cache`` computes it, so every rank derives the same
    ``max_mamba_cache_size`` without a collective.
    """
    total = state_shape(model, serving).bytes * len(state_layer_ids(model))
    return int(total * largest_stage_share(model, serving))


def largest_stage_share(model: ModelSpec, serving: Serving) -> float:
    """``pp_layer_scale`` of ``_handle_max_mamba_cache``: the largest stage's state layers / all state layers."""
    layers = state_layer_ids(model)
    if serving.pp_size > 1 and layers:
        largest = max(
            sum(1 for i in layers if start <= i < end)
            for start, end in (
                pp_layer_range(model.num_layers, rank, serving.pp_size, serving.pp_layer_partition)
                for rank in range(serving.pp_size)
            )
        )
    else:
        largest = len(layers)
    return largest / max(len(layers), 1)


def _divide(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise UnsupportedCombinationError(
            f"The recurrent state cannot be sharded over TP {tp}: {what} is {value}, not a multiple of {tp}. "
            f"Use a {option('tp_size')} (attention TP) that divides it."
        )
    return value // tp
