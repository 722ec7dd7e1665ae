"""vLLM 0.33's CPU KV offload (``--kv-offloading-size GiB``): host blocks, host tokens, pinned bytes, the node.

``VllmConfig._post_init_kv_transfer_config`` (``config/vllm.py`` L1151-1185) turns ``--kv-offloading-size S``
with the default ``--kv-offloading-backend native`` into the ``OffloadingConnector`` (``SimpleCPUOffloadConnector``
when ``VLLM_USE_SIMPLE_KV_OFFLOAD=1``, not modelled) with ``cpu_bytes_to_use = S x 2^30``: one budget for the
whole engine, "the total buffer size summed across all TP ranks" (``config/cache.py`` L383-387), not per rank.
``CPUOffloadingSpec.__init__`` (``v1/kv_offload/cpu/spec.py`` L97-130) sizes it::

    num_copies        = 1 if replicated_layout else world_size            (world_size = TP x PP)
    kv_bytes_per_chunk = worker_kv_bytes_per_block x num_copies x blocks_per_chunk
    num_chunks        = int(cpu_bytes_to_use) // round_up(kv_bytes_per_chunk, mmap.PAGESIZE)

with ``worker_kv_bytes_per_block`` = the worker's GPU KV tensor bytes over its blocks, i.e. vLLM's
``bytes_per_block`` (``distributed/kv_transfer/kv_connector/v1/offloading/config.py`` L175-189: every
``KVCacheTensor`` of a worker records the whole allocation, ``v1/core/kv_cache_planning.py`` L680-735),
``blocks_per_chunk`` 1 (``--kv-offloading-size`` sets no ``blocks_per_chunk`` / ``block_size`` extra config), and
``replicated_layout`` (L194-207) for an MLA model whose TP ranks all hold the same latent (``kv_tp_replicas ==
TP > 1``) at PP 1 on one node: then the ranks share one copy.  On CUDA the host blocks are one ``/dev/shm``
region of ``num_chunks x round_up(kv_bytes_per_chunk, PAGESIZE)`` bytes per engine (``SharedOffloadRegion``,
``v1/kv_offload/cpu/shared_offload_region.py`` L107-130), registered with CUDA (pinned); each worker's slice of a
chunk is ``kv_bytes_per_chunk // num_copies`` bytes.  vLLM checks no host memory for it: kvpools checks the
region against the node as :mod:`kvpools_core.pipeline.host` measures it.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from kvpools_core.engines.vllm.planning import KVCacheGroupSpec, VllmKVCachePlan, is_block_outermost
from kvpools_core.errors import ConfigError, InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.vllm.specs import AttentionSpec, MLAAttentionSpec, UniformTypeKVCacheSpecs
from kvpools_core.pipeline.host import node_memory
from kvpools_core.units import MAX_BYTES, format_bytes
from kvpools_core.values import HostMemory

GiB = 1 << 30
MMAP_PAGESIZE = 4096
"""``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE`` on x86-64 / aarch64 Linux with 4 KiB pages."""
OFFLOADING_BACKENDS = ("native", "lmcache")
"""``KVOffloadingBackend`` of ``config/cache.py`` L389."""
OFFLOAD_PLATFORMS = ("cuda",)
"""Where the shared pinned region is what vLLM allocates: ``_uses_shared_region`` (CUDA, XPU; not ROCm)."""


@attrs.frozen(kw_only=True)
class VllmCpuOffload:
    """vLLM's CPU offload tier of one engine, as ``CPUOffloadingSpec`` sizes it.

    ``num_cpu_blocks`` is ``num_chunks`` (one GPU block per chunk); ``host_tokens`` the tokens those blocks hold
    (``num_cpu_blocks x block_size``; the KV-cache groups of a hybrid model share the blocks as on the GPU).
    ``bytes_per_rank`` is one worker's slice of the region, ``region_bytes`` the whole ``/dev/shm`` region the
    engine's workers pin on the node (page-aligned chunks; a replicated layout shares one copy).
    """

    kv_offloading_size: float
    backend: str
    cpu_bytes_to_use: int
    world_size: int
    replicated_layout: bool
    worker_kv_bytes_per_block: int
    blocks_per_chunk: int
    kv_bytes_per_chunk: int
    aligned_kv_bytes_per_chunk: int
    num_cpu_blocks: int
    block_size: int
    memory: HostMemory | None = None

    @property
    def num_copies(self) -> int:
        return 1 if self.replicated_layout else self.world_size

    @property
    def host_tokens(self) -> int:
        return self.num_cpu_blocks * self.blocks_per_chunk * self.block_size

    @property
    def bytes_per_rank(self) -> int:
        """One worker's slice: ``num_chunks x cpu_page_size_per_worker`` (``kv_bytes_per_chunk // num_copies``)."""
        return self.num_cpu_blocks * (self.kv_bytes_per_chunk // self.num_copies)

    @property
    def region_bytes(self) -> int:
        """``SharedOffloadRegion.total_size_bytes``: ``num_chunks x`` the page-aligned chunk."""
        return self.num_cpu_blocks * self.aligned_kv_bytes_per_chunk

    @property
    def rule(self) -> str:
        """vLLM's rule, for the report."""
        return (
            f"vLLM: --kv-offloading-size {self.kv_offloading_size:g} GiB is one absolute budget for the engine "
            f"(all {self.world_size} worker(s) together, not per rank, not a ratio of the GPU cache): "
            f"num_cpu_blocks = int({self.cpu_bytes_to_use:,}) // round_up({self.worker_kv_bytes_per_block:,} B per "
            f"block x {self.num_copies} cop{'y' if self.num_copies == 1 else 'ies'}, {MMAP_PAGESIZE}) = "
            f"{self.num_cpu_blocks:,}; the CPU tier is sized on its own, with no host >= device rule."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kv_offloading_size": self.kv_offloading_size,
            "kv_offloading_backend": self.backend,
            "kv_connector": "OffloadingConnector",
            "cpu_bytes_to_use": self.cpu_bytes_to_use,
            "world_size": self.world_size,
            "replicated_layout": self.replicated_layout,
            "num_copies": self.num_copies,
            "worker_kv_bytes_per_block": self.worker_kv_bytes_per_block,
            "blocks_per_chunk": self.blocks_per_chunk,
            "kv_bytes_per_chunk": self.kv_bytes_per_chunk,
            "aligned_kv_bytes_per_chunk": self.aligned_kv_bytes_per_chunk,
            "num_cpu_blocks": self.num_cpu_blocks,
            "block_size": self.block_size,
            "host_tokens": self.host_tokens,
            "bytes_per_rank": self.bytes_per_rank,
            "region_bytes": self.region_bytes,
            "memory": None if self.memory is None else attrs.asdict(self.memory),
            "rule": self.rule,
        }


def kv_tp_replicas(groups: tuple[KVCacheGroupSpec, ...], tp_size: int) -> int:
    """``kv_cache_groups_tp_replicas`` (``v1/core/kv_cache_planning.py`` L1233-1250) at DCP 1: the gcd over the
    layers of ``tp // max_tp_shards`` (1 for a layer without ``max_tp_shards``)."""
    replicas = tp_size
    for spec in _layer_specs(groups):
        shards = getattr(spec, "max_tp_shards", None) if isinstance(spec, AttentionSpec) else None
        replicas = math.gcd(replicas, 1 if shards is None else max(1, tp_size // shards))
    return replicas


def _layer_specs(groups: tuple[KVCacheGroupSpec, ...]) -> list[Any]:
    specs: list[Any] = []
    for group in groups:
        spec = group.kv_cache_spec
        specs.extend(spec.kv_cache_specs.values() if isinstance(spec, UniformTypeKVCacheSpecs) else [spec])
    return specs


def plan_cpu_offload(
    plan: VllmKVCachePlan,
    *,
    kv_offloading_size: float,
    backend: str,
    tp_size: int,
    pp_size: int,
    block_size: int,
    platform: str,
    host_memory: int | float | str | None = None,
    host_reserve: int | float | str | None = None,
    check: bool = True,
) -> VllmCpuOffload:
    """vLLM's CPU offload for ``plan`` (one engine of ``tp_size x pp_size`` workers on one node), checked
    against the node (``host_memory`` stated, else measured; ``host_reserve`` left free, 0 unless given:
    vLLM reserves nothing).  Refuses what vLLM would not start or kvpools does not model, naming the flag."""
    flag = option("kv_offloading_size")
    if isinstance(kv_offloading_size, bool) or not kv_offloading_size > 0:
        raise ConfigError(
            f"{flag} must be a positive size in GiB, got {kv_offloading_size!r} (vLLM raises 'cpu_bytes_to_use must "
            f"be specified' for 0)."
        )
    if not math.isfinite(kv_offloading_size) or kv_offloading_size * GiB > MAX_BYTES:
        raise ConfigError(
            f"{flag} must be a finite size in GiB of at most {MAX_BYTES // GiB:,} (1 EiB), got {kv_offloading_size!r}."
        )
    if backend not in OFFLOADING_BACKENDS:
        raise ConfigError(f"{option('kv_offloading_backend')} {backend!r}: vLLM 0.33 has {OFFLOADING_BACKENDS}.")
    if backend == "lmcache":
        raise UnsupportedCombinationError(
            f"{option('kv_offloading_backend')} lmcache: vLLM 0.33 connects to a standalone LMCache server "
            f"(LMCacheMPConnector) and does not pass {flag} on (config/vllm.py L1176-1182), so the host cache is that "
            f"server's to size, not this engine's. Plan with {option('kv_offloading_backend')} native."
        )
    if is_block_outermost(plan.kv_cache_layout):
        raise UnsupportedCombinationError(
            f"{flag} with the {plan.kv_cache_layout} KV-cache layout: vLLM offloads packed (block-outermost) caches, "
            "DeepSeek-V4's compressed ones, through per-group chunk and hash-block alignment kvpools does not model "
            f"(offloading/config.py L88-160); plan without {flag}."
        )
    if platform not in OFFLOAD_PLATFORMS:
        raise UnsupportedCombinationError(
            f"{flag} on platform {platform!r}: kvpools models vLLM's CUDA shared pinned region (SharedOffloadRegion, "
            f"_uses_shared_region); ROCm and others keep per-worker CPU tensors it does not size. Use --platform cuda."
        )
    per_block = plan.bytes_per_block
    if len(set(per_block)) > 1:
        raise UnsupportedCombinationError(
            f"{flag} with pipeline stages of different bytes per block {list(per_block)}: vLLM's scheduler sizes the "
            f"offload from stage 0's KVCacheConfig (generate_scheduler_kv_cache_config) while each worker sizes its "
            f"own, so the stages disagree on the host blocks. Balance the stages (--pp-layer-partition) or use PP 1."
        )
    world_size = tp_size * pp_size
    replicas = kv_tp_replicas(plan.groups, tp_size)
    is_mla = any(isinstance(spec, MLAAttentionSpec) for spec in _layer_specs(plan.groups))
    replicated = is_mla and tp_size > 1 and replicas == tp_size and pp_size == 1 and per_block[0] > 0
    copies = 1 if replicated else world_size
    blocks_per_chunk = 1
    chunk = per_block[0] * copies * blocks_per_chunk
    aligned = -(-chunk // MMAP_PAGESIZE) * MMAP_PAGESIZE
    cpu_bytes = int(kv_offloading_size * GiB)
    num_chunks = cpu_bytes // aligned
    if num_chunks == 0:
        raise ConfigError(
            f"{flag} {kv_offloading_size:g} GiB ({cpu_bytes:,} B) holds no block: one offloaded block of all "
            f"{copies} worker cop{'y' if copies == 1 else 'ies'} is {aligned:,} B. Raise {flag}."
        )
    offload = VllmCpuOffload(
        kv_offloading_size=kv_offloading_size,
        backend=backend,
        cpu_bytes_to_use=cpu_bytes,
        world_size=world_size,
        replicated_layout=replicated,
        worker_kv_bytes_per_block=per_block[0],
        blocks_per_chunk=blocks_per_chunk,
        kv_bytes_per_chunk=chunk,
        aligned_kv_bytes_per_chunk=aligned,
        num_cpu_blocks=num_chunks,
        block_size=block_size,
    )
    if not check:
        return offload
    memory = node_memory(host_memory, 0 if host_reserve is None else host_reserve)
    offload = attrs.evolve(offload, memory=memory)
    if offload.region_bytes > memory.usable_bytes:
        raise InsufficientMemoryError(
            f"vLLM's CPU offload region needs {offload.region_bytes:,} B ({format_bytes(offload.region_bytes)}) of "
            f"pinned /dev/shm on the node ({offload.num_cpu_blocks:,} blocks of {aligned:,} B, page aligned); the "
            f"node has "
            f"{memory.available_bytes:,} B ({format_bytes(memory.available_bytes)}) available ({memory.source}) minus "
            f"{format_bytes(memory.reserve_bytes)} ({option('host_reserve')}) = {memory.usable_bytes:,} B. "
            f"{max_fitting_size(memory.usable_bytes, flag)}"
        )
    return offload


def max_fitting_size(usable_bytes: int, flag: str) -> str:
    """The largest ``--kv-offloading-size`` (GiB, to 0.01) whose region fits ``usable_bytes``: the region is at most
    ``int(size x 2^30)`` bytes (whole page-aligned chunks of it)."""
    size = math.floor(usable_bytes / GiB * 100) / 100
    if size > 0:
        return f"{flag} {size:g} (GiB) fits."
    return f"No {flag} of 0.01 GiB or more fits; free host memory or state it with {option('host_memory')}."


__all__ = ["MMAP_PAGESIZE", "VllmCpuOffload", "kv_tp_replicas", "plan_cpu_offload"]
