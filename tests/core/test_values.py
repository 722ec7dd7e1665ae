"""Frozen values validate their inputs with messages that name the flag and the fix."""

from __future__ import annotations

import re

import attrs
import pytest

from kvpools_core import CellPart, CellSize, ConfigError, LayerSpec, ModelSpec, Serving
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import cli_surface
from kvpools_core.parallel import kv_heads_per_rank, pp_layer_range
from kvpools_core.units import parse_bytes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"page_size": 0}, r"--page-size must be a positive integer, got 0"),
        ({"tp_size": -2}, r"--tp-size must be a positive integer"),
        ({"kv_cache_dtype": "int3"}, r"Unsupported --kv-cache-dtype 'int3'. Choose one of: auto, bf16"),
        ({"mem_fraction_static": 1.5}, r"--mem-fraction-static must be a number in \(0, 1\]"),
        ({"pp_size": 2, "pp_rank": 2}, r"--pp-rank must be below --pp-size \(2\)"),
        (
            {"tp_size": 6, "dp_size": 4, "enable_dp_attention": True},
            r"--tp-size 6 must be divisible by the attention DP size \(4\)",
        ),
        ({"speculative_algorithm": "MEDUSA"}, r"--speculative-algorithm must be one of"),
        ({"accounting": "TRT LLM"}, r"must be a lower-case accounting name"),
        (
            {
                "disable_overlap_schedule": True,
                "enable_mamba_extra_buffer": True,
                "enable_mamba_extra_buffer_lazy": True,
            },
            r"requires the overlap schedule",
        ),
        ({"enable_mamba_extra_buffer_lazy": True}, r"add --enable-mamba-extra-buffer"),
        ({"enable_online_c128_mtp": True}, r"add --enable-online-compress"),
    ],
)
def test_serving_rejects_bad_options(kwargs: dict[str, object], message: str) -> None:
    """Flags on the command line; the same message names the Python arguments from the API."""
    with cli_surface(), pytest.raises(ConfigError, match=message):
        Serving(**kwargs)  # type: ignore[arg-type]
    as_python = re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)
    with pytest.raises(ConfigError, match=as_python):
        Serving(**kwargs)  # type: ignore[arg-type]


def test_serving_is_frozen_and_derives_attention_parallelism() -> None:
    serving = Serving(tp_size=8, dp_size=4, enable_dp_attention=True, kv_cache_dtype="FP8")
    assert serving.kv_cache_dtype == "fp8_e4m3"
    assert (serving.attn_dp_size, serving.attn_tp_size) == (4, 2)
    assert Serving(tp_size=8, dp_size=4).attn_tp_size == 8  # without DP attention, DP replicates whole engines
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        serving.page_size = 2  # type: ignore[misc]


def test_model_spec_checks_layers() -> None:
    with pytest.raises(ConfigError, match="has no layers"):
        ModelSpec(name="m", architecture="mha", layers=[], context_len=8, dtype="bfloat16")
    with pytest.raises(ConfigError, match=r"layer indices must be 0\.\.1 in order"):
        ModelSpec(
            name="m",
            architecture="mha",
            layers=[LayerSpec(1, "attention"), LayerSpec(0, "attention")],
            context_len=8,
            dtype="bfloat16",
        )


def test_cell_size_groups_parts_by_pool() -> None:
    cell = CellSize(
        parts=[CellPart("k", 10), CellPart("v", 6), CellPart("draft_k", 3, "draft_kv")],
        sglang_bytes_per_token=16,
        num_layers=2,
    )
    assert cell.bytes_per_token == 19
    assert cell.pool_bytes_per_token() == {"kv": 16, "draft_kv": 3}


@pytest.mark.parametrize(
    ("layers", "rank", "size", "expected"),
    [
        (80, 0, 3, (0, 26)),
        (80, 1, 3, (26, 53)),
        (80, 2, 3, (53, 80)),
        (32, 1, 2, (16, 32)),
        (7, 1, 4, (1, 3)),
        (7, 3, 4, (5, 7)),
    ],
)
def test_pp_split_gives_the_remainder_to_the_last_stages(
    layers: int, rank: int, size: int, expected: tuple[int, int]
) -> None:
    assert pp_layer_range(layers, rank, size) == expected


def test_pp_explicit_partition() -> None:
    assert pp_layer_range(10, 1, 3, (2, 5, 3)) == (2, 7)
    with pytest.raises(ConfigError, match="summing to the model's 10 layers"):
        pp_layer_range(10, 0, 2, (4, 4))


@pytest.mark.parametrize(
    ("heads", "tp", "dcp", "expected"), [(8, 1, 1, 8), (8, 4, 1, 2), (8, 16, 1, 1), (8, 8, 2, 2), (1, 8, 1, 1)]
)
def test_kv_heads_per_rank(heads: int, tp: int, dcp: int, expected: int) -> None:
    assert kv_heads_per_rank(heads, tp, dcp) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64424509440", 64424509440),
        ("60GiB", 60 << 30),
        ("60 GB", 60 * 10**9),
        ("1.5TiB", 3 << 39),
        ("80G", 80 << 30),
        (4096, 4096),
    ],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["-1GiB", "lots", "12 parsecs", "1e9"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--memory"):
        parse_bytes(text, "--memory")


def test_kv_dtype_resolution() -> None:
    assert resolve_kv_dtype("auto", "float16").name == "fp16"
    fp4 = resolve_kv_dtype("fp4_e2m1", "bfloat16")
    assert (fp4.element_bytes, fp4.values_per_element, fp4.scale_block, fp4.storage_dtype) == (1, 2, 16, "uint8")
    assert resolve_kv_dtype("mxfp8", "bfloat16").scale_block == 32
