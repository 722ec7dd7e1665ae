"""DeepSeek-V4 with DSPARK speculative decoding: what the DSpark draft worker's pool adds (issue 33).

SGLang 0.5.23's ``DeepSeekV4TokenToKVPool`` (``mem_cache/deepseek_v4_memory_pool.py`` lines 1247-1260) gives a
draft worker's pool one more buffer under DSPARK (``is_dspark_spec()``), off HIP, when it has an SWA pool:
``swa_valid_from``, one int64 per request slot (``torch.zeros(num_req_slots, dtype=torch.int64)``), "kept for the
ring and for paged SWA alike".  kvpools plans it as the request pool :data:`DRAFT_SWA_VALID_FROM_POOL` beside
the draft's SWA pool (``draft_kv_swa``), ``num_req_slots`` the request table's rows (``max_num_reqs + 1``, line
1006).

The host tier (HiCache): ``_can_pack_hicache_mtp`` (``speculative/base_spec_worker.py``) packs a DSpark draft
into the target's host ``kv_swa`` (``HiCacheDraftMode.PACKED``) when the draft runner's class is
``DeepseekV4ForCausalLMDSpark``: ``ModelConfig`` loads a draft config whose ``architectures[0]`` is
``DeepseekV4ForCausalLM`` as that class under DSPARK when the checkpoint bundles a DSpark head
(``checkpoint_bundles_dspark_draft``: a ``dspark_block_size`` / ``dspark_markov_rank`` / ``dspark_noise_token_id``
/ ``dspark_target_layer_ids`` key, ``configs/model_config.py`` L1041-1060).  Any other DSpark draft gets the
``build_swa_draft_pools`` sidecar (:func:`dspark_packs_into_host`).

Not modelled here: the encoder-replay draft SWA ring (``uses_draft_swa_ring``, ``get_draft_swa_ring_size``) and
the bf16 draft ring beside a unified-KV fp8 target (``_dspark_draft_on_bf16``): both ride on layouts kvpools
models elsewhere (the per-request SWA ring, ROCm's unified KV).
"""

from __future__ import annotations

from kvpools_core.values import ModelSpec, Serving

DRAFT_SWA_VALID_FROM_POOL = "draft_swa_valid_from"
VALID_FROM_BYTES = 8
"""``torch.int64``."""
HIP_PLATFORMS = frozenset({"rocm"})
"""Where SGLang's ``_is_hip`` holds: the draft SWA stays addressed through the target's paged mapping."""


def dspark_swa_valid_from_slots(serving: Serving, num_req_slots: int, *, has_draft_swa: bool) -> int:
    """Entries of the DSpark draft pool's ``swa_valid_from`` (0 where SGLang allocates none)."""
    if serving.speculative_algorithm != "DSPARK" or not has_draft_swa or serving.platform in HIP_PLATFORMS:
        return 0
    return num_req_slots


DSPARK_ARCHITECTURE = "DeepseekV4ForCausalLMDSpark"


def dspark_packs_into_host(model: ModelSpec, serving: Serving) -> bool:
    """Whether SGLang packs the DSpark draft's SWA layers into the target's host ``kv_swa`` (see the module): the
    draft config (``--speculative-draft-model-path``'s, else the target's, whose bundled head the draft loads)
    names ``DeepseekV4ForCausalLMDSpark``, or ``DeepseekV4ForCausalLM`` with a bundled DSpark head."""
    if serving.speculative_algorithm != "DSPARK":
        return False
    draft = serving.speculative_draft.model if serving.speculative_draft is not None else model
    if not draft.hf_architectures:
        return False
    architecture = draft.hf_architectures[0]
    return architecture == DSPARK_ARCHITECTURE or (
        architecture == "DeepseekV4ForCausalLM" and bool(draft.params.get("dspark_bundled"))
    )
