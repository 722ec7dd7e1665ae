"""Exact weights from a local checkpoint's safetensors headers, sharded by the estimate's rules.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming every tensor with
its ``dtype``, ``shape`` and ``data_offsets`` (the format's specification, huggingface/safetensors README,
"Format"); :func:`read_headers` reads those headers only (never the tensor data) from ``model.safetensors`` or
from every shard ``model.safetensors.index.json`` lists.  :func:`exact_weights` then replaces an estimate's
byte counts by the checkpoint's own: each tensor of the headers is matched by name to the tensor of the
architecture's layout (:class:`~kvpools_core.parts.weights.tensors.Builder`) that holds it, and takes that
tensor's share on the rank (TP split, experts over EP, the pipeline stage, MTP left out).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from pathlib import Path

import attrs

from kvpools_core.errors import ConfigError
from kvpools_core.options import option

__all__ = [
    "HEADER_DTYPE_BYTES",
    "ExactWeights",
    "HeaderTensor",
    "Share",
    "exact_weights",
    "find_safetensors",
    "read_headers",
]

HEADER_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "U64": 8,
    "I32": 4,
    "U32": 4,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}
"""Bytes of one element of each safetensors ``dtype`` (safetensors' ``Dtype`` enum)."""

FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})
"""Header dtypes the engine casts to the served dtype when it loads an unquantised weight."""

_MAX_HEADER = 100 << 20  # the safetensors reader refuses headers over 100 MB too (``MAX_HEADER_SIZE``)
_EXPERT = re.compile(r"\.experts\.\d+\.")


@attrs.frozen
class HeaderTensor:
    """One tensor as a safetensors header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def find_safetensors(directory: Path) -> list[Path] | None:
    """The safetensors files of a checkpoint directory: the shards ``model.safetensors.index.json`` lists, or
    ``model.safetensors``; None when the directory holds neither."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{index}: cannot read its 'weight_map' ({exc}); fix or remove the index, or pass "
                f"{option('weights_memory')}."
            ) from None
        if not isinstance(weight_map, Mapping):
            raise ConfigError(
                f"{index}: 'weight_map' is not a mapping; fix the index or pass {option('weights_memory')}."
            )
        return [directory / name for name in sorted(set(map(str, weight_map.values())))]
    single = directory / "model.safetensors"
    return [single] if single.is_file() else None


def read_headers(files: list[Path]) -> list[HeaderTensor]:
    """Every tensor the safetensors ``files`` describe, from their headers alone."""
    tensors: list[HeaderTensor] = []
    for path in files:
        tensors.extend(_read_header(path))
    return tensors


def _read_header(path: Path) -> list[HeaderTensor]:
    def bad(why: str) -> ConfigError:
        return ConfigError(
            f"{path}: not a readable safetensors file ({why}); fix the checkpoint or pass {option('weights_memory')}."
        )

    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise bad("shorter than its 8-byte header length")
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER:
                raise bad(f"a header of {length} B")
            raw = handle.read(length)
    except OSError as exc:
        raise bad(exc.strerror or str(exc)) from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"its header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = str(entry["dtype"]), tuple(int(d) for d in entry["shape"])
            size = HEADER_DTYPE_BYTES[dtype]
        except (KeyError, TypeError, ValueError):
            raise bad(f"tensor {name!r} has no known dtype and shape: {entry!r}") from None
        offsets = entry.get("data_offsets")
        nbytes = math.prod(shape) * size
        if isinstance(offsets, list) and len(offsets) == 2:
            nbytes = int(offsets[1]) - int(offsets[0])
        tensors.append(HeaderTensor(name, dtype, shape, nbytes))
    return tensors


@attrs.frozen
class Share:
    """How much of one layout tensor a rank holds: ``rank`` of ``total`` parameters (0 off the stage or MTP),
    and the element size of a tensor that keeps a dtype of its own."""

    rank: int
    total: int
    element_bytes: int | None = None
    quantised_bytes: int | None = None
    """The bytes of all ``total`` parameters when the engine quantises the tensor at load (``--quantization``)."""


@attrs.frozen
class ExactWeights:
    """The checkpoint's bytes, one rank's, and what could not be matched to the layout."""

    bytes_total: int
    bytes_per_rank: int
    parameters: int
    tensors: int
    unmatched: tuple[str, ...]
    unmatched_bytes: int


def exact_weights(tensors: list[HeaderTensor], shares: Mapping[str, Share], served_bytes: int) -> ExactWeights:
    """The bytes of the checkpoint ``tensors`` and of one rank, each tensor sharded as the layout tensor it
    belongs to (``shares``, by Hugging Face module name).

    A header name ``<module>.weight`` (or ``<module>`` itself: biases, ``A_log``, correction biases) is the
    layout tensor's own weight: an unquantised float one loads in the served dtype (``served_bytes`` an element:
    the engine casts it), unless the layout keeps it in a dtype of its own, or the engine quantises it at load
    (its share of the layout tensor's quantised bytes). Any other suffix (``weight_scale_inv``,
    ``weight_scale``, ``input_scale``, ``qweight``, ``scales``, ``qzeros``, ``g_idx``, ...) is a quantisation
    tensor of the nearest enclosing module and keeps its checkpoint bytes, split in the module's proportion.
    Per-expert names (``experts.<e>.``) share the stacked experts' tensor. A name matching no layout tensor is
    counted whole on every rank (listed in ``unmatched``).
    """
    total = per_rank = parameters = unmatched_bytes = 0
    unmatched: list[str] = []
    for tensor in tensors:
        name = _EXPERT.sub(".experts.", tensor.name)
        module, own = _match(name, shares)
        nbytes = tensor.nbytes
        if module is not None and own and tensor.dtype in FLOAT_DTYPES:
            share = shares[module]
            nbytes = tensor.numel * (share.element_bytes or served_bytes)
            if share.quantised_bytes is not None and share.total:
                nbytes = math.ceil(share.quantised_bytes * tensor.numel / share.total)
        total += nbytes
        parameters += tensor.numel
        if module is None:
            unmatched.append(tensor.name)
            unmatched_bytes += nbytes
            per_rank += nbytes
            continue
        share = shares[module]
        if share.total:
            per_rank += math.ceil(nbytes * share.rank / share.total)
    return ExactWeights(total, per_rank, parameters, len(tensors), tuple(unmatched), unmatched_bytes)


def _match(name: str, shares: Mapping[str, Share]) -> tuple[str | None, bool]:
    """The layout module a header name belongs to, and whether it is that module's own weight."""
    if name in shares:
        return name, True
    if name.endswith(".weight") and name.removesuffix(".weight") in shares:
        return name.removesuffix(".weight"), True
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in shares:
            return candidate, False
    return None, False
