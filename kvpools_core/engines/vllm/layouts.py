"""The KV-cache layouts of older vLLM releases, applied to the vLLM 0.33 specs the plugins build (issue 34).

The architecture plugins build vLLM 0.33's layer specs.  Where an older release lays a model out differently and a
runtime profile (``--engine-version vllm==X.Y``, ``profiles/vllm-<version>.json``) says so, this module turns the 0.33
specs into that release's.  Two differences are modelled, each a profile switch (``profiles/vllm-<version>.json``),
and one is refused (:func:`layout_for_version`: a Mamba1 / Mamba2 hybrid in ``mamba_cache_mode`` ``"all"`` up to vLLM
0.27); :func:`layout_change` says what changed, and that a 0.15-0.25 hybrid plan is the ``--enable-prefix-caching``
layout (``RuntimeProfile.hybrid_prefix_caching_default``):

* **Gated DeltaNet prefill checkpoints** (``RuntimeProfile.gdn_prefill_checkpoint``).  vLLM 0.33 gives each GDN
  layer's ``MambaSpec`` one prefill-checkpoint block per request on FlashInfer's 64-token grid
  (``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``, ``v1/attention/backends/gdn_attn.py`` L34;
  ``MambaSpec.prefill_checkpoint_alignment`` / ``num_prefill_checkpoint_blocks``, ``v1/kv_cache_interface.py``
  L1101-1102, L1135-1141), so ``Platform._align_hybrid_block_size`` keeps blocks a multiple of 64 tokens and a
  request holds ``2 + 1`` Mamba blocks under prefix caching.  vLLM 0.24.0's ``MambaSpec`` has neither field (0.25 to
  0.28 the same); 0.29.0 added ``num_prefill_checkpoint_blocks`` (``kv_cache_interface.py`` L858 / L891) and 0.30.0
  ``prefill_checkpoint_alignment`` (L1000-1001), but no layer under ``model_executor/`` of 0.29.0 or 0.30.0 sets them,
  and ``gdn_attn.py`` has no ``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`` up to 0.32.0: the GDN checkpoint is new in
  0.33.0 (wheels read one by one).  Before it the attention block grows on the attention kernel's 16-token grid
  until a page holds the state, the state page is padded to it, and a request holds 2 Mamba blocks.  For
  Qwen3.6-35B-A3B with an fp8 cache: 2096-token blocks (0.33: 2112), which reproduces both vLLM 0.24.0 RTX 5090 logs'
  token counts from their budget (``tests/vllm/test_startup_logs.py``).  The profiles of vLLM 0.15-0.32 have it off.
* **Mamba2 prefill checkpoints** (``RuntimeProfile.mamba2_prefill_checkpoint``).  From vLLM 0.32.0
  ``MambaMixer2.get_kv_cache_spec`` declares one prefill-checkpoint block per request at alignment 1
  (``model_executor/layers/mamba/mamba_mixer2.py`` L1098-1108; 0.33 L1108-1118), which ``align`` mode adds to the 2
  Mamba blocks a request holds (``MambaSpec.max_memory_usage_bytes``, 0.32.0 ``v1/kv_cache_interface.py``
  L1076-1082).  Alignment 1 leaves the block size alone.  vLLM 0.31.0's ``mamba_mixer2.py`` has no
  ``get_kv_cache_spec`` (no layer of 0.31.0 but KDA's ``kda_checkpoint.py`` asks for a checkpoint), and before 0.29
  ``MambaSpec`` has no checkpoint field: a Nemotron-H / Falcon-H1 / Granite-4.0-H request holds 2 Mamba blocks.  The
  profiles of vLLM 0.15-0.31 have it off.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parts.vllm.layers import align_hybrid_block_size
from kvpools_core.parts.vllm.specs import KVCacheSpec, MambaSpec

from .runtime_memory import RuntimeProfile

ATTENTION_KERNEL_BLOCK = 16
"""The smallest kernel block of CUDA's attention backends the old GDN layout aligns to (FlashAttention's and
FlashInfer's smallest: vLLM 0.24.0 ``flash_attn.py`` L76-90, ``flashinfer.py`` L338-356, 16, 32, 64 off TRTLLM); the
grid the plugin uses for 0.33 too."""


def _is_gdn_with_checkpoint(spec: KVCacheSpec) -> bool:
    return (
        isinstance(spec, MambaSpec) and spec.mamba_type == "gdn_attn" and spec.prefill_checkpoint_alignment is not None
    )


def without_gdn_prefill_checkpoint(
    specs: Mapping[str, KVCacheSpec], block_size: int, kernel_block: int = ATTENTION_KERNEL_BLOCK
) -> dict[str, KVCacheSpec]:
    """One worker's specs as vLLM 0.15-0.32 lay out a Gated DeltaNet hybrid: the block size re-aligned without the
    64-token checkpoint grid (:func:`~kvpools_core.parts.vllm.layers.align_hybrid_block_size` with no
    ``prefill_checkpoint_alignment``) on ``kernel_block`` (16; 32 where :func:`blackwell_head256_grid` says so),
    every attention spec at that block size, every GDN ``MambaSpec`` padded to the new attention page with no
    checkpoint block.  Specs without a GDN checkpoint come back unchanged.  ``block_size`` is the ``--block-size``
    asked (16 by default)."""
    gdn = [spec for spec in specs.values() if _is_gdn_with_checkpoint(spec)]
    if not gdn:
        return dict(specs)
    state = gdn[0]
    assert isinstance(state, MambaSpec)
    attention = [spec for spec in specs.values() if not isinstance(spec, MambaSpec)]
    if not attention:
        return dict(specs)
    per_token = attrs.evolve(attention[0], block_size=1).page_size_bytes
    aligned, padded = align_hybrid_block_size(
        block_size=block_size,
        attn_page_size_1_token=per_token,
        mamba_page_size=state.state_bytes,
        kernel_block_size=kernel_block,
        backend_block_alignment=kernel_block,
    )
    result: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        if isinstance(spec, MambaSpec) and _is_gdn_with_checkpoint(spec):
            result[name] = attrs.evolve(
                spec,
                block_size=aligned,
                page_size_padded=padded,
                num_prefill_checkpoint_blocks=0,
                prefill_checkpoint_alignment=None,
            )
        elif isinstance(spec, MambaSpec):
            result[name] = spec
        else:
            result[name] = attrs.evolve(spec, block_size=aligned)
    return result


def _is_mamba2_with_checkpoint(spec: KVCacheSpec) -> bool:
    return isinstance(spec, MambaSpec) and spec.mamba_type == "mamba2" and spec.num_prefill_checkpoint_blocks > 0


def without_mamba2_prefill_checkpoint(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """One worker's specs as vLLM before 0.32 lays out a Mamba2 hybrid: every Mamba2 ``MambaSpec`` without its
    prefill-checkpoint block (2 Mamba blocks a request in ``align`` mode instead of ``2 + 1``); the block size and
    every other spec unchanged (the checkpoint's alignment 1 never moved them)."""
    result: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        if isinstance(spec, MambaSpec) and _is_mamba2_with_checkpoint(spec):
            result[name] = attrs.evolve(spec, num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)
        else:
            result[name] = spec
    return result


MAMBA_PREFIX_CACHING_TYPES = ("mamba1", "mamba2")
"""The ``mamba_type`` of the layers whose models implement vLLM's ``SupportsMambaPrefixCaching`` (``nemotron_h.py``,
``jamba.py``, ``falcon_h1.py``, ``granitemoehybrid.py``, ``mamba.py``, ``mamba2.py``, ``zamba2.py`` in the 0.24.0,
0.29.0 and 0.32.0 wheels): every Mamba1 / Mamba2 family the mamba plugin builds."""


BLACKWELL_HEAD256_KERNEL_BLOCK = 32
"""vLLM 0.15-0.17's hybrid attention alignment on a data-center Blackwell at head size 256 (0.17.0
``model_executor/models/config.py`` L469-480: FlashInfer does not run head size 256 with 16-token blocks there,
flashinfer-ai/flashinfer#1993; 0.16.0 L429-440 the same; 0.18.0 L149 sets 16 whatever the GPU)."""


def blackwell_head256_grid(
    workers: list[dict[str, KVCacheSpec]], profile: RuntimeProfile, compute_capability: tuple[int, int] | None
) -> bool:
    """Whether ``profile``'s release aligns these Gated DeltaNet hybrid specs to 32 tokens
    (:data:`BLACKWELL_HEAD256_KERNEL_BLOCK`): ``RuntimeProfile.blackwell_head256_block_32``, a GPU of device
    capability family 100 (``is_device_capability_family(100)``: major 10, 0.17.0 ``platforms/interface.py``
    L334-346) and attention of head size 256 (``model_config.get_head_size()``)."""
    if not profile.blackwell_head256_block_32 or compute_capability is None or compute_capability[0] != 10:
        return False
    return _gdn_head256(workers)


def _gdn_head256(workers: list[dict[str, KVCacheSpec]]) -> bool:
    specs = [spec for worker in workers for spec in worker.values()]
    return any(_is_gdn_with_checkpoint(spec) for spec in specs) and any(
        not isinstance(spec, MambaSpec) and getattr(spec, "head_size", None) == 256 for spec in specs
    )


def layout_for_version(
    workers: list[dict[str, KVCacheSpec]],
    profile: RuntimeProfile,
    block_size: int,
    compute_capability: tuple[int, int] | None = None,
) -> list[dict[str, KVCacheSpec]]:
    """Every worker's specs as ``profile``'s vLLM version lays them out (unchanged for vLLM 0.33).

    Refuses a Mamba1 / Mamba2 hybrid under a release that lays it out in ``mamba_cache_mode`` ``"all"``
    (``RuntimeProfile.mamba_cache_mode_all``, vLLM up to 0.27): ``MambaModelConfig.verify_and_update_config`` sets
    ``"all"`` for a model with ``supports_mamba_prefix_caching`` under prefix caching (0.19.1
    ``model_executor/models/config.py`` L439, 0.24.0 L420, 0.27.1 L616; 0.16.0 L333-336), one state page per block of
    the sequence, and ``"none"`` without prefix caching (the default for hybrids before 0.26); 0.28.0 sets ``"align"``
    whatever the model (L604)."""
    modes = {
        spec.mamba_type
        for worker in workers
        for spec in worker.values()
        if isinstance(spec, MambaSpec) and spec.mamba_type in MAMBA_PREFIX_CACHING_TYPES
    }
    if profile.mamba_cache_mode_all and modes:
        raise UnsupportedCombinationError(
            f"vLLM {profile.version} ({', '.join(profile.covers)}) lays a {'/'.join(sorted(modes))} hybrid out in "
            f"mamba_cache_mode 'all' under prefix caching (its model supports Mamba prefix caching) and 'none' "
            f"without it: kvpools does not model either layout yet (only 0.28+'s 'align'). Plan with "
            f"--engine-version vllm==0.28 or later, or without --engine-version (vLLM 0.33)."
        )
    result = workers
    if not profile.gdn_prefill_checkpoint:
        grid = (
            BLACKWELL_HEAD256_KERNEL_BLOCK
            if blackwell_head256_grid(workers, profile, compute_capability)
            else ATTENTION_KERNEL_BLOCK
        )
        result = [without_gdn_prefill_checkpoint(worker, block_size, grid) for worker in result]
    if not profile.mamba2_prefill_checkpoint:
        result = [without_mamba2_prefill_checkpoint(worker) for worker in result]
    return result


def layout_change(
    workers: list[dict[str, KVCacheSpec]],
    profile: RuntimeProfile,
    compute_capability: tuple[int, int] | None = None,
) -> str:
    """What :func:`layout_for_version` changes in ``workers`` (the 0.33 specs) for ``profile``'s release, in words
    (empty: nothing)."""
    specs = [spec for worker in workers for spec in worker.values()]
    changes = []
    if not profile.gdn_prefill_checkpoint and any(_is_gdn_with_checkpoint(spec) for spec in specs):
        changes.append(
            "Gated DeltaNet blocks without 0.33's 64-token prefill-checkpoint grid and 2 Mamba blocks a request"
        )
        if blackwell_head256_grid(workers, profile, compute_capability):
            changes.append(
                f"the attention block on a {BLACKWELL_HEAD256_KERNEL_BLOCK}-token grid (head size 256 on a data-center "
                f"Blackwell: vLLM 0.15-0.17, 0.17.0 model_executor/models/config.py L469-480)"
            )
        elif profile.blackwell_head256_block_32 and compute_capability is None and _gdn_head256(workers):
            changes.append(
                f"the attention block on the 16-token grid: on a data-center Blackwell vLLM {profile.version} aligns a "
                f"head-size-256 hybrid to 32 tokens, which a plan without --gpu cannot tell"
            )
    if not profile.mamba2_prefill_checkpoint and any(_is_mamba2_with_checkpoint(spec) for spec in specs):
        changes.append("Mamba2 layers without 0.32's prefill-checkpoint block (2 Mamba blocks a request, not 3)")
    if not profile.hybrid_prefix_caching_default and any(isinstance(spec, MambaSpec) for spec in specs):
        changes.append(
            f"mamba_cache_mode 'align', which vLLM {profile.version} runs with --enable-prefix-caching only (hybrid "
            f"models have prefix caching off by default before 0.26: 0.25.1 config/model.py L1885); without the "
            f"flag it runs 'none', which kvpools does not model yet"
        )
    return "; ".join(changes)
