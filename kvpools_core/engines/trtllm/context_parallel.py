"""``--accounting trtllm`` with context parallelism: TensorRT-LLM 1.2's helix parallelism (``context_parallel_size``
> 1, ``cp_config: {cp_type: HELIX, tokens_per_block: B}``), the KV-parallel decode of MLA models on a disaggregated
generation server.

What TensorRT-LLM does, read from its sources through the code index (``NVIDIA/TensorRT-LLM``; a commit where the
index names one, else the stored copy's id):

- **Options** (``tensorrt_llm/commands/serve.py``@``00209af1``): ``trtllm-serve --context_parallel_size`` (alias
  ``--cp_size``, default 1) and ``cp_config`` (``LlmArgs`` / the ``--extra_llm_api_options`` YAML), whose
  ``cp_type`` is read as ``CpType[name.upper()]`` ("Invalid cp_type: ... Must be one of: ULYSSES, STAR, RING,
  HELIX").  ``docs/source/features/helix.md``@``04c8822c``: ``cp_config.tokens_per_block`` "must match
  ``kv_cache_config.tokens_per_block``"; helix "currently supports models using Multi-head Latent Attention (MLA)
  on Blackwell GPU architecture: DeepSeek-V3 / DeepSeek-V3-Lite", for the generation servers of disaggregated
  serving.
- **The mapping** (``tensorrt_llm/mapping.py``@``b35ac1b6``): ``world_size = tp_size x pp_size x cp_size``; with
  ``cp_type`` HELIX attention keeps ``attn_tp_size = tp_size`` and ``attn_cp_size = cp_size`` and MoE takes
  ``tp_size x cp_size`` ranks (``repurpose_helix_cp_to_tp``); ``has_cp_helix()`` is ``cp_size > 1`` and
  ``cp_type == HELIX``.  ``MLA.__init__`` (``_torch/modules/attention.py``, stored copy 57637097072) raises "MLA
  doesn't support CP Ulysses yet", asserts "CP type must be HELIX for MLA" and ``num_heads % (tp_size x cp_size)
  == 0``.
- **No warm-up** (``_torch/pyexecutor/_util.py``@``00043967``, ``KvCacheCreator.try_prepare_estimation``): with
  ``'cp_type' in cp_config`` "KV cache size estimation is not supported for context parallelism, disable it", so
  ``configure_kv_cache_capacity`` never runs (it asserts ``'cp_type' not in mapping.cp_config`` for the V1 manager):
  ``kv_cache_config.max_tokens`` stays the user's (None by default) and no ``max_gpu_total_bytes`` is written.
- **Each rank's pool** (``_torch/pyexecutor/resource_manager.py``, stored copy 51768596745,
  ``KVCacheManager.calculate_max_num_blocks``): ``max_tokens = free_gpu_memory_fraction x free_mem /
  get_cache_bytes_per_token()`` with ``free_mem`` what ``torch.cuda.mem_get_info()`` reports when the manager is
  built (the weights loaded, no warm-up run), ``min`` with the user's ``max_tokens``, the MIN across ranks,
  ``blocks_in_primary_pool = max_tokens // tokens_per_block``: a **rank-local** pool.  MLA keeps one latent head
  per layer (``kv_lora_rank + qk_rope_head_dim``, K only), which neither TP nor CP divides: helix does not shrink a
  token's bytes, it spreads a request's tokens.
- **A request's tokens over the CP ranks**: at admission the generation server splits the prompt into blocks of
  ``tokens_per_block`` (``num_total_blocks = ceil(L / tokens_per_block)``) and gives each CP rank whole blocks --
  contiguous runs (``torch.tensor_split`` of the blocks, ``ExecutorRequestQueue._merge_helix_requests``, stored copy
  903912077) or round-robin (``partition_context_for_helix``, ``request_utils.py``, stored copy 66644507211); both
  give rank ``r`` ``ceil((n - r) / cp)`` blocks, so rank 0 holds ``ceil(n / cp)``.  Both raise "There aren't enough
  tokens to get at least one block per CP rank" when ``n < cp``.  Decode tokens go round-robin a block at a time
  (``KVCacheManager.prepare_resources``: ``decode_block_id = (py_decoding_iter - 1) // tokens_per_block`` on rank
  ``decode_block_id % cp_size``).
- ``_merge_requests`` (stored copy 903912077) takes ``CpType.STAR`` and ``CpType.HELIX`` only: any other type
  raises "Unsupported cp type {name}.".

kvpools plans that: the rank-local pool as TensorRT-LLM sizes it, ``get_kv_cache_capacity()`` as one rank publishes
it (rank-local ``maxNumTokens``), and requests of ``L`` tokens as rank 0's ``ceil(ceil(L / B) / cp)`` blocks.
Refused, with the reason: what TensorRT-LLM refuses (above), and what kvpools does not model with helix yet --
non-MLA attention, DeepSeek sparse attention's indexer, KVCacheManagerV2 and hybrid managers, speculative decoding,
attention windows, the host cache, attention DP, star attention, a GPU budget without ``--weights-memory`` (helix
loads attention weights at TP and MoE/FFN weights at TP x CP), pre-Blackwell GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from kvpools_core.engines.trtllm.deployment import (
    CONTEXT_PARALLEL_PLANNER,
    TrtllmInputs,
    TrtllmPlanResult,
    _resolve_device,
)
from kvpools_core.engines.trtllm.manager import (
    WindowPool,
    available_kv_memory,
    cache_bytes_per_token,
    estimated_size_per_token,
    pp_layers,
    window_upper_bound,
)
from kvpools_core.errors import ConfigError, UnsupportedCombinationError, short_repr
from kvpools_core.options import option
from kvpools_core.parts.trtllm import TrtllmLayer
from kvpools_core.registry import Registry
from kvpools_core.units import parse_bytes
from kvpools_core.values import ModelSpec, Serving

CP_TYPES = ("ULYSSES", "STAR", "RING", "HELIX")
"""``tensorrt_llm.mapping.CpType``'s members (``mapping.py``@``b35ac1b6``)."""
HELIX = "HELIX"
BLACKWELL_MAJOR = 10
"""The compute-capability major of Blackwell (B200, GB200: 10.0), the architecture TensorRT-LLM's helix documentation
names."""


@attrs.frozen(kw_only=True)
class ContextParallel:
    """``context_parallel_size`` CP ranks of ``cp_type`` (HELIX), splitting each request's tokens by blocks of
    ``tokens_per_block`` (``cp_config.tokens_per_block``, equal to ``kv_cache_config.tokens_per_block``)."""

    size: int
    tokens_per_block: int
    cp_type: str = HELIX

    def rank_blocks(self, context_len: int) -> tuple[int, ...]:
        """Blocks of a request of ``context_len`` tokens on each CP rank: ``n = ceil(L / tokens_per_block)`` whole
        blocks, rank ``r`` holding ``ceil((n - r) / cp)`` of them (``_merge_helix_requests``' contiguous split and
        ``partition_context_for_helix``' round-robin one agree on the counts).  Refused as TensorRT-LLM refuses the
        request when ``n < cp``."""
        if context_len <= 0:
            raise ConfigError(f"A context length must be positive, got {context_len}.")
        blocks = math.ceil(context_len / self.tokens_per_block)
        if blocks < self.size:
            raise ConfigError(
                f"TensorRT-LLM refuses a request of {context_len} tokens under helix: 'There aren't enough tokens to "
                f"get at least one block per CP rank. num_total_blocks {blocks} < num_cp_ranks {self.size}. Please "
                "use smaller tokens_per_block for KV cache or reduce the number of CP ranks.' "
                "(partition_context_for_helix)"
            )
        return tuple(math.ceil((blocks - rank) / self.size) for rank in range(self.size))

    def blocks_per_request(self, context_len: int) -> int:
        """The blocks the most loaded CP rank (rank 0) holds for one request of ``context_len`` tokens."""
        return self.rank_blocks(context_len)[0]

    def cp_config(self) -> dict[str, Any]:
        """``LlmArgs.cp_config`` as the ``--extra_llm_api_options`` YAML states it."""
        return {"cp_type": self.cp_type, "tokens_per_block": self.tokens_per_block}

    def to_dict(self) -> dict[str, Any]:
        return {"context_parallel_size": self.size, "cp_config": self.cp_config()}


@attrs.frozen(kw_only=True)
class TrtllmHelixPlanResult(TrtllmPlanResult):
    """A ``trtllm-serve`` generation server with helix context parallelism: ``pools`` and ``ranks`` are one CP
    rank's (every CP rank of a pipeline stage sizes the same pool), requests are split over ``context_parallel``."""

    context_parallel: ContextParallel

    @property
    def gpus(self) -> int:
        """``world_size = tp_size x pp_size x cp_size`` (``Mapping``)."""
        return self.serving.tp_size * self.serving.pp_size * self.context_parallel.size

    @property
    def group_kv_tokens(self) -> int:
        """The tokens one TP rank's CP group holds across its ``cp`` ranks (each rank's ``maxNumTokens``, times
        ``cp``); requests round each rank's share up to whole blocks, so :meth:`concurrency_at` is the answer."""
        return self.max_kv_tokens * self.context_parallel.size

    def concurrency_at(self, context_len: int) -> int | None:
        """Requests of ``context_len`` tokens the CP ranks hold at once, at most ``max_batch_size``; None past
        ``max_seq_len``.  Each request holds ``ceil(ceil(L / tokens_per_block) / cp)`` blocks of rank 0's pool (the
        most loaded rank, :meth:`ContextParallel.rank_blocks`); a request of fewer blocks than CP ranks is refused
        as TensorRT-LLM refuses it."""
        if context_len <= 0:
            raise ConfigError(f"A context length must be positive, got {context_len}.")
        if context_len > self.max_seq_len:
            return None
        per_request = self.context_parallel.blocks_per_request(context_len)
        return min(self.pools[0].primary_blocks // per_request, self.max_batch_size)

    @property
    def notes(self) -> tuple[str, ...]:
        cp = self.context_parallel.size
        if self.gpu is None:
            budget = (
                "--memory is the memory free when TensorRT-LLM builds each CP rank's KVCacheManager (the weights "
                "loaded): with context parallelism KvCacheCreator runs no warm-up ('KV cache size estimation is not "
                "supported for context parallelism'), so --kv_cache_free_gpu_memory_fraction applies to that memory "
                "and nothing is held back for the activations beyond the fraction's remainder."
            )
        else:
            budget = (
                f"free = total - weights ({self.weights_source}): with context parallelism TensorRT-LLM runs no "
                "warm-up and sizes each rank's pool from the memory free once the weights are loaded (CUDA context, "
                "NCCL and the helix all-to-all buffers not counted here), so the activations must fit in "
                f"1 - {self.free_gpu_memory_fraction:g} of it."
            )
        notes = [
            budget,
            f"helix context parallelism over {cp} ranks ({self.gpus} GPUs = tp {self.serving.tp_size} x pp "
            f"{self.serving.pp_size} x cp {cp}): each rank keeps {self.model.name}'s full MLA latent row per token "
            f"({self.ranks[0].cache_bytes_per_token:,} B) for the blocks of tokens it owns; a request of L tokens "
            f"holds ceil(ceil(L / {self.tokens_per_block}) / {cp}) blocks on rank 0 (its decode tokens then go to "
            "the ranks in turn, a block at a time).",
            f"get_kv_cache_capacity() publishes one rank's pool (maxNumTokens {self.max_kv_tokens:,}); the CP group "
            f"holds about {cp} times that ({self.group_kv_tokens:,} tokens), which an orchestrator reading the "
            "published figure does not see.",
            "helix is a decode feature of disaggregated serving: plan the generation server with it; the context "
            "server runs without context parallelism and its transfer spreads the KV blocks over the CP ranks.",
        ]
        if self.max_tokens is not None:
            notes.append(
                f"max_tokens {self.max_tokens:,} reaches each rank's KVCacheManager as given (no KvCacheCreator "
                "estimate with context parallelism): a cap on one rank's tokens, not the CP group's."
            )
        if self.max_gpu_total_bytes is not None:
            notes.append(
                "max_gpu_total_bytes changes nothing here: the single-window KVCacheManager reads max_tokens and the "
                "fraction only, and KvCacheCreator writes no budget with context parallelism."
            )
        return tuple(notes)

    def extra_llm_api_options(self) -> dict[str, Any]:
        """The base YAML with ``cp_config`` (``cp_type: HELIX``, ``tokens_per_block`` equal to the KV cache's)."""
        return {**super().extra_llm_api_options(), "cp_config": self.context_parallel.cp_config()}

    def serve_command(self, options_file: str = "kvpools-trtllm.yaml") -> str:
        """``trtllm-serve ... --cp_size N`` (``--context_parallel_size``'s alias) with ``cp_config`` in the YAML."""
        pp = f"--pp_size {self.serving.pp_size}"
        return super().serve_command(options_file).replace(pp, f"{pp} --cp_size {self.context_parallel.size}", 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            **self.context_parallel.to_dict(),
            "gpus": self.gpus,
            "group_kv_tokens": self.group_kv_tokens,
        }


def parse_cp_type(value: str | None) -> str:
    """``cp_config.cp_type`` as ``trtllm-serve`` reads it (``CpType[value.upper()]``); HELIX when not given."""
    if value is None:
        return HELIX
    name = str(value).upper()
    if name not in CP_TYPES:
        raise ConfigError(
            f"--cp_type {short_repr(value)}: TensorRT-LLM says 'Invalid cp_type: {value}. Must be one of: "
            f"{', '.join(CP_TYPES)}' (serve.py get_llm_args)."
        )
    return name


def _refuse(
    *,
    spec: ModelSpec,
    layers: Sequence[TrtllmLayer],
    serving: Serving,
    cp: ContextParallel,
    drafting: dict[str, Any],
    windows: Any,
    shares: Any,
    host: Any,
    enable_attention_dp: bool,
) -> None:
    """What TensorRT-LLM refuses with context parallelism, and what kvpools does not model with helix yet."""
    size = cp.size
    if cp.cp_type in ("ULYSSES", "RING"):
        mla = ' (and MLA.__init__: "MLA doesn\'t support CP Ulysses yet")' if cp.cp_type == "ULYSSES" else ""
        raise UnsupportedCombinationError(
            f"TensorRT-LLM 1.2's PyTorch executor refuses cp_type {cp.cp_type}: 'Unsupported cp type {cp.cp_type}.' "
            f"(ExecutorRequestQueue._merge_requests takes STAR and HELIX){mla}. Use --cp_type HELIX for an MLA "
            "model."
        )
    if cp.cp_type == "STAR":
        raise UnsupportedCombinationError(
            "kvpools does not model TensorRT-LLM's star attention (cp_type STAR: anchor blocks on every CP rank, "
            "cp_config block_size / cp_anchor_size) yet; --accounting trtllm plans helix (--cp_type HELIX)."
        )
    given = [flag for flag, value in drafting.items() if value not in (None, False)]
    if given:
        raise UnsupportedCombinationError(
            f"kvpools does not model speculative decoding with helix context parallelism ({', '.join(given)}) yet: "
            "TensorRT-LLM's helix partitions one new token per decode step (its helix write-up lists MTP, Eagle3 "
            "and draft models as future work). Drop the drafting options or --context_parallel_size."
        )
    if any(layer.v2 is not None for layer in layers):
        raise UnsupportedCombinationError(
            f"kvpools does not model helix context parallelism for {spec.name}'s KVCacheManagerV2 yet (TensorRT-LLM "
            "sizes a helix V2 pool in KvCacheCreator._configure_helix_kv_cache_capacity, not reproduced); drop "
            "--context_parallel_size."
        )
    if any(layer.state is not None for layer in layers):
        raise UnsupportedCombinationError(
            f"kvpools does not model helix context parallelism for a Mamba / linear-attention hybrid ({spec.name}) "
            "yet: its recurrent state is not split by tokens. Drop --context_parallel_size."
        )
    kv = [layer for layer in layers if layer.has_kv]
    if any(layer.kv_factor != 1 for layer in kv):
        raise UnsupportedCombinationError(
            f"kvpools does not model helix context parallelism for {spec.name}'s attention "
            f"({spec.architecture!r}, K and V per KV head) yet: TensorRT-LLM 1.2 documents helix for models with "
            "Multi-head Latent Attention only (docs/source/features/helix.md: DeepSeek-V3 / DeepSeek-V3-Lite). "
            "Drop --context_parallel_size, or plan an MLA model."
        )
    if any(layer.indexer_bytes for layer in kv):
        raise UnsupportedCombinationError(
            f"kvpools does not model helix context parallelism beside {spec.name}'s DeepSeek sparse attention "
            "indexer K cache (DSACacheManager) yet; drop --context_parallel_size."
        )
    for flag, value in (
        ("--max_attention_window", windows),
        ("--window_size_shares", shares),
        ("--host_cache_size", host),
        ("--enable_attention_dp", enable_attention_dp or None),
    ):
        if value is not None:
            raise UnsupportedCombinationError(
                f"kvpools does not model {flag} with helix context parallelism yet (--accounting trtllm plans one "
                f"full-attention pool per CP rank); drop {flag} or --context_parallel_size."
            )
    heads = spec.num_attention_heads
    if heads and heads % (serving.tp_size * size):
        raise UnsupportedCombinationError(
            f"TensorRT-LLM refuses {spec.name} on {option('tp_size')} {serving.tp_size} x --context_parallel_size "
            f"{size}: MLA.__init__ asserts num_heads % (tp_size * cp_size) == 0 and {heads} query heads do not "
            f"divide by {serving.tp_size * size}. Choose a TP x CP that divides {heads}."
        )
    if spec.dtype not in ("bfloat16", "float16") and serving.kv_cache_dtype == "auto":
        raise UnsupportedCombinationError(
            f"{spec.name}'s dtype is {spec.dtype}: kvpools models TensorRT-LLM's half-precision (bf16/fp16), fp8 "
            "and nvfp4 KV caches only; pass --kv-cache-dtype."
        )


def plan_helix(
    inputs: TrtllmInputs,
    *,
    layers: Sequence[TrtllmLayer],
    registry: Registry,
    context_parallel_size: int,
    cp_type: str | None,
    memory: int | str | None,
    gpu: Any,
    gpu_memory: int | str | None,
    weights_memory: int | str | None,
    drafting: dict[str, Any],
) -> TrtllmHelixPlanResult:
    """Plan ``spec`` as one helix CP rank of a ``trtllm-serve`` generation server sizes its ``KVCacheManager``
    (module docstring): no warm-up, ``fraction x free / bytes_per_token`` tokens per rank (``min`` with
    ``max_tokens``), the MIN across pipeline stages, ``tokens // tokens_per_block`` blocks, the window bound on the
    rank's pool; requests split over the CP ranks by blocks."""
    if context_parallel_size < 2:
        raise ConfigError(
            f"--cp_type {cp_type} needs --context_parallel_size 2 or more: TensorRT-LLM's Mapping.has_cp_helix() is "
            "cp_size > 1 (with context_parallel_size 1 there is no context parallelism). Drop --cp_type."
        )
    spec, serving, tokens_per_block = inputs.model, inputs.serving, inputs.tokens_per_block
    cp = ContextParallel(size=context_parallel_size, tokens_per_block=tokens_per_block, cp_type=parse_cp_type(cp_type))
    _refuse(
        spec=spec,
        layers=layers,
        serving=serving,
        cp=cp,
        drafting=drafting,
        windows=inputs.max_attention_window,
        shares=inputs.window_size_shares,
        host=inputs.host_cache_size,
        enable_attention_dp=inputs.enable_attention_dp,
    )
    chosen = _resolve_device(memory, gpu, gpu_memory, registry)
    if memory is not None and weights_memory is not None:
        raise ConfigError(
            "--memory is the memory free when TensorRT-LLM builds the KV cache (the weights already loaded): "
            "--weights-memory applies to a --gpu budget only. Drop one of them."
        )
    if chosen is not None and weights_memory is None:
        raise UnsupportedCombinationError(
            f"kvpools does not estimate helix's weights for {spec.name} yet (attention at TP {serving.tp_size}, "
            f"replicated over the CP ranks; MoE / FFN at TP x CP = {serving.tp_size * cp.size}): pass "
            "--weights-memory (one rank's weights), or --memory (the memory free once they are loaded)."
        )
    capability = chosen.compute_capability if chosen is not None else None
    if chosen is not None and capability is not None and capability[0] < BLACKWELL_MAJOR:
        raise UnsupportedCombinationError(
            f"kvpools does not model helix context parallelism on {chosen.label} (compute capability "
            f"{capability[0]}.{capability[1]}): TensorRT-LLM 1.2 documents helix on Blackwell GPUs only (its helix "
            "kernels; docs/source/features/helix.md). Plan a Blackwell GPU (b200, gb200) or give --memory."
        )
    if chosen is None:
        assert memory is not None
        frees: tuple[int, ...] = (parse_bytes(memory, "--memory"),) * serving.pp_size
        weights: tuple[int | None, ...] = (None,) * serving.pp_size
        weights_source = ""
    else:
        assert weights_memory is not None
        weights = (parse_bytes(weights_memory, "--weights-memory"),) * serving.pp_size
        weights_source = "given (--weights-memory)"
        frees = tuple(chosen.total_bytes - (w or 0) for w in weights)
        if frees[0] <= 0:
            raise UnsupportedCombinationError(
                f"The weights ({weights[0]} bytes) do not fit {chosen.label}'s {chosen.total_bytes} bytes: raise "
                "--tp-size, --pp-size or --context_parallel_size."
            )
    inputs = attrs.evolve(inputs, gpu=chosen, weights_source=weights_source, frees=frees, weights=weights)
    fraction, max_tokens = inputs.free_gpu_memory_fraction, inputs.max_tokens
    warnings: list[str] = []
    ranks = []
    rank_blocks = []
    per_token = []
    for stage in range(serving.pp_size):
        span = pp_layers(spec.num_layers, serving.pp_size, stage)
        local = [layers[i] for i in span]
        real = cache_bytes_per_token(local, serving.kv_cache_dtype, 2, serving.tp_size, False)
        est = estimated_size_per_token(layers, len(local), serving.kv_cache_dtype, 2, serving.tp_size, False)
        # calculate_max_num_blocks: fraction x free / bytes per token, min with the user's max_tokens (none from
        # KvCacheCreator: no estimation with cp_type set).
        tokens = fraction * frees[stage] / real
        if max_tokens is not None:
            tokens = min(max_tokens, tokens)
        rank_blocks.append(int(tokens // tokens_per_block))
        per_token.append((tuple(range(len(local))), real))
        ranks.append(
            inputs.stage(
                stage,
                available_kv_memory=available_kv_memory(frees[stage], fraction),
                estimated_size_per_token=est,
                cache_bytes_per_token=real,
                max_tokens=int(tokens),
                max_gpu_total_bytes=inputs.max_gpu_total_bytes or 0,
            )
        )
    blocks = min(rank_blocks)  # the MIN all-reduce across ranks
    upper = window_upper_bound(blocks, tokens_per_block)
    runs = seq_len = inputs.max_seq_len_requested
    if seq_len > upper:
        warnings.append(
            f"Attention window size {seq_len} exceeds upper bound {upper} for available blocks. Reducing to {upper}."
        )
        warnings.append(f"Adjusted max_seq_len to {upper}")
        runs = upper
    members, real = per_token[0]
    pool = WindowPool(window=runs, layers=members, bytes_per_token=real, share=1.0, primary_blocks=blocks)
    return inputs.result(
        TrtllmHelixPlanResult,
        max_seq_len=runs,
        is_vswa=False,
        ranks=tuple(ranks),
        pools=(pool,),
        warnings=tuple(warnings),
        context_parallel=cp,
    )


if not CONTEXT_PARALLEL_PLANNER:
    CONTEXT_PARALLEL_PLANNER.append(plan_helix)

__all__ = [
    "CP_TYPES",
    "HELIX",
    "ContextParallel",
    "TrtllmHelixPlanResult",
    "parse_cp_type",
    "plan_helix",
]
