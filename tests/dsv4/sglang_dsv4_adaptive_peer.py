"""Run SGLang 0.5.23's own DeepSeek-V4 draft-count arithmetic (the peers venv, CPU) for the largest draft count.

Usage: ``python sglang_dsv4_adaptive_peer.py`` with a JSON list of cases on stdin; prints a JSON list.

Each case is ``{"max_draft_tokens", "num_req_slots", "c4_layers", "c128_layers", "online", "head_dim"}`` (a
speculative server: ``max_draft_tokens`` is ``max_speculative_num_draft_tokens()``).  Per case the peer runs,
unchanged, ``DSV4PoolConfigurator._assert_ring_serves_draft_tokens`` and ``_get_c128_state_fixed_bytes`` of
``srt/model_executor/pool_configurator.py`` (the two methods taken by name out of the class with ``ast`` and
called on a stand-in ``self`` holding what ``__init__`` sets: ``ring_sizes`` from ``resolve_compress_state_ring_size``,
``online_c128_mtp_max_draft_tokens``), with ``get_compress_state_ring_size`` / ``get_compress_state_write_pad`` of
``srt/mem_cache/deepseek_v4_memory_pool.py``, and the online c128 ``CompressStatePool`` of
``deepseek_v4_compress_state.py`` (its constructor, the buffer on ``meta``) with ``online_mtp_max_draft_tokens``.
It reports the assertion (or none), the configurator's fixed c128 bytes and one c128 state layer's bytes.  This
file runs in the peers venv, never under pytest.
"""

from __future__ import annotations
import __future__

import ast
import json
import sys
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sglang_peer_stubs import Env, compress_state_pool, extract, sglang_root


def _methods(path: Path, cls: str, names: set[str], namespace: dict[str, Any]) -> None:
    """Exec the methods ``names`` of class ``cls`` in ``path`` as plain functions in ``namespace``."""
    tree = ast.parse(path.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    nodes = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in nodes} == names, f"{cls} has no {sorted(names - {n.name for n in nodes})}"
    code = compile(
        ast.Module(body=nodes, type_ignores=[]), str(path), "exec", flags=__future__.annotations.compiler_flag
    )
    exec(code, namespace)  # SGLang's own source, as installed


def main() -> None:
    cases = json.load(sys.stdin)
    root = sglang_root()
    online = {"on": False}
    envs = types.SimpleNamespace(
        SGLANG_OPT_USE_ONLINE_COMPRESS=types.SimpleNamespace(get=lambda: online["on"]),
        SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=Env(True),
    )
    ns: dict[str, Any] = {
        "envs": envs,
        "ceil_div": lambda a, b: -(-a // b),
        "_get_dsv4_compress_state_dtype_sizes": lambda: (4, 4),  # the default fp32 compressor states
    }
    pool_file = root / "srt/mem_cache/deepseek_v4_memory_pool.py"
    extract(pool_file, {"get_compress_state_ring_size", "get_compress_state_write_pad"}, ns)
    conf_file = root / "srt/model_executor/pool_configurator.py"
    _methods(conf_file, "DSV4PoolConfigurator", {"_assert_ring_serves_draft_tokens", "_get_c128_state_fixed_bytes"}, ns)

    state_cls = compress_state_pool(root)

    out = []
    for case in cases:
        online["on"] = case["online"]
        ns["ONLINE_C128"] = case["online"]
        drafts = case["max_draft_tokens"]
        layers = {4: case["c4_layers"], 128: case["c128_layers"]}
        # DSV4PoolConfigurator.__init__: resolve_compress_state_ring_size(ratio) on a speculative server (any
        # draft count > 0 gives the speculative rings for ratios 4 / 128)
        ring_sizes = {r: ns["get_compress_state_ring_size"](r, 1) for r in (4, 128) if layers[r]}
        stub = types.SimpleNamespace(
            ring_sizes=ring_sizes,
            num_layers=lambda r, layers=layers: layers.get(r, 0),
            online_c128_mtp_max_draft_tokens=drafts,
            attn_head_dim=case["head_dim"],
            _get_num_req_slots=lambda _, slots=case["num_req_slots"]: slots,
        )
        answer: dict[str, Any] = {}
        try:
            ns["_assert_ring_serves_draft_tokens"](stub, drafts)
        except AssertionError as exc:
            answer["assertion"] = str(exc)
        answer["c128_fixed_bytes"] = ns["_get_c128_state_fixed_bytes"](stub, 0)
        if case["online"] and layers[128]:
            state = state_cls(
                size=case["num_req_slots"],
                ring_size=1,
                overlap=False,
                head_dim=case["head_dim"],
                dtype=torch.float32,
                device="meta",
                enable_memory_saver=False,
                ratio=128,
                online=True,
                request_scoped=True,
                online_mtp_max_draft_tokens=drafts,
            )
            buf = state.kv_score_buffer.kv_score
            answer["c128_state_layer_bytes"] = buf.numel() * buf.element_size()
        out.append(answer)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
