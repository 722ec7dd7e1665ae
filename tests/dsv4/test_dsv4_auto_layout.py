"""``--dsv4-kv-layout auto`` resolved from the planned GPU's compute capability (issue 33).

SGLang 0.5.23's ``select_dsv4_kv_layout`` (``srt/mem_cache/deepseek_v4_memory_pool.py`` L198-241) returns V4.1
with the compressed option for ``auto`` on CUDA when ``torch.cuda.get_device_capability()[0] == 10`` (SM100 /
SM103), ``(V4, None)`` otherwise.  kvpools resolves ``auto`` from the catalogue GPU's compute capability under
``--gpu`` and plans V4 (with a note) without one.  The peer check runs SGLang's own function (the peers venv).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kvpools_plugins.dsv4.layouts import V4, V41, compressed_layout, main_layout

from kvpools_core import Serving
from kvpools_core.pipeline import plan
from kvpools_core.pipeline.gpus import accelerators
from kvpools_core.pipeline.platforms import resolve_platform_traits
from kvpools_core.registry import get_registry
from kvpools_core.values import Plan, PlatformTraits
from tests.oracle import locate

FLASH = "deepseek-v4-flash"
PEER = Path(__file__).with_name("sglang_dsv4_layout_peer.py")


def _notes(p: Plan) -> list[str]:
    return [note for note in p.sizing.notes if "auto planned as" in note]


def _on(capability: tuple[int, int] | None, **options: Any) -> Serving:
    return Serving(platform_traits=PlatformTraits(platform="cuda", compute_capability=capability), **options)


def test_the_catalogue_gives_blackwell_compute_capability_10() -> None:
    cuda = {gpu.name: gpu for gpu in accelerators() if gpu.platform == "cuda"}
    assert cuda["b200"].compute_capability == (10, 0) and cuda["gb200"].compute_capability == (10, 0)
    assert {cuda[name].compute_capability for name in ("h100", "h100-pcie", "h100-nvl", "h200", "gh200")} == {(9, 0)}
    assert all(gpu.compute_capability is not None and gpu.capability_source for gpu in cuda.values())


def test_auto_on_b200_plans_v41_and_says_so() -> None:
    p = plan(FLASH, Serving(tp_size=4), gpu="b200")
    assert p.serving.platform_traits is not None and p.serving.platform_traits.compute_capability == (10, 0)
    assert main_layout(p.serving) is V41 and compressed_layout(p.serving, 4) is V41
    swa = p.sizing.sglang_config["swa_max_total_num_tokens"]
    # V4.1: 256 x 528 = 135,168 B a page (264 x 512), ceil((swa + 256) / 256) pages, 43 layers
    assert p.pool("kv_swa").bytes == -(-(swa + 256) // 256) * 135_168 * 43
    assert _notes(p) == [
        "dsv4_kv_layout auto planned as v41: the GPU's compute capability is 10.0, an SM100 / SM103 GPU "
        "(SGLang's select_dsv4_kv_layout)."
    ]
    # the plan on disk keeps the GPU's capability, so a reloaded plan resolves the same layout
    again = Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert main_layout(again.serving) is V41


def test_auto_on_h200_and_without_a_gpu_plans_v4() -> None:
    h200 = plan(FLASH, Serving(tp_size=4), gpu="h200")
    assert main_layout(h200.serving) is V4
    assert "compute capability is 9.0, not an SM100 / SM103 GPU" in _notes(h200)[0]
    bare = plan(FLASH, Serving(tp_size=4), memory="60GiB")
    assert main_layout(bare.serving) is V4
    assert "kvpools does not know the GPU" in _notes(bare)[0]
    assert "a Blackwell (compute capability 10.x) server gets v41" in _notes(bare)[0]


def test_an_explicit_layout_is_kept_on_any_gpu() -> None:
    p = plan(FLASH, Serving(tp_size=4, dsv4_kv_layout="v4"), gpu="b200")
    assert main_layout(p.serving) is V4 and not _notes(p)
    assert main_layout(_on((9, 0), dsv4_kv_layout="v41")) is V41


def test_the_platform_plugin_keeps_the_gpus_capability() -> None:
    """The CUDA plugin answers its traits without a capability; the pipeline keeps the GPU's."""
    resolved = resolve_platform_traits(_on((10, 0)), get_registry())
    assert resolved.platform_traits is not None
    assert resolved.platform_traits.compute_capability == (10, 0)
    assert resolved.platform_traits.page_size_rules  # the plugin's own traits (DSA's page 64 rule) are there


def test_auto_is_select_dsv4_kv_layout_on_each_gpu() -> None:
    """Every (auto, compressed option) on SGLang's own function at major 9 (Hopper) and 10 (Blackwell), against
    kvpools' resolution on a GPU of that compute capability."""
    python, _ = locate.require_sglang_peer()
    grid = [("auto", opt, major) for opt in ("auto", "fp8", "fp4") for major in (9, 10, 12)]
    done = subprocess.run(
        [str(python), str(PEER)],
        input=json.dumps({"page_sizes": [], "selections": [list(g) for g in grid], "pools": []}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)["selections"]
    for (mode, opt, major), sglang in zip(grid, answers, strict=True):
        serving = _on((major, 0), dsv4_kv_layout=mode, dsv4_compressed_kv_layout=opt)
        assert main_layout(serving).name == sglang["main"], (opt, major)
        for ratio, name in sglang["compressed"].items():
            assert compressed_layout(serving, int(ratio)).name == name, (opt, major, ratio)


@pytest.mark.parametrize("capability", [None, (9, 0)])
def test_off_blackwell_auto_drops_the_compressed_option(capability: tuple[int, int] | None) -> None:
    serving = _on(capability, dsv4_compressed_kv_layout="fp8")
    assert main_layout(serving) is V4 and compressed_layout(serving, 4) is V4


def test_every_rank_of_a_group_on_b200_plans_v41() -> None:
    """``plan_all_ranks`` re-plans each stage on the agreed budget as stated memory: the GPU's compute capability
    stays with them (``_on_gpu``), so the final plans resolve ``auto`` as the per-stage profile did."""
    from kvpools_core.planning.distributed import plan_all_ranks

    ranks = plan_all_ranks(FLASH, Serving(tp_size=4, pp_size=2), gpu="b200", suggest=False)
    assert {main_layout(p.serving).name for p in ranks.plans} == {"v41"}
