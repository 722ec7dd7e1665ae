"""How the DeepSeek-V4 tests run a peer script (``sglang_*_peer.py``) and describe a plan's stage to it.

A peer script runs in the peers venv (``tests.oracle.locate.require_sglang_peer``), reads its request as JSON on
stdin and prints its answer as JSON; ``sglang_peer_stubs.py`` is what the scripts share on that side.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from kvpools_plugins.dsv4.encoder_replay import local_chunk

from kvpools_core.values import Plan


def run_peer(python: Path, peer: Path, request: Any, *args: str) -> Any:
    """The answer of ``peer`` run by the peers venv's ``python`` (``args`` on its command line) for ``request``."""
    done = subprocess.run(
        [str(python), str(peer), *args], input=json.dumps(request), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def configurator_case(p: Plan) -> dict[str, Any]:
    """A DeepSeek-V4.1 plan's stage as ``sglang_peer_stubs.configurator_kvc`` reads it (one stage, no drafting)."""
    params = p.model.params
    first = p.model.layers[0].params
    return {
        "compress_ratios": list(params["compress_ratios"]),
        "kv_source_layer_ids": list(params["kv_source_layer_ids"]),
        "num_layers": len(p.model.layers),
        "qk_nope_head_dim": int(first["qk_nope_head_dim"]),
        "qk_rope_head_dim": int(first["qk_rope_head_dim"]),
        "index_head_dim": int(params["index_head_dim"]),
        "window": int(first["window_size"]),
        "page_size": p.serving.page_size,
        "context_len": p.serving.context_length or p.model.context_len,
        "max_running_requests": p.serving.max_running_requests,
        "attn_dp_size": p.serving.attn_dp_size,
        "chunked_prefill_size": local_chunk(p.serving),
    }
