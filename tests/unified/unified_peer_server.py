"""SGLang 0.5.23's own unified memory pool and multi-ended allocators, driven over stdin/stdout.

Run by the peers venv's python (SGLang is not a kvpools dependency).  The real
installed ``unified_memory_pool.py`` (``UnifiedKVPool``, the sub-pool specs,
``_reserved_floor_bytes``), ``allocator/unified_sub_pool.py``
(``MultiEndedAllocator``), ``allocator/unified_mamba.py`` and
``allocator/unified_hybrid_swa.py`` are imported through the shared
``bench/peer_imports.py``; what they import but never use on a CPU (Triton
kernels, the memory saver, the static KV pool classes they subclass, the
runtime context) is answered by inert stand-ins, and ``msgspec`` (not
installed there) by a dataclass stand-in.  One JSON request per line; every
reply is the pool's state (see ``state``).

usage: python unified_peer_server.py <shared bench dir>
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import inspect
import json
import sys
import types


def _msgspec_standin() -> None:
    """``msgspec.Struct`` as frozen/kw-only dataclasses (all the layout modules use of it)."""

    class Struct:
        _ms_frozen = False
        _ms_kw_only = False

        def __init_subclass__(cls, frozen=None, kw_only=None, **kw):
            super().__init_subclass__()
            cls._ms_frozen = cls._ms_frozen if frozen is None else frozen
            cls._ms_kw_only = cls._ms_kw_only if kw_only is None else kw_only
            for name in list(inspect.get_annotations(cls)):
                val = cls.__dict__.get(name, dataclasses.MISSING)
                if isinstance(val, (dict, list, set)):
                    setattr(cls, name, dataclasses.field(default_factory=lambda v=val: copy.copy(v)))
            dataclasses.dataclass(frozen=cls._ms_frozen, kw_only=cls._ms_kw_only)(cls)

    mod = types.ModuleType("msgspec")
    mod.Struct = Struct
    mod.field = dataclasses.field
    structs = types.ModuleType("msgspec.structs")
    structs.replace = dataclasses.replace
    mod.structs = structs
    sys.modules.setdefault("msgspec", mod)
    sys.modules.setdefault("msgspec.structs", structs)


class _NoSaver:
    @staticmethod
    def create(enable=False):
        return _NoSaver()

    def region(self, *a, **k):
        return contextlib.nullcontext()


def import_unified():
    """The installed modules: (unified_memory_pool, unified_sub_pool, unified_mamba, unified_hybrid_swa)."""
    import peer_imports as pi  # type: ignore[import-not-found]

    _msgspec_standin()
    pi.import_sglang_allocators()
    for name in (
        "triton",
        "sglang.kernels.ops.kvcache",
        "sglang.srt.constants",
        "sglang.srt.mem_cache.kv_vmm_backing",
        "sglang.srt.mem_cache.memory_pool",
        "sglang.srt.mem_cache.swa_memory_pool",
        "sglang.srt.mem_cache.allocator.swa",
        "sglang.srt.observability",
        "sglang.srt.utils.invariants",
        "sglang.srt.mem_cache.hybrid_cache",
        "packaging",
    ):
        pi._STUB.add(name)
    pi._STUB.add("sglang.srt.utils.torch_memory_saver_adapter", TorchMemorySaverAdapter=_NoSaver)
    pi._STUB.add(
        "sglang.srt.runtime_context",
        get_parallel=lambda: types.SimpleNamespace(attn_dcp_size=1, attn_dcp_rank=0),
    )
    pi._STUB.add("sglang.srt.utils.common", **pi._sglang_utils_attrs())
    names = (
        "unified_memory_pool",
        "allocator.unified_sub_pool",
        "allocator.unified_mamba",
        "allocator.unified_hybrid_swa",
    )
    for _ in range(30):
        try:
            return tuple(importlib.import_module(f"sglang.srt.mem_cache.{n}") for n in names)
        except ModuleNotFoundError as exc:  # a third-party module the path imports but never uses
            pi._STUB.add(exc.name)
            for key in [k for k in sys.modules if ".unified" in k or ".layout" in k]:
                del sys.modules[key]
    raise ImportError("could not import SGLang's unified pool")


def import_kv_cache_hook():
    """``arg_groups/kv_cache_hook.py`` with its server-args accessors answered by the request's plain fields."""
    import peer_imports as pi  # type: ignore[import-not-found]

    pi._BARE.add("sglang.srt.arg_groups")
    for name in ("sglang.srt.arg_groups.overrides", "sglang.srt.configs", "sglang.srt.model_executor"):
        pi._STUB.add(name)
    hook = importlib.import_module("sglang.srt.arg_groups.kv_cache_hook")
    hook.resolving_view = hook.resolved_view = lambda sa: sa
    hook.model_config_of = lambda sa: sa
    hook.use_mla_backend = lambda sa: sa.is_mla
    hook.attention_backends_of = lambda sa: list(sa.attention_backends)
    hook.mambaish_config = lambda mc: object() if mc.is_mamba else None
    return hook


class _KV:
    """The KV / state pools the allocators hold: page moves and zeroing are not observed here."""

    def move_physical_pages(self, *a, **k):
        pass

    def zero_physical_pages(self, *a, **k):
        pass


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    import torch

    ump, _sub, um, uswa = import_unified()
    # the static-split parent (allocator/swa.py) is a stand-in, so give the composite what it inherits through it
    # from base.py: `_copy_for_free_group` clones the deferred ids
    uswa.UnifiedSWAAllocatorBase._copy_for_free_group = staticmethod(lambda t: t.clone())
    pool = alloc = None
    members: dict = {}

    def spec(d: dict):
        if d["kind"] == "mha":
            return ump.MHASubPoolSpec(
                name=d["name"],
                layer_num=d["layers"],
                grow_direction=d["grow"],
                head_num=d["heads"],
                head_dim=d["head_dim"],
                v_head_dim=d.get("v_head_dim"),
                store_dtype=torch.bfloat16,
            )
        if d["kind"] == "mla":
            return ump.MLASubPoolSpec(
                name=d["name"],
                layer_num=d["layers"],
                grow_direction=d["grow"],
                kv_lora_rank=d["rank"],
                qk_rope_head_dim=d["rope"],
                store_dtype=torch.bfloat16,
            )
        return ump.MambaSubPoolSpec(
            name=d["name"],
            layer_num=d["layers"],
            grow_direction=d["grow"],
            conv_state_shapes=tuple(tuple(s) for s in d["conv"]),
            conv_dtype=torch.bfloat16,
            temporal_state_shape=tuple(d["temporal"]),
            temporal_dtype=torch.float32,
        )

    def state() -> dict:
        out = {"available": alloc.available_size()}
        for key, m in members.items():
            out[key] = {
                "wm": m.watermark_physical,
                "avail": m.available_size(),
                "sched": m.schedulable_available_size(),
                "holes": sorted(m._free_phys_pages.tolist()),
                "v2p": m.virtual_to_physical.tolist(),
                "p2v": m.physical_to_virtual.tolist(),
                "live": m.allocated_count(),
                "fv": None if m.free_virtual_ids is None else m.free_virtual_ids.tolist(),
                "span": [m.low_wm_page, m.high_wm_page] if hasattr(m, "low_wm_page") else None,
            }
        return out

    hook = None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        op, out = req["op"], None
        t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
        if op == "refuse":
            import os

            hook = hook or import_kv_cache_hook()
            args = dict(req["args"])
            os.environ["SGLANG_DISABLE_LAZY_COMPACTION"] = "0" if args.pop("lazy_compaction") else "1"
            cfg = types.SimpleNamespace(
                enable_unified_memory=True,
                cuda_graph_config=None,
                speculative_draft_attention_backend=None,
                _unified_memory_pd_transfer_backends=lambda: {"mooncake"},
                **args,
            )
            try:
                hook.handle_unified_memory_pool(cfg)
                error = None
            except AssertionError as exc:
                error = str(exc)
            print(json.dumps({"error": error}), flush=True)
            continue
        if op in ("page_major", "ple", "signatures", "envelope"):  # layouts and side states: peer_layout.py
            import peer_layout  # type: ignore[import-not-found]

            hook = hook or import_kv_cache_hook()
            print(json.dumps(peer_layout.answer(op, req, hook=hook, ump=ump)), flush=True)
            continue
        if op == "sizes":
            specs = [spec(d) for d in req["specs"]]
            reply = {
                "entry": {s.name: s.entry_bytes() for s in specs},
                "sink": ump._reserved_floor_bytes(specs, req["page"]),
            }
            try:
                p = ump.UnifiedKVPool(
                    total_bytes=req["total"],
                    sub_pool_specs=specs,
                    device="meta",
                    enable_memory_saver=False,
                    page_size=req["page"],
                )
                reply["max_slots"] = {s.name: p.max_slots(s.name) for s in specs}
                reply["min_slot"] = {s.name: p.min_slot_index(s.name) for s in specs}
            except (RuntimeError, ValueError, AssertionError) as exc:
                reply["error"] = str(exc)
            try:
                for s in specs:
                    if hasattr(s, "layout"):
                        s.layout()
            except ValueError as exc:
                reply["row_error"] = str(exc)
            print(json.dumps(reply), flush=True)
            continue
        if op == "views":  # every sub-pool's per-layer views on meta: (byte offset, rows, slot stride in bytes)
            specs = [spec(d) for d in req["specs"]]
            p = ump.UnifiedKVPool(
                total_bytes=req["total"], sub_pool_specs=specs, device="meta", enable_memory_saver=False,
                page_size=req["page"],
            )  # fmt: skip

            def geo(v):
                return [v.storage_offset() * v.element_size(), v.shape[0], v.stride(0) * v.element_size()]

            reply = {}
            for s in specs:
                if s.name in p._mha_views:
                    k, v = p.mha_views_for(s.name)
                    reply[s.name] = [[geo(a), geo(b)] for a, b in zip(k, v, strict=True)]
                elif s.name in p._mla_views:
                    reply[s.name] = [[geo(a)] for a in p.mla_views_for(s.name)]
                elif s.name in p._mamba_views:  # part-major: [conv[0] x L | ... | temporal x L], + each row's bytes
                    conv, temporal = p.mamba_views_for(s.name)
                    reply[s.name] = [
                        [[*geo(t[layer]), t[layer][0].numel() * t.element_size()] for t in (*conv, temporal)]
                        for layer in range(s.layer_num)
                    ]
            print(json.dumps(reply), flush=True)
            continue
        if op == "new":
            specs = [spec(d) for d in req["specs"]]
            pool = ump.UnifiedKVPool(
                total_bytes=req["total"],
                sub_pool_specs=specs,
                device="cpu",
                enable_memory_saver=False,
                page_size=req["page"],
            )
            kv = types.SimpleNamespace(
                full_kv_pool=_KV(), mamba_pool=_KV(), swa_kv_pool=_KV(), attach_allocators=lambda **k: None
            )
            if req["composite"] == "mamba":
                alloc = um.UnifiedMambaTokenToKVPoolAllocator(
                    unified_buffer=pool,
                    kvcache=kv,
                    device="cpu",
                    page_size=req["page"],
                    lazy_compaction=req["lazy"],
                )
                members = {"full": alloc.full_attn_allocator, "mamba": alloc.mamba_allocator}
            elif req["composite"] == "tri":
                alloc = uswa.UnifiedMambaSWATokenToKVPoolAllocator(
                    unified_buffer=pool,
                    kvcache=kv,
                    mamba_kvcache=_KV(),
                    device="cpu",
                    full_max_total_num_tokens=req["full_tokens"],
                    swa_max_total_num_tokens=req["swa_tokens"],
                    page_size=req["page"],
                    lazy_compaction=req["lazy"],
                )
                members = {
                    "full": alloc.full_attn_allocator,
                    "swa": alloc.swa_attn_allocator,
                    "mamba": alloc.mamba_allocator,
                }
            else:
                alloc = uswa.UnifiedSWATokenToKVPoolAllocator(
                    unified_buffer=pool,
                    kvcache=kv,
                    device="cpu",
                    page_size=req["page"],
                    lazy_compaction=req["lazy"],
                )
                members = {"full": alloc.full_attn_allocator, "swa": alloc.swa_attn_allocator}
            reply = state()
            if req["composite"] == "mamba":
                reply["size_full"] = alloc.size_full
                reply["cost"] = alloc.mamba_slot_full_token_cost()
                reply["size_mamba"] = alloc.size_mamba
            else:
                # the static-split parent is a stand-in here: read the composite's own fields
                reply["size_full"], reply["size_swa"] = alloc._size_full, alloc._size_swa
                if req["composite"] == "tri":
                    reply["cost"] = alloc.mamba_slot_full_token_cost()
            print(json.dumps(reply), flush=True)
            continue
        if op == "alloc":
            out = alloc.alloc(req["n"])
        elif op == "free":
            alloc.free(t(req["ids"]))
        elif op == "free_swa":
            alloc.free_swa(t(req["ids"]))
        elif op == "group_begin":
            alloc.free_group_begin()
        elif op == "group_end":
            alloc.free_group_end()
        elif op == "free_full":
            alloc.free_full(t(req["ids"]))
        elif op == "mamba_alloc":
            out = alloc.mamba_allocator.alloc(req["n"])
        elif op == "mamba_free":
            alloc.mamba_allocator.free(t(req["ids"]))
        elif op == "flush":
            members[req["member"]].flush_opportunistic()
        elif op == "flush_urgent":
            members[req["member"]].flush_for_allocation()
        elif op == "translate":
            out = members[req["member"]].translate_kv_loc(t(req["ids"]))
        reply = state()
        reply["out"] = None if out is None else out.tolist()
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
