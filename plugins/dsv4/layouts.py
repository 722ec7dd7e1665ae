"""DeepSeek-V4's paged KV layouts (V4, V4.1, V4.1-new) and which one each pool takes (issue 33).

SGLang 0.5.23 picks the main (SWA) cache's layout in ``select_dsv4_kv_layout``
(``srt/mem_cache/deepseek_v4_memory_pool.py``; ref-000 ``_build_dsv4_kv_pool`` lines 1376-1381) from two
environment variables, typed options here:

* ``SGLANG_DSV4_KV_LAYOUT`` = ``--dsv4-kv-layout`` (``auto`` / ``v4`` / ``v41`` / ``v41_new``);
* ``SGLANG_DSV4_COMPRESSED_KV_LAYOUT`` = ``--dsv4-compressed-kv-layout`` (``auto`` / ``fp8`` / ``fp4``).

``auto`` resolves by the GPU: V4.1 on a CUDA GPU of compute capability 10.x (SM100 / SM103:
``torch.cuda.get_device_capability()[0] == 10``), V4 elsewhere.  Where the plan knows its GPU (a catalogue
``--gpu`` with a compute capability, carried as ``PlatformTraits.compute_capability``) ``auto`` resolves from it
(B200 / GB200: V4.1, keeping the compressed option; H100 / H200: V4); without one kvpools plans V4 (SGLang's
answer off Blackwell) and the plan says that a Blackwell server gets V4.1 (:func:`auto_layout_note`).  ``v4``
returns ``(V4, None if option == "auto" else option)``; ``v41`` / ``v41_new`` keep the option.

Each compressed ratio's cache then follows ``resolve_compressed_kv_layout``: next to a V4 main cache every
cache is V4 (an ``fp4`` option asserts "the V4 main cache only pairs with V4 caches"); next to a V4.1 main cache
``fp4`` gives V41_FP4, ``fp8`` V41, and ``auto`` V41_FP4 for ratios 1 / 2 and V41 for 4 / 128, each in the main
cache's arrangement (``_NEW``: interleaved).

A layout's bytes are ``KVLayout`` of ``sglang/kernels/ops/attention/dsv4/kv_layout.py``: ``data_bytes +
scale_bytes`` per token, a page padded to a multiple of ``page_align``.  V4: 576 + 8 B (448 fp8 nope + 64 bf16
rope, 7 ue8m0 scales + 1 pad), pages padded to 576 B; V4.1: 512 fp8 (rope quantised too) + 16 ue8m0 scales,
padded to 512 B (interleaved: 528 B); V4.1-fp4: 256 B of e2m1 + 32 e4m3 scales, padded to 256 B
(interleaved: 288 B).  The V4.1 layouts store a 512-value latent (``get_bytes_per_token`` asserts
``qk_nope_head_dim + qk_rope_head_dim == 512``).

SGLang's ``--dsv4-attn-backend`` (``Serving.dsv4_attn_backend``) overrides the mode first
(``select_dsv4_kv_layout``): ``flashmla_mega`` turns every mode but ``v41_new`` into ``v41``; ``trtllm`` keeps V4
and ``DeepSeekV4TokenToKVPool`` then stores the SWA and compressed pools as ``DeepSeekV4UniformFP8KVPool``: 512 B
of e4m3 a token (448 nope + 64 rope, no scales), pages of exactly ``page_size x 512`` B (SGLang's
``KVLayout.UNIFORM_FP8``, planned here as :data:`UNIFORM_FP8`; its refusals are :mod:`.trtllm`'s).

The configurator's budget does not read the layout: ref-002's ``_get_bytes_per_full_token`` charges every row
``nope + 2 rope + 8`` bytes (584), so ``--accounting sglang`` keeps SGLang's counts while the pools built hold the
layout's bytes; ``--accounting exact`` solves over the built bytes.
"""

from __future__ import annotations

import attrs

from kvpools_core.options import option
from kvpools_core.values import ModelSpec, Serving

__all__ = [
    "COMPRESSED_OPTIONS",
    "KV_LAYOUT_MODES",
    "LAYOUTS",
    "UNIFORM_FP8",
    "V4",
    "V41",
    "V41_FP4",
    "V41_FP4_NEW",
    "V41_NEW",
    "KVLayout",
    "auto_is_v41",
    "auto_layout_note",
    "compressed_layout",
    "layout_problems",
    "main_layout",
]


@attrs.frozen
class KVLayout:
    """One paged FlashMLA layout: a token's data and scale bytes, and the unit a page's stride is padded to."""

    name: str
    data_bytes: int
    scale_bytes: int
    page_align: int
    interleaved: bool = False
    fp4: bool = False

    @property
    def bytes_per_token(self) -> int:
        return self.data_bytes + self.scale_bytes

    def page_bytes(self, page_size: int) -> int:
        """``KVLayout.page_bytes``: ``page_size`` tokens, rounded up to ``page_align``."""
        raw = page_size * self.bytes_per_token
        return -(-raw // self.page_align) * self.page_align


V4 = KVLayout("v4", 576, 8, 576)
V41 = KVLayout("v41", 512, 16, 512)
V41_NEW = KVLayout("v41_new", 512, 16, 528, interleaved=True)
V41_FP4 = KVLayout("v41_fp4", 256, 32, 256, fp4=True)
V41_FP4_NEW = KVLayout("v41_fp4_new", 256, 32, 288, interleaved=True, fp4=True)
UNIFORM_FP8 = KVLayout("uniform_fp8", 512, 0, 512)
"""``DeepSeekV4UniformFP8KVPool`` (``--dsv4-attn-backend trtllm``): 448 nope + 64 rope e4m3, no in-cache scales."""
LAYOUTS = {layout.name: layout for layout in (V4, V41, V41_NEW, V41_FP4, V41_FP4_NEW, UNIFORM_FP8)}

KV_LAYOUT_MODES = ("auto", "v4", "v41", "v41_new")
"""``SGLANG_DSV4_KV_LAYOUT``'s values (``select_dsv4_kv_layout`` asserts the others away)."""
COMPRESSED_OPTIONS = ("auto", "fp8", "fp4")
"""``SGLANG_DSV4_COMPRESSED_KV_LAYOUT``'s values (``resolve_compressed_kv_layout``)."""
V41_LATENT = 512
SGLANG_V4_PAIR_MESSAGE = "the V4 main cache only pairs with V4 caches"
SGLANG_HISPARSE_V4_MESSAGE = "HiSparse C4 pools support the V4 layout only"


SM100_MAJOR = 10
"""``select_dsv4_kv_layout``'s ``is_sm100``: ``torch.cuda.get_device_capability()[0] == 10`` (SM100 / SM103)."""


def gpu_capability(serving: Serving) -> tuple[int, int] | None:
    """The planned GPU's compute capability (``--gpu``), or ``None`` where the plan does not know it."""
    traits = serving.platform_traits
    return traits.compute_capability if traits is not None else None


def uniform_fp8(serving: Serving) -> bool:
    """Whether the pools are ``DeepSeekV4UniformFP8KVPool`` (``uniform_fp8``: ``--dsv4-attn-backend trtllm``)."""
    return serving.dsv4_attn_backend == "trtllm"


def layout_mode(serving: Serving) -> str:
    """``SGLANG_DSV4_KV_LAYOUT`` after the backend's override: ``flashmla_mega`` makes all but ``v41_new`` ``v41``,
    ``trtllm`` ``v4`` (select_dsv4_kv_layout; a ``v41`` mode under trtllm is refused by :mod:`.trtllm`)."""
    mode = serving.dsv4_kv_layout
    if serving.dsv4_attn_backend == "flashmla_mega" and mode != "v41_new":
        return "v41"
    if uniform_fp8(serving):
        return "v4"
    return mode


def auto_is_v41(serving: Serving) -> bool:
    """Whether ``auto`` is V4.1 here: the planned GPU is a CUDA SM100 / SM103 one (and no backend overrides it)."""
    capability = gpu_capability(serving)
    return layout_mode(serving) == "auto" and capability is not None and capability[0] == SM100_MAJOR


def main_layout(serving: Serving) -> KVLayout:
    """The main (SWA) cache's layout ``select_dsv4_kv_layout`` returns; ``auto`` by the GPU (see the module).
    Under ``trtllm`` the layout of the rows built: :data:`UNIFORM_FP8`."""
    if uniform_fp8(serving):
        return UNIFORM_FP8
    mode = layout_mode(serving)
    if mode == "v41" or auto_is_v41(serving):
        return V41
    if mode == "v41_new":
        return V41_NEW
    return V4


def _compressed_option(serving: Serving) -> str | None:
    """The option ``select_dsv4_kv_layout`` hands on: ``None`` for ``auto``, and for SGLang's ``auto`` main
    layout off SM100, which drops it (on SM100 ``auto`` returns ``(V41, option)``)."""
    if serving.dsv4_compressed_kv_layout == "auto":
        return None
    if layout_mode(serving) == "auto" and not auto_is_v41(serving):
        return None
    return serving.dsv4_compressed_kv_layout


def auto_layout_note(serving: Serving) -> str | None:
    """What the plan says about ``--dsv4-kv-layout auto``: the GPU it resolved by, or that it knew none."""
    if layout_mode(serving) != "auto":
        return None
    o = option
    capability = gpu_capability(serving)
    if capability is None:
        return (
            f"{o('dsv4_kv_layout')} auto planned as v4: kvpools does not know the GPU, and SGLang's "
            f"select_dsv4_kv_layout picks v4 off SM100 / SM103; a Blackwell (compute capability 10.x) server gets "
            f"v41 (pass {o('gpu')} b200, or {o('dsv4_kv_layout')} v41)."
        )
    name = main_layout(serving).name
    where = "an SM100 / SM103 GPU" if name == V41.name else "not an SM100 / SM103 GPU"
    return (
        f"{o('dsv4_kv_layout')} auto planned as {name}: the GPU's compute capability is "
        f"{capability[0]}.{capability[1]}, {where} (SGLang's select_dsv4_kv_layout)."
    )


def compressed_layout(serving: Serving, ratio: int) -> KVLayout:
    """``resolve_compressed_kv_layout(main, ratio, option)``: the layout of ratio ``ratio``'s compressed cache."""
    main = main_layout(serving)
    if main is V4 or main is UNIFORM_FP8:
        return main
    opt = _compressed_option(serving)
    fp4 = opt == "fp4" or (opt is None and ratio in (1, 2))
    if fp4:
        return V41_FP4_NEW if main.interleaved else V41_FP4
    return main


def layout_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang asserts away for the layout options.  The host tier mirrors every layout's padded pages
    (:mod:`.host`), so ``--enable-hierarchical-cache`` is planned with each of them."""
    o = option
    problems: list[str] = []
    if uniform_fp8(serving):
        return []  # the trtllm backend's own rules: .trtllm.backend_problems
    mode, opt = layout_mode(serving), serving.dsv4_compressed_kv_layout
    if mode == "v4" and opt == "fp4":
        problems.append(
            f"{o('dsv4_kv_layout')} v4 with {o('dsv4_compressed_kv_layout')} fp4: SGLang asserts "
            f"'{SGLANG_V4_PAIR_MESSAGE}' (resolve_compressed_kv_layout). Use {o('dsv4_kv_layout')} v41 or "
            f"{o('dsv4_compressed_kv_layout')} fp8 / auto."
        )
    if main_layout(serving) is V4:
        return problems
    first = model.layers[0].params if model.layers else {}
    latent = int(first.get("qk_nope_head_dim", 0)) + int(first.get("qk_rope_head_dim", 0))
    if latent != V41_LATENT:
        problems.append(
            f"{o('dsv4_kv_layout')} {mode}: the V4.1 layouts store a {V41_LATENT}-value latent, and {model.name} has "
            f"qk_nope_head_dim + qk_rope_head_dim = {latent} (SGLang asserts it in get_bytes_per_token). Use "
            f"{o('dsv4_kv_layout')} v4."
        )
    if serving.enable_hisparse:
        problems.append(
            f"{o('enable_hisparse')} with {o('dsv4_kv_layout')} {mode}: SGLang's HiSparseC4DevicePool asserts "
            f"'{SGLANG_HISPARSE_V4_MESSAGE}'. Use {o('dsv4_kv_layout')} v4 or drop {o('enable_hisparse')}."
        )
    return problems
