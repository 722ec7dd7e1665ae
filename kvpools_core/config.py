"""Reading model configs: presets, files, directories, and typed, bounded field access.

``read_config_file`` reads what the user pointed at (a ``config.json`` or a
directory holding one); :mod:`kvpools_core.models` asks the architecture plugins
to claim it.  ``ConfigReader`` gives plugins typed access whose errors name the
field and the file.

Every count a config gives is bounded (:data:`FIELD_LIMITS`): plugins build
one object per layer and multiply counts into byte sizes, so an absurd value
(``num_hidden_layers: 1e30``) must be refused with a message naming the field,
not loop for ever or overflow a float somewhere in sizing.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from kvpools_core.errors import ConfigError, short_repr

if TYPE_CHECKING:
    pass

_MISSING = object()


@attrs.frozen
class Limit:
    """The largest value kvpools accepts for one kind of count, and what errors call that kind."""

    kind: str
    maximum: int


# Generous but finite: far above any real model, low enough that a plan of a model at every bound
# still takes well under a second and its byte arithmetic stays exact (ints) and finite (floats).
LAYERS = Limit("layer count", 10_000)
"""Layers, layer-pattern lengths and layer periods: real decoders have < 200 layers; every layer
becomes a ``LayerSpec``, and planning 10,000 of them takes ~0.1 s (100,000 would take ~1 s)."""
HEADS = Limit("head count", 65_536)
"""Attention, KV, indexer and state heads, and state groups: real models have <= 128."""
DIM = Limit("dimension", 1 << 20)
"""Hidden sizes, head dims, latent ranks, state and conv sizes: real ones are <= ~32,768.  The default."""
TOKENS = Limit("token count", 1 << 31)
"""Context lengths, sliding windows and top-k: real contexts are <= 10M tokens (Llama 4 Scout)."""
MULTIPLIER = Limit("multiplier", 1024)
"""Expansion factors (``mamba_expand``, 2 in real configs)."""

FIELD_LIMITS: Mapping[str, Limit] = MappingProxyType(
    {
        **dict.fromkeys(
            (
                "num_hidden_layers",
                "num_nextn_predict_layers",
                "mtp_num_hidden_layers",
                "num_kv_shared_layers",
                "max_window_layers",
                "sliding_window_pattern",
                "_sliding_window_pattern",
                "full_attention_interval",
                "attn_layer_period",
                "attn_layer_offset",
            ),
            LAYERS,
        ),
        **dict.fromkeys(
            (
                "num_attention_heads",
                "num_key_value_heads",
                "n_head_kv",
                "num_kv_heads",
                "multi_query_group_num",
                "num_attention_groups",
                "swa_num_key_value_heads",
                "num_global_key_value_heads",
                "index_n_heads",
                "linear_num_key_heads",
                "linear_num_value_heads",
                "mamba_num_heads",
                "mamba_n_heads",
                "num_heads",
                "n_groups",
                "mamba_n_groups",
            ),
            HEADS,
        ),
        **dict.fromkeys(
            (
                "max_position_embeddings",
                "n_positions",
                "max_seq_len",
                "seq_length",
                "max_sequence_length",
                "model_max_length",
                "sliding_window",
                "sliding_window_size",
                "index_topk",
            ),
            TOKENS,
        ),
        "mamba_expand": MULTIPLIER,
    }
)
"""The bound of each count field kvpools reads, by field name; any other integer field is a :data:`DIM`."""

MAX_CONFIG_BYTES = 16 << 20
"""Real ``config.json`` files are kilobytes; a bigger file is not a model config (and is not read into memory)."""


def limit_for(key: str) -> Limit:
    """The bound of a field (by its name, whatever object it is nested in)."""
    return FIELD_LIMITS.get(key, DIM)


def describe(value: Any) -> str:
    """A short ``repr`` of a config value for an error message (a pasted list can be long)."""
    return short_repr(value)


class ConfigReader:
    """Typed, bounded, error-naming access to a ``config.json`` mapping.

    Multimodal wrappers keep the language model under ``text_config``;
    :meth:`text` returns a reader of that part (or of the whole config), and
    :meth:`child` one of any nested object, whose errors name the full path
    (``'text_config.sparse_attention_config.sparse_index_dim'``).  Every typed
    read rejects a value of the wrong JSON type with the type expected; counts
    are bounded by :func:`limit_for`.  Booleans are not integers, and neither
    are floats such as ``32.0`` (Hugging Face configs never write counts so).
    """

    def __init__(self, config: Mapping[str, Any], source: str, prefix: str = "") -> None:
        self.config = config
        self.source = source
        self.prefix = prefix

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value (``default`` when absent or null); prefer the typed readers below."""
        value = self.config.get(key)
        return default if value is None else value

    def text(self) -> ConfigReader:
        """The reader of ``text_config`` when the config nests one, else this reader."""
        if self.config.get("text_config") is None:
            return self
        return self.child("text_config")

    def child(self, key: str, fix: str = "Fix the config.") -> ConfigReader:
        """A reader of the nested object ``key`` (which must be present and an object)."""
        value = self.config.get(key)
        if not isinstance(value, Mapping):
            raise self.error(key, "is missing" if value is None else f"must be an object, got {describe(value)}", fix)
        return ConfigReader(value, self.source, prefix=f"{self.prefix}{key}.")

    def field(self, key: str) -> str:
        """The quoted path of a field as errors name it: ``'text_config.num_hidden_layers'``."""
        return repr(f"{self.prefix}{key}")

    def error(self, key: str, problem: str, fix: str) -> ConfigError:
        return ConfigError(f"{self.source}: field {self.field(key)} {problem}. {fix}")

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int = 1, limit: Limit | None = None) -> int:
        """An integer in ``[minimum, limit.maximum]``; ``default`` (trusted, unchecked) when absent or null."""
        value = self.config.get(key)
        if value is None:
            if default is _MISSING:
                where = repr(self.prefix[:-1]) if self.prefix else "the config"
                raise self.error(key, "is missing", f"Add {key!r} (an integer >= {minimum}) to {where}.")
            return int(default)
        return self._check_integer(key, value, minimum=minimum, limit=limit)

    def optional_integer(self, key: str, *, minimum: int = 1, limit: Limit | None = None) -> int | None:
        return None if self.config.get(key) is None else self.integer(key, minimum=minimum, limit=limit)

    def _check_integer(self, key: str, value: Any, *, minimum: int = 1, limit: Limit | None = None) -> int:
        """``value`` (read from ``key``) as a bounded integer, or the error naming ``key``."""
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            fix = (
                "Write it as a whole number, without a decimal point."
                if isinstance(value, float) and value.is_integer()
                else "Fix the value in the config."
            )
            raise self.error(key, f"must be an integer >= {minimum}, got {describe(value)}", fix)
        bound = limit or limit_for(key)
        if value > bound.maximum:
            raise self.error(
                key,
                f"is {describe(value)}, above {bound.maximum:,}, kvpools' bound for a {bound.kind}",
                "Fix the value in the config; no real model comes near the bound.",
            )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {describe(value)}", "Fix the value in the config.")
        return value

    def string(self, key: str, default: str = "") -> str:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {describe(value)}", "Fix the value in the config.")
        return value

    def string_list(
        self, key: str, *, choices: Collection[str] | None = None, limit: Limit | None = None
    ) -> tuple[str, ...]:
        """A list of strings (empty when absent): at most ``limit.maximum``, each one of ``choices`` if given."""
        value = self.config.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"must be a list of strings, got {describe(value)}", "Fix the value in the config.")
        self._check_length(key, value, limit)
        if choices is not None:
            unknown = sorted(set(value) - set(choices))
            if unknown:
                raise self.error(
                    key,
                    f"has unknown entr{'y' if len(unknown) == 1 else 'ies'} {describe(unknown)}",
                    f"Use {', '.join(map(repr, sorted(choices)))}.",
                )
        return tuple(value)

    def integer_list(
        self,
        key: str,
        *,
        minimum: int = 0,
        maximum: int,
        limit: Limit = LAYERS,
        fix: str = "Fix the value in the config.",
    ) -> tuple[int, ...]:
        """A list of integers in ``[minimum, maximum]`` (at most ``limit.maximum`` of them); empty when absent."""
        value = self.config.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= maximum for v in value
        ):
            raise self.error(
                key,
                f"must be a list of integers from {minimum} to {maximum}, got {describe(value)}",
                fix,
            )
        self._check_length(key, value, limit)
        return tuple(value)

    def _check_length(self, key: str, value: list[Any], limit: Limit | None) -> None:
        bound = limit or LAYERS
        if len(value) > bound.maximum:
            raise self.error(
                key,
                f"has {len(value):,} entries, above {bound.maximum:,}, kvpools' bound for a {bound.kind}",
                "Fix the value in the config.",
            )


def context_length(reader: ConfigReader, keys: tuple[str, ...]) -> int:
    """The first of ``keys`` the config states (each family has its own order), as a bounded token count."""
    for key in keys:
        if reader.has(key):
            return reader.integer(key)
    raise reader.error(
        "max_position_embeddings", "is missing", "Add it (the model's context length in tokens) to the config."
    )


def model_dtype(reader: ConfigReader, *, float32_served_as: str = "float16") -> str:
    """The dtype SGLang serves a config in under ``--dtype auto``.

    The config's ``torch_dtype`` (or newer ``dtype``); bf16 when absent; a
    float32 checkpoint is served in ``float32_served_as``: float16, but bfloat16 for the families SGLang's
    ``_get_and_verify_dtype`` names (Gemma: its plugins pass it), so
    ``--kv-cache-dtype auto`` follows them.  ``--dtype`` overrides it
    (:func:`kvpools_core.models.served_model`).
    """
    from kvpools_core.dtypes import MODEL_DTYPES

    for key in ("torch_dtype", "dtype"):
        if not reader.has(key):
            continue
        value = reader.string(key)
        name = value.removeprefix("torch.")
        name = {
            "bf16": "bfloat16",
            "fp16": "float16",
            "half": "float16",
            "float": "float32",
            "fp32": "float32",
        }.get(name, name)
        if name not in MODEL_DTYPES:
            raise reader.error(
                key,
                f"is {describe(value)}",
                f"kvpools knows the model dtypes {', '.join(MODEL_DTYPES)}; fix the config.",
            )
        if name == "float32":
            # SGLang's _get_and_verify_dtype: float32 checkpoints are served in float16 (Gemma's in bfloat16)
            return float32_served_as
        return name
    return "bfloat16"


# ---------------------------------------------------------------------------
# facts about Hugging Face configs that more than one architecture reads
# ---------------------------------------------------------------------------


def derived_head_dim(reader: ConfigReader, num_heads: int) -> int:
    """``hidden_size / num_attention_heads`` when a config states no ``head_dim`` (transformers' default)."""
    hidden = reader.integer("hidden_size")
    if hidden % num_heads:
        raise reader.error(
            "head_dim",
            f"is missing and hidden_size {hidden} is not divisible by num_attention_heads {num_heads}",
            "Add head_dim to the config.",
        )
    return hidden // num_heads


def grouped_kv_heads(
    reader: ConfigReader,
    num_heads: int,
    keys: tuple[str, ...] = ("num_key_value_heads",),
    heads_key: str = "num_attention_heads",
) -> int:
    """The KV heads of the first of ``keys`` the config states (``num_heads`` when none: plain MHA), which
    must divide ``num_heads``: grouped-query attention gives every KV head the same number of query heads
    (transformers groups them by ``num_attention_heads // num_key_value_heads``, vLLM's ``Attention`` asserts
    the division, and SGLang's kernels index the groups so)."""
    key = next((key for key in keys if reader.has(key)), None)
    if key is None:
        return num_heads
    kv_heads = reader.integer(key)
    if num_heads % kv_heads:
        divisors = [d for d in range(min(num_heads, kv_heads), 0, -1) if num_heads % d == 0][:2]
        raise reader.error(
            key,
            f"is {kv_heads}, which does not divide {heads_key} {num_heads}: grouped-query attention shares each "
            f"KV head among the same number of query heads (num_attention_heads % num_key_value_heads == 0, as "
            f"vLLM and SGLang require)",
            f"Fix the config: a divisor of {num_heads} such as {' or '.join(map(str, divisors))}.",
        )
    return kv_heads


def sliding_window_active(reader: ConfigReader) -> bool:
    """A ``sliding_window`` counts unless ``use_sliding_window`` is false (Qwen2-style inert field).

    Dense plugins decline exactly the configs this says slide, and sliding-window plugins claim them.
    """
    return reader.has("sliding_window") and reader.boolean("use_sliding_window", True)


DSA_ARCHITECTURES = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGenerationNextN",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
    }
)
"""``is_deepseek_dsa``'s architectures (SGLang 0.5.23 ``configs/model_config.py``): DSA when the config also sets
``index_topk``."""

DSV4_ARCHITECTURES = frozenset({"DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV41ForCausalLM"})
"""DeepSeek-V4 compressed attention: another family (``is_deepseek_v4``).  ``DeepseekV41ForCausalLM`` is
DeepSeek-V4.1's own name: vLLM 0.33's model class, which SGLang 0.5.23 rewrites to ``DeepseekV4ForCausalLM`` for a
``deepseek_v41`` config (``configs/deepseek_v41.py`` ``normalize_deepseek_v41_config``)."""


def first_architecture(outer: ConfigReader) -> str | None:
    """``architectures[0]`` of the top-level config (``None`` when it lists none), which SGLang dispatches on."""
    architectures = outer.string_list("architectures")
    return architectures[0] if architectures else None


def is_deepseek_dsa(outer: ConfigReader) -> bool:
    """SGLang's ``is_deepseek_dsa``: a DSA architecture with ``index_topk`` set (top level or ``text_config``)."""
    if first_architecture(outer) not in DSA_ARCHITECTURES:
        return False
    return outer.has("index_topk") or outer.text().has("index_topk")


def is_deepseek_v4(outer: ConfigReader) -> bool:
    """SGLang's ``is_deepseek_v4``: DeepSeek-V4's compressed attention, a family of its own."""
    return first_architecture(outer) in DSV4_ARCHITECTURES


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a ``config.json`` (UTF-8 JSON holding an object); errors name the file and the fix."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"Model config {path} is {size:,} bytes; a config.json is kilobytes (kvpools reads at most "
                f"{MAX_CONFIG_BYTES:,}). Point MODEL at the model's config.json."
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"Cannot read model config {path}: {exc.strerror or exc}.") from exc
    try:
        text = raw.decode("utf-8-sig")  # JSON is UTF-8; tolerate the byte-order mark some editors write
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"Model config {path} is not UTF-8 text (byte {exc.start}: {exc.reason}). A config.json is UTF-8 JSON: "
            f"re-save it as UTF-8, or point MODEL at another config."
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"Model config {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}). "
            f"Fix the file or point MODEL at another config."
        ) from exc
    except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits, or arrays nested thousands deep
        raise ConfigError(
            f"Model config {path} cannot be read as a model config ({type(exc).__name__}: {exc}). "
            f"Fix the file or point MODEL at another config."
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"Model config {path} must hold a JSON object, got {type(data).__name__}.")
    return data


HF_ID_KEY = "_hf_id"
"""The preset key naming the Hugging Face model id its config was taken from: what an engine loads for it."""

WEIGHTS_CONFIG_KEY = "_weights_config"
"""A preset's pointer to the complete ``config.json`` it was excerpted from (a path beside the preset).

Presets keep only what the KV cache needs; the weights estimate reads the
complete config this key names, so ``estimate_weights("llama-3.1-8b")`` and
``kvpools plan llama-3.1-8b --gpu h100`` need no ``--weights-memory``.
"""
