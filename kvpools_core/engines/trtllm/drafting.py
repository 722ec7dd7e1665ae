"""TensorRT-LLM 1.2's draft KV cache for a separate draft model: Eagle3 (one-model and two-model) and
draft/target speculative decoding (``speculative_config`` ``decoding_type: Eagle3 | Eagle | Draft_Target`` with
``speculative_model_dir``), as ``--accounting trtllm`` plans it.  One-model MTP (the checkpoint's own layers) is
:func:`kvpools_core.engines.trtllm.deployment._mtp_layers`; both end in the same two-manager arithmetic of
:func:`~kvpools_core.engines.trtllm.deployment.plan_trtllm`.

What TensorRT-LLM does (``docs/trtllm.md`` cites the commits):

- **Which manager holds the draft's KV.**  A one-model drafter (``eagle3_one_model: true``, TensorRT-LLM's default)
  gets a KV cache manager of its own (``KvCacheCreator._should_create_separate_draft_kv_cache``:
  ``should_use_separate_draft_kv_cache`` = ``use_one_engine() and _allow_separate_draft_kv_cache``, a
  ``PrivateAttr(True)`` of ``DecodingBaseConfig``), built by ``_create_one_model_draft_kv_cache_manager`` from the
  draft checkpoint's config (``_get_effective_draft_config``) with ``num_layers = get_num_spec_layers(spec)``.  A
  two-model drafter (``eagle3_one_model: false``, ``Draft_Target``) runs a second ``PyTorchModelEngine`` (same
  ``mapping``, ``max_draft_len`` 0) whose manager ``_create_kv_cache_manager(draft_model_engine)`` sizes every
  layer of the draft checkpoint.
- **How many layers.**  In 1.2, ``get_num_spec_layers`` answers ``num_eagle_layers`` for Eagle3 one-model, which
  ``EagleDecodingConfig.validate_eagle_config`` sets to ``max_draft_len``: the draft manager holds
  ``max_draft_len`` layers of the draft's layout however many the checkpoint has (NVIDIA/TensorRT-LLM PR #12188:
  "EAGLE3: config says 1 layer, runtime uses 4", March 2026; PR #15017, June 2026, counts the checkpoint's layers
  instead, calling this count an over-allocation).  kvpools plans the code between those two PRs, the window of
  the 1.2.1 release (April 2026), not a pinned release tag.
- **The budget.**  ``_get_kv_size_per_token`` adds the draft manager's ``get_cache_size_per_token`` to the target's
  before dividing: one ``kv_cache_config.max_tokens`` for both managers on the V1 single-window path (PR #14373:
  V1 non-VSWA splits "implicitly using a single max_num_tokens value"); the draft claims no budget of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from kvpools_core.engines.trtllm.manager import trtllm_layers
from kvpools_core.errors import ConfigError, UnsupportedCombinationError, short_repr
from kvpools_core.models import launch_model_path, load_model, served_model
from kvpools_core.options import option
from kvpools_core.parts.trtllm import TrtllmLayer
from kvpools_core.registry import Registry
from kvpools_core.values import ModelSpec, Serving

DECODING_TYPES = {"Eagle3": "Eagle3", "Eagle": "Eagle", "Draft_Target": "Draft_Target", "DraftTarget": "Draft_Target"}
"""``speculative_config.decoding_type`` values this module plans, and how the YAML spells each
(``llmapi/llm_args.py``: ``Eagle3DecodingConfig`` ``Literal["Eagle3"]``, ``EagleDecodingConfig`` ``Literal["Eagle"]``
-- Eagle3 on the PyTorch backend -- and ``DraftTargetDecodingConfig`` ``Literal["Draft_Target"]``)."""

EAGLE3_ONE_MODEL = "eagle3_one_model"
EAGLE3_TWO_MODEL = "eagle3_two_model"
DRAFT_TARGET = "draft_target"

DRAFT_OPTIONS = ("decoding_type", "speculative_model_dir", "max_draft_len", "eagle3_one_model")
"""The ``plan_trtllm`` / CLI options (TensorRT-LLM's ``speculative_config`` field names) this module reads."""


@attrs.frozen(kw_only=True)
class Drafting:
    """A separate draft model's KV cache as TensorRT-LLM 1.2 sizes it."""

    decoding_type: str
    """As the ``--extra_llm_api_options`` YAML spells it (``Eagle3``, ``Eagle``, ``Draft_Target``)."""
    mode: str
    """``eagle3_one_model`` (the draft's layers in a one-model engine), ``eagle3_two_model`` or ``draft_target``
    (a second engine)."""
    max_draft_len: int
    draft: ModelSpec
    draft_ref: str
    """``speculative_model_dir`` as the launch line names it."""
    draft_plugin: str
    layers: tuple[TrtllmLayer, ...]
    """The draft manager's layers, indexed after the target's."""

    @property
    def one_model(self) -> bool:
        return self.mode == EAGLE3_ONE_MODEL

    @property
    def extra_tokens_per_request(self) -> int:
        """KV tokens a drafting request holds beyond its own.  One-model: ``get_num_extra_kv_tokens`` =
        ``max_draft_len - 1`` (``use_one_engine``) plus the ``max_draft_len`` draft tokens a generation step adds
        (``KVCacheManager.prepare_resources``).  Two-model: 0 extra KV tokens (not one engine) plus the
        ``max_draft_len`` draft tokens the target verifies; kvpools counts the same for the draft engine's manager,
        whose autoregressive drafting writes up to ``max_draft_len`` tokens past the accepted ones."""
        return (self.max_draft_len - 1) + self.max_draft_len if self.one_model else self.max_draft_len

    def speculative_config(self) -> dict[str, Any]:
        """The ``speculative_config`` of the ``--extra_llm_api_options`` YAML."""
        config: dict[str, Any] = {
            "decoding_type": self.decoding_type,
            "max_draft_len": self.max_draft_len,
            "speculative_model_dir": self.draft_ref,
        }
        if self.mode != DRAFT_TARGET:
            config["eagle3_one_model"] = self.one_model
        return config

    def note(self) -> str:
        layers = len(self.layers)
        if self.one_model:
            where = (
                f"Eagle3 one-model: the draft's {layers} layer(s) (get_num_spec_layers = num_eagle_layers = "
                f"max_draft_len {self.max_draft_len} in TensorRT-LLM 1.2, whatever {self.draft.name} has: "
                f"{self.draft.num_layers}) get a KV cache manager of their own"
            )
        else:
            where = (
                f"{'Eagle3 two-model' if self.mode == EAGLE3_TWO_MODEL else 'draft/target'}: the draft engine "
                f"({self.draft.name}, {layers} layer(s)) has a KV cache manager of its own"
            )
        return (
            f"{where}; TensorRT-LLM adds its bytes per token to the target's before dividing the budget, and both "
            "managers take that one max_tokens, so the draft does not claim a budget of its own; each request "
            f"holds blocks in both pools and {self.extra_tokens_per_request} extra token(s)."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "decoding_type": self.decoding_type,
            "mode": self.mode,
            "max_draft_len": self.max_draft_len,
            "speculative_model_dir": self.draft_ref,
            "draft_model": self.draft.name,
            "draft_plugin": self.draft_plugin,
            "draft_layers": len(self.layers),
            "extra_tokens_per_request": self.extra_tokens_per_request,
        }


def _flag(name: str) -> str:
    return f"--{name}"


def resolve_drafting(
    *,
    spec: ModelSpec,
    layers: Sequence[TrtllmLayer],
    serving: Serving,
    registry: Registry,
    decoding_type: str | None,
    speculative_model_dir: str | ModelSpec | None,
    max_draft_len: int | None,
    eagle3_one_model: bool | None,
    num_nextn_predict_layers: int | None,
    max_attention_window: object,
    enable_attention_dp: bool,
    host_cache_size: object,
) -> Drafting | None:
    """The separate draft model ``speculative_config`` describes, or None without one.

    Refused with TensorRT-LLM's reason where it refuses (no ``speculative_model_dir``, no ``max_draft_len``,
    Medusa on the PyTorch backend), and "kvpools does not model X yet" for what it accepts and kvpools does not
    reproduce: other decoding types, drafting over pipeline stages, beside attention windows, beside a hybrid or a
    DeepSeek sparse attention target, an Eagle3 one-model draft with attention DP (its layers then join the
    target's manager), and the host cache (TensorRT-LLM splits ``host_cache_size`` between the two managers).
    """
    given = {
        name: value
        for name, value in (
            ("speculative_model_dir", speculative_model_dir),
            ("max_draft_len", max_draft_len),
            ("eagle3_one_model", eagle3_one_model),
        )
        if value is not None
    }
    if decoding_type is None:
        if given:
            raise ConfigError(
                f"{', '.join(_flag(name) for name in given)} describe(s) a speculative_config: pass "
                f"{_flag('decoding_type')} Eagle3 (or Eagle, Draft_Target) too."
            )
        return None
    kind = DECODING_TYPES.get(str(decoding_type))
    if kind is None:
        if str(decoding_type).upper() == "MTP":
            raise ConfigError(
                f"{_flag('decoding_type')} MTP runs the checkpoint's own MTP layers: pass "
                f"{_flag('num_nextn_predict_layers')} N instead."
            )
        if str(decoding_type) == "Medusa":
            raise UnsupportedCombinationError(
                "TensorRT-LLM refuses Medusa on the PyTorch backend (MedusaDecodingConfig.supports_backend is False "
                "for pytorch), which trtllm-serve --backend pytorch runs: use Eagle3 or Draft_Target."
            )
        raise UnsupportedCombinationError(
            f"kvpools does not model speculative_config decoding_type {short_repr(decoding_type)} for --accounting "
            "trtllm yet: it models Eagle3 / Eagle and Draft_Target (a separate draft model's KV cache) and MTP "
            f"({_flag('num_nextn_predict_layers')})."
        )
    if num_nextn_predict_layers:
        raise ConfigError(
            f"{_flag('num_nextn_predict_layers')} and {_flag('decoding_type')} {decoding_type} are two "
            "speculative_configs; TensorRT-LLM takes one. Drop one of them."
        )
    if speculative_model_dir is None:
        raise ConfigError(
            f"TensorRT-LLM refuses {kind} without a draft model ('Draft model must be provided for EAGLE', "
            f"'speculative_model must be specified for DraftTarget'): pass {_flag('speculative_model_dir')} "
            "(a preset, a config.json or a directory holding one)."
        )
    if max_draft_len is None:
        raise ConfigError(
            f"TensorRT-LLM refuses {kind} without max_draft_len ('max_draft_len must be > 0 for "
            f"{'Eagle' if kind != 'Draft_Target' else 'DraftTarget'}'): pass {_flag('max_draft_len')} N."
        )
    if isinstance(max_draft_len, bool) or not isinstance(max_draft_len, int) or max_draft_len <= 0:
        raise ConfigError(f"{_flag('max_draft_len')} must be a positive integer, got {short_repr(max_draft_len)}.")
    if kind == "Draft_Target" and eagle3_one_model is not None:
        raise ConfigError(
            f"{_flag('eagle3_one_model')} is EagleDecodingConfig's; Draft_Target always runs a second engine. Drop it."
        )
    mode = (
        DRAFT_TARGET if kind == "Draft_Target" else EAGLE3_TWO_MODEL if eagle3_one_model is False else EAGLE3_ONE_MODEL
    )
    what = {EAGLE3_ONE_MODEL: "Eagle3 one-model", EAGLE3_TWO_MODEL: "Eagle3 two-model", DRAFT_TARGET: "draft/target"}[
        mode
    ]
    if serving.pp_size > 1:
        raise UnsupportedCombinationError(
            f"kvpools does not model the {what} draft KV cache over pipeline stages ({option('pp_size')} "
            f"{serving.pp_size}) for --accounting trtllm yet: TensorRT-LLM puts one-model draft layers on the last "
            "stage and splits a draft engine's layers by the same mapping. Plan with --pp-size 1."
        )
    if max_attention_window is not None or any(layer.sliding_window for layer in layers):
        raise UnsupportedCombinationError(
            f"kvpools does not model the {what} draft KV cache beside attention windows ({spec.name}) for "
            "--accounting trtllm yet: TensorRT-LLM then splits max_gpu_total_bytes between target and draft "
            "(_split_kv_cache_budget_for_draft, NVIDIA/TensorRT-LLM PR #12855)."
        )
    if any(layer.state is not None for layer in layers) or any(layer.indexer_bytes for layer in layers):
        manager = "hybrid" if any(layer.state is not None for layer in layers) else "DeepSeek sparse attention"
        raise UnsupportedCombinationError(
            f"kvpools does not model the {what} draft KV cache beside {spec.name}'s {manager} cache manager for "
            "--accounting trtllm yet (TensorRT-LLM sizes the draft's estimate with the target's manager class)."
        )
    if enable_attention_dp and mode == EAGLE3_ONE_MODEL:
        raise UnsupportedCombinationError(
            "kvpools does not model Eagle3 one-model with --enable_attention_dp for --accounting trtllm yet: "
            "TensorRT-LLM then creates no separate draft KV cache and appends the draft layers, with the draft's KV "
            "heads, to the target's manager (_build_per_layer_num_kv_heads). Drop --enable_attention_dp, or pass "
            f"{_flag('eagle3_one_model')} false."
        )
    if host_cache_size is not None:
        raise UnsupportedCombinationError(
            f"kvpools does not model the host cache beside the {what} draft KV cache for --accounting trtllm yet: "
            "TensorRT-LLM splits host_cache_size between the target's and the draft's managers "
            "(_split_kv_cache_budget_for_draft). Drop --host_cache_size."
        )
    if isinstance(speculative_model_dir, ModelSpec):
        draft, plugin, ref = speculative_model_dir, "given ModelSpec", speculative_model_dir.name
    else:
        draft, plugin = load_model(str(speculative_model_dir), registry)
        ref = launch_model_path(str(speculative_model_dir), registry)
    draft = served_model(draft, serving)
    if draft.dtype not in ("bfloat16", "float16") and serving.kv_cache_dtype == "auto":
        raise UnsupportedCombinationError(
            f"The draft {draft.name}'s dtype is {draft.dtype}: kvpools models TensorRT-LLM's half-precision "
            "(bf16/fp16), fp8 and nvfp4 KV caches only; pass --kv-cache-dtype."
        )
    answered = trtllm_layers(draft, serving, registry)
    kv = [layer for layer in answered if layer.has_kv]
    if not kv or len(kv) != len(answered) or any(layer.sliding_window or layer.indexer_bytes for layer in kv):
        raise UnsupportedCombinationError(
            f"kvpools does not model the draft {draft.name} for --accounting trtllm yet: it plans draft models whose "
            "every layer is full attention (MHA/GQA or MLA) in one KVCacheManager."
        )
    offset = spec.num_layers
    if mode == EAGLE3_ONE_MODEL:
        # _create_one_model_draft_kv_cache_manager(num_layers=get_num_spec_layers(spec)) = max_draft_len layers of
        # the draft config's layout (num_key_value_heads, head_dim).
        draft_layers = tuple(attrs.evolve(kv[0], index=offset + i) for i in range(max_draft_len))
    else:
        # _create_kv_cache_manager(draft_model_engine): every layer of the draft checkpoint.
        draft_layers = tuple(attrs.evolve(layer, index=offset + i) for i, layer in enumerate(kv))
    return Drafting(
        decoding_type=kind,
        mode=mode,
        max_draft_len=max_draft_len,
        draft=draft,
        draft_ref=ref,
        draft_plugin=plugin,
        layers=draft_layers,
    )


__all__ = [
    "DECODING_TYPES",
    "DRAFT_OPTIONS",
    "DRAFT_TARGET",
    "EAGLE3_ONE_MODEL",
    "EAGLE3_TWO_MODEL",
    "Drafting",
    "resolve_drafting",
]
