"""The example distribution's ``example_parts`` plugin: a third-party architecture and platform from the parts alone.

``kvpools_example_parts`` (tests/plugins/example, its own distribution) imports
nothing but public ``kvpools_core`` modules (``test_boundaries`` scans it).
Here it plans and builds with no built-in plugin loaded at all, to the bytes
its plan charges, by hand-computed numbers; and its platform carves a
built-in architecture's pools layer-major without that architecture knowing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpools_core import Serving, build, plan

TOY = {
    "model_type": "toy-hybrid",
    "num_hidden_layers": 8,
    "attention_every": 4,  # layers 3 and 7 are attention, the other 6 recurrent
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "state_bytes": 65_536,
    "max_position_embeddings": 8192,
}


@pytest.fixture
def toy_config(tmp_path: Path) -> str:
    path = tmp_path / "toy-hybrid.json"
    path.write_text(json.dumps(TOY))
    return str(path)


def test_cell_by_hand(toy_config: str) -> None:
    # 2 attention layers x 4 KV heads x (128 + 128) x 2 B (bf16) = 4,096 B/token; TP 2 halves the heads.
    # 6 recurrent layers x 65,536 B = 393,216 B per request, whatever the TP (the toy does not shard state).
    one = plan(toy_config, Serving(platform="cpu"), memory="1GiB")
    assert (one.cell.bytes_per_token, one.cell.bytes_per_request) == (4096, 393_216)
    two = plan(toy_config, Serving(platform="cpu", tp_size=2), memory="1GiB")
    assert (two.cell.bytes_per_token, two.cell.bytes_per_request) == (2048, 393_216)
    state = one.pool("toy_state")
    assert (state.padding_slots, state.bytes) == (1, (one.max_running_requests + 1) * 393_216)
    assert one.provenance["estimate_cell_size"] == ("example_parts",)
    assert one.cost.bytes_for(**one.counts) == one.planned_bytes


def test_builds_real_pools_that_hold_what_is_written(toy_config: str) -> None:
    import torch

    small = plan(toy_config, Serving(platform="cpu", max_total_tokens=64, max_running_requests=4), memory="1GiB")
    pools = build(small, "cpu")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in small.pools}
    kv = pools.kv_pool
    k, _ = kv.get_kv_buffer(7)  # a global layer id
    assert tuple(k.shape) == (64 + 1, 4, 128) and k.dtype == torch.bfloat16
    kv.kv.set_kv_buffer(1, torch.tensor([5]), torch.ones(1, 4, 128), torch.full((1, 4, 128), 2.0))
    assert torch.equal(kv.get_kv_buffer(7)[1][5], torch.full((4, 128), 2.0, dtype=torch.bfloat16))
    assert tuple(kv.get_state(0).shape) == (4 + 1, 65_536)
    with pytest.raises(KeyError):
        kv.get_state(3)  # an attention layer keeps no state


_ALONE = """
import json, sys
from kvpools_core import Serving, build, get_registry, plan
loaded = sorted(p.name for p in get_registry().plugins() if p.status == "loaded")
result = plan(sys.argv[1], Serving(platform="toy-npu"), memory="1GiB")
pools = build(result, "meta")
print(json.dumps({
    "loaded": loaded,
    "built": pools.allocated_by_pool(),
    "planned": {p.name: p.bytes for p in result.pools},
    "layout": pools.layout.name,
    "provenance": {k: list(v) for k, v in pools.provenance.items()},
    "builtin_modules": sorted(m for m in sys.modules if m.startswith("kvpools_plugins")),
}))
"""


def test_plans_and_builds_with_no_builtin_plugin_loaded(toy_config: str) -> None:
    env = {**os.environ, "KVPOOLS_DISABLE_PLUGIN_AUTOLOAD": "1", "KVPOOLS_PLUGINS": "example_parts"}
    done = subprocess.run(
        [sys.executable, "-c", _ALONE, toy_config], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["loaded"] == ["core", "example_parts"]
    assert out["builtin_modules"] == []  # no built-in plugin was even imported
    assert out["built"] == out["planned"]
    assert out["layout"] == "layer_major"
    assert out["provenance"]["buffer_layout"] == ["example_parts"]


def test_its_platform_carves_a_builtin_architecture_layer_major() -> None:
    result = plan("llama-3.1-8b", Serving(platform="toy-npu", max_total_tokens=4096), memory="8GiB")
    pools = build(result, "meta")
    assert pools.layout.name == "layer_major"
    assert pools.provenance["buffer_layout"] == ("example_parts",)
    assert pools.provenance["build_pool"] == ("mha",)
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    keys = [pools.kv_pool.get_key_buffer(layer) for layer in range(32)]
    assert {id(k._base) for k in keys} == {id(keys[0]._base)} and keys[0]._base is not None
    assert tuple(keys[0]._base.shape) == (32, 4096 + 1, 8, 128)
