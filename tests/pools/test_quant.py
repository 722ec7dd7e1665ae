"""KV quantisation: hand-computed encodings, and error bounds as properties.

Bounds (x a value, amax the largest magnitude of its scale block):

* fp8 e4m3: 3 mantissa bits, so rounding to nearest errs by at most 2**-4 of
  |x| for normal values; below the smallest normal (2**-6) the spacing is
  2**-9, so at most 2**-10 absolute.  e5m2: 2**-3 relative, 2**-17 absolute.
* mxfp8: the block scale X is a power of two with amax / X <= 448 < 2 amax /
  X, and x / X rounds as e4m3: |err| <= 2**-4 |x| + 2**-10 X
  <= 2**-4 |x| + 2**-10 * 2 amax / 448.
* fp4: the scale s is amax / 6 rounded up to e4m3 (2**-3 relative spacing, or
  2**-9 absolute below 2**-6), so s <= 1.125 amax / 6 + 2**-9; the widest gap
  of the e2m1 grid is 2 (between 4 and 6), so |err| <= s.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.pools.quant import (
    Fp4Codec,
    MXFp8Codec,
    codec_for,
    fp4_dequantize,
    fp4_quantize,
    fp8_quantize,
    mxfp8_dequantize,
    mxfp8_quantize,
)


def test_fp4_block_hand_computed() -> None:
    # amax 6 -> scale 6 / 6 = 1.0 = e4m3 0x38; values map straight onto the e2m1 grid.
    block = torch.tensor([6.0, 3.0, -1.5, 0.5, 0.0, 4.0, -6.0, 1.0, 2.0, -0.5, 1.5, -3.0, 0.0, 0.0, 0.0, -4.0])
    packed, scale = fp4_quantize(block)
    assert scale.tolist() == [0x38]
    # codes: 6->7, 3->5, -1.5->8|3=11, 0.5->1, 0->0, 4->6, -6->15, 1->2, 2->4, -0.5->9, 1.5->3, -3->13, ..., -4->14
    # byte = even code | odd code << 4
    assert packed.tolist() == [0x57, 0x1B, 0x60, 0x2F, 0x94, 0xD3, 0x00, 0xE0]
    assert fp4_dequantize(packed, scale, torch.float32).tolist() == block.tolist()


def test_fp4_scale_rounds_up_so_nothing_clips() -> None:
    # amax 7 -> 7 / 6 = 1.1667 lies between the e4m3 values 1.125 and 1.25: the scale is 1.25 (0x3A),
    # so 7 / 1.25 = 5.6 rounds to the grid's 6 -> 7.5 (error 0.5 <= s = 1.25), never clipped to 6 * 1.125.
    packed, scale = fp4_quantize(torch.tensor([7.0] + [0.0] * 15))
    assert scale.tolist() == [0x3A]
    assert fp4_dequantize(packed, scale, torch.float32)[0].item() == 7.5


def test_fp4_zero_and_saturated_blocks() -> None:
    packed, scale = fp4_quantize(torch.zeros(2, 16))
    assert packed.eq(0).all() and scale.eq(0).all()
    # amax beyond 6 * 448 = 2688 saturates at 2688 (e4m3 scale 448, grid 6).
    packed, scale = fp4_quantize(torch.tensor([1e6] + [0.0] * 15))
    assert fp4_dequantize(packed, scale, torch.float32)[0].item() == 2688.0


def test_fp4_needs_whole_blocks() -> None:
    with pytest.raises(ValueError, match="divisible by 16"):
        fp4_quantize(torch.zeros(8))


@pytest.mark.parametrize(
    ("amax", "scale_byte", "first"),
    [
        (448.0, 127, 448.0),  # 448 / 448 = 1 = 2**0
        (224.0, 126, 448.0),  # 2**-1: the block fills e4m3's range
        (449.0, 128, 224.0),  # just above 448 needs 2**1; 449 / 2 = 224.5 rounds to e4m3's 224
        (0.0, 127, 0.0),  # an all-zero block keeps scale 2**0
    ],
)
def test_mxfp8_scale_hand_computed(amax: float, scale_byte: int, first: float) -> None:
    data, scale = mxfp8_quantize(torch.tensor([amax] + [0.0] * 31))
    assert scale.tolist() == [scale_byte]
    assert data.float()[0].item() == first


def test_fp8_saturates_instead_of_overflowing() -> None:
    x = torch.tensor([1e6, -1e6], dtype=torch.float32)
    assert fp8_quantize(x, torch.float8_e4m3fn).float().tolist() == [448.0, -448.0]
    assert fp8_quantize(x, torch.float8_e5m2).float().tolist() == [57344.0, -57344.0]


@pytest.mark.parametrize(
    ("name", "shape", "scale_shape"),
    [
        ("bf16", (10, 4, 64), None),
        ("fp8_e4m3", (10, 4, 64), None),
        ("fp4_e2m1", (10, 4, 32), (10, 4 * 64 // 16)),
        ("mxfp8", (10, 4, 64), (10, 4, 64 // 32)),
    ],
)
def test_codec_shapes(name: str, shape: tuple[int, ...], scale_shape: tuple[int, ...] | None) -> None:
    codec = codec_for(resolve_kv_dtype(name, "bfloat16"))
    assert codec.data_shape(10, 4, 64) == shape
    assert codec.scale_shape(10, 4, 64) == scale_shape


finite_scales = st.floats(min_value=1e-3, max_value=1e3)


def _sample(seed: int, magnitude: float, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * magnitude
    # a few exact zeros and tiny values, where subnormal rounding matters
    x[..., :2] = 0.0
    x[..., 2] *= 1e-4
    return x.to(dtype)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), magnitude=finite_scales)
def test_fp8_error_bound(seed: int, magnitude: float) -> None:
    x = _sample(seed, magnitude, (8, 2, 64))
    for dtype, rel, absolute in ((torch.float8_e4m3fn, 2**-4, 2**-10), (torch.float8_e5m2, 2**-3, 2**-17)):
        limit = torch.finfo(dtype).max
        inside = x.clamp(-limit, limit)
        err = (fp8_quantize(x, dtype).float() - inside).abs()
        assert (err <= rel * inside.abs() + absolute).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), magnitude=finite_scales)
def test_mxfp8_error_bound(seed: int, magnitude: float) -> None:
    x = _sample(seed, magnitude, (8, 2, 64))
    data, scale = mxfp8_quantize(x)
    err = (mxfp8_dequantize(data, scale, torch.float32) - x).abs()
    amax = x.reshape(8, 2, 2, 32).abs().amax(-1, keepdim=True).expand(8, 2, 2, 32).reshape(x.shape)
    assert (err <= 2**-4 * x.abs() + 2**-10 * 2 * amax / 448).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), magnitude=st.floats(min_value=1e-3, max_value=400.0))
def test_fp4_error_bound(seed: int, magnitude: float) -> None:
    x = _sample(seed, magnitude, (8, 2, 64))
    packed, scale = fp4_quantize(x)
    err = (fp4_dequantize(packed, scale, torch.float32) - x).abs()
    amax = x.reshape(8, 2, 4, 16).abs().amax(-1, keepdim=True).expand(8, 2, 4, 16).reshape(x.shape)
    assert (err <= 1.125 * amax / 6 + 2**-9).all()


def test_codecs_take_low_precision_input() -> None:
    """bf16 / fp16 activations quantise the same as their fp32 values."""
    x = _sample(0, 5.0, (4, 2, 64))
    for codec in (Fp4Codec(torch.float4_e2m1fn_x2), MXFp8Codec(torch.float8_e4m3fn)):
        for dtype in (torch.bfloat16, torch.float16):
            low = x.to(dtype)
            data, scale = codec.encode(low)
            ref_data, ref_scale = codec.encode(low.float())
            assert torch.equal(data, ref_data) and scale is not None and ref_scale is not None
            assert torch.equal(scale, ref_scale)
            assert not math.isnan(codec.decode(data, scale, dtype).float().sum().item())
