"""What the DeepSeek-V4 peer scripts (``sglang_*_peer.py``) share to run SGLang 0.5.23's own code in the peers venv.

The scripts take SGLang's functions and classes from the installed files by name (``ast``) and run them unchanged;
only their module globals are stand-ins, because the modules' own imports need SGLang's whole dependency tree.  This
module holds the loaders and the stand-ins two or more scripts use.  It runs in the peers venv, never under pytest:
each script is run as ``python <script>`` (its folder first on ``sys.path``), and inserts its folder to import this
module however it is started.
"""

from __future__ import annotations
import __future__

import ast
import dataclasses
import importlib.util
import logging
import sys
import types
from collections.abc import Callable
from math import gcd
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any, Optional

import torch

DSV4_POOL_FUNCTIONS = {
    "ONLINE_C128",
    "get_dsv4_indexer_bytes_per_token",
    "get_compress_state_ring_size",
    "resolve_compress_state_ring_size",
    "collect_sources_by_ratio",
    "get_compress_state_write_pad",
    "uses_draft_swa_ring",
    "get_draft_swa_ring_size",
    "get_swa_ring_size",
    "_num_dsv4_physical_kv_pages",
    "resolve_compressed_kv_layout",
}
"""What ``DSV4PoolConfigurator`` calls of ``srt/mem_cache/deepseek_v4_memory_pool.py``."""


def sglang_root() -> Path:
    """The installed ``sglang`` package's folder."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


def load_kv_layout(root: Path) -> types.ModuleType:
    """``kernels/ops/attention/dsv4/kv_layout.py`` loaded as it is (its imports are light)."""
    name = "sglang.kernels.ops.attention.dsv4.kv_layout"
    spec = importlib.util.spec_from_file_location(name, root / "kernels/ops/attention/dsv4/kv_layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def extract(path: Path, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Exec the top-level functions, classes and assignments ``names`` of ``path`` in ``namespace``."""
    tree = ast.parse(path.read_text())
    nodes = []
    for node in tree.body:
        named = isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names
        assigned = isinstance(node, ast.Assign) and any(getattr(t, "id", None) in names for t in node.targets)
        if named or assigned:
            nodes.append(node)
    found = {getattr(n, "name", None) for n in nodes} | {
        t.id for n in nodes if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }
    missing = names - found
    assert not missing, f"{path.name} has no {sorted(missing)}"
    # postponed annotations, as the modules declare them: no typing names are needed
    code = compile(
        ast.Module(body=nodes, type_ignores=[]), str(path), "exec", flags=__future__.annotations.compiler_flag
    )
    exec(code, namespace)  # SGLang's own source, as installed
    return namespace


class Env:
    """An ``envs.SGLANG_*`` switch: ``.get()`` answers ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class NoSpec:
    """``SpeculativeAlgorithm.NONE``: no draft (speculative decoding is refused on V4.1 but for DSpark)."""

    def is_dspark(self) -> bool:
        return False

    def is_eagle(self) -> bool:
        return False

    def is_none(self) -> bool:
        return True


def fake_module(name: str, **attrs: Any) -> None:
    """Register module ``name`` (and its parents) holding ``attrs``, for the imports of the code taken."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


def compress_state_pool(root: Path) -> type:
    """``CompressStatePool`` of ``srt/mem_cache/deepseek_v4_compress_state.py`` as installed (its constructor sizes
    the rows), its buffer allocated on ``meta``."""
    namespace: dict[str, Any] = {"torch": torch, "gcd": gcd, "_is_hip": False, "dataclasses": dataclasses}
    names = {"_lcm", "KVAndScore", "CompressStatePool"}
    extract(root / "srt/mem_cache/deepseek_v4_compress_state.py", names, namespace)
    pool: type = namespace["CompressStatePool"]

    def alloc_on_meta(self: Any, *, dtype: torch.dtype, device: str, enable_memory_saver: bool) -> None:
        self.kv_score_buffer = namespace["KVAndScore"](
            torch.empty((self._size, self.last_dim), dtype=dtype, device="meta")
        )

    pool._alloc_kv_score_buffer = alloc_on_meta  # type: ignore[attr-defined]
    return pool


class LayoutQuery:
    """What ``select_dsv4_kv_layout`` reads, set per case: ``SGLANG_DSV4_KV_LAYOUT`` /
    ``SGLANG_DSV4_COMPRESSED_KV_LAYOUT``, ``get_exec().kernel.dsv4_attn_backend`` and a CUDA GPU's compute capability
    major (``torch.cuda.get_device_capability``)."""

    def __init__(self) -> None:
        self.env = {"SGLANG_DSV4_KV_LAYOUT": Env("auto"), "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": Env("auto")}
        self.kernel = NS(dsv4_attn_backend=None)
        self.major = 10

    def set(self, mode: str, option: str, major: int, backend: str | None = None) -> None:
        self.env["SGLANG_DSV4_KV_LAYOUT"].value = mode
        self.env["SGLANG_DSV4_COMPRESSED_KV_LAYOUT"].value = option
        self.major = major
        self.kernel.dsv4_attn_backend = backend

    def namespace(self, kv: types.ModuleType, **envs: Any) -> dict[str, Any]:
        """The memory-pool module's globals the selection reads (``envs``: more switches)."""
        return {
            "__name__": "sglang_dsv4_pool_functions",
            "KVLayout": kv.KVLayout,
            "envs": NS(**self.env, **envs),
            "get_exec": lambda: NS(kernel=self.kernel),
            "torch": NS(
                cuda=NS(is_available=lambda: True, get_device_capability=lambda: (self.major, 0)),
                version=NS(cuda="12.9"),
            ),
            "_is_hip": False,
        }


def configurator_globals(
    root: Path, kv: types.ModuleType, envs: Any, state: dict[str, Any], logger: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The module globals ``pool_configurator.py``'s DeepSeek-V4 code reads, and the memory-pool functions it calls
    (:data:`DSV4_POOL_FUNCTIONS`, taken from the installed file): ``(globals, memory pool namespace)``.  The
    server-args accessors (``get_exec``, ``get_schedule``, ...) answer ``state``'s entries of the same name."""
    common: dict[str, Any] = {
        "torch": torch,
        "Optional": Optional,
        "dataclass": dataclasses.dataclass,
        "logger": logging.getLogger(logger),
        "envs": envs,
        "KVLayout": kv.KVLayout,
        "_is_hip": False,
        "_is_npu": False,
        "get_exec": lambda: state["exec"],
        "get_schedule": lambda: state["schedule"],
        "get_spec": lambda: state["spec"],
        "get_memory": lambda: state["memory"],
        "get_disagg": lambda: state["disagg"],
        "max_speculative_num_draft_tokens": lambda: None,
    }
    utils = extract(root / "srt/utils/common.py", {"ceil_align", "ceil_div"}, dict(common))
    common.update(ceil_align=utils["ceil_align"], ceil_div=utils["ceil_div"])
    pool = extract(root / "srt/mem_cache/deepseek_v4_memory_pool.py", DSV4_POOL_FUNCTIONS, dict(common))
    common.update({name: pool[name] for name in DSV4_POOL_FUNCTIONS})
    return common, pool


def fake_dsv4_imports(pool: dict[str, Any], select_dsv4_kv_layout: Callable[[], Any], **more: Any) -> None:
    """The modules ``DSV4PoolConfigurator`` imports inside its methods: the memory pool's layout selection (and
    ``more`` of its names) and the unified-KV gate, both off."""
    fake_module(
        "sglang.srt.mem_cache.deepseek_v4_memory_pool",
        select_dsv4_kv_layout=select_dsv4_kv_layout,
        resolve_compressed_kv_layout=pool["resolve_compressed_kv_layout"],
        dsv4_unified_row_bytes=lambda nope, rope, fp8: 0,
        **more,
    )
    fake_module(
        "sglang.srt.layers.attention.dsv4.unified_kv_gate",
        is_unified_kv_fp8=lambda: False,
        is_unified_kv_triton=lambda: False,
    )


def configurator_kvc(case: dict[str, Any]) -> NS:
    """The ``KVCacheConfigurator`` fields ``DSV4PoolConfigurator(kvc)`` reads, for one stage of a case (the keys
    the scripts' docstrings list): no drafting, one pipeline stage of ``num_layers``."""
    return NS(
        kv_cache_dtype_str="auto",
        model_config=NS(
            qk_nope_head_dim=case["qk_nope_head_dim"],
            qk_rope_head_dim=case["qk_rope_head_dim"],
            index_head_dim=case["index_head_dim"],
            context_len=case["context_len"],
            compress_ratios=case["compress_ratios"],
            window_size=case["window"],
            hf_config=NS(kv_source_layer_ids=case["kv_source_layer_ids"]),
        ),
        layer_info=NS(start_layer=0, end_layer=case["num_layers"]),
        pp_size=1,
        spec_algorithm=NoSpec(),
        spec_aux_config=NS(dspark_num_stages=None, dflash_draft_num_layers=None),
        sliding_window_size=case["window"],
        page_size=case["page_size"],
        attn_dp_size=case["attn_dp_size"],
    )
