"""kvpools-rocm's platform facts: DSA paging and raw rows on HIP, and AITER's MLA workspace.

References: SGLang's ``DSATokenToKVPool`` HIP branch (page 1, or a multiple of
16 with AITER's preshuffled paged MQA; ``../shared/reference/sglang-pools.md``
§1.5), ``calculate_mla_kv_cache_dim`` (HIP tilelang/triton/aiter read raw rows,
§1.4), and ``AiterAttnBackend.init_cuda_graph_state`` (``cuda_graph_kv_indices
= zeros(max_bs * max_context_len, int32)``).
"""

from __future__ import annotations

import subprocess

import pytest

from kvpools_core import Serving, build, plan
from kvpools_core.errors import UnsupportedCombinationError

pytestmark = pytest.mark.usefixtures("rocm_platform")

CONTEXT = 163840  # deepseek-v3's max_position_embeddings
REQUESTS = 64


def test_rocm_traits() -> None:
    traits = plan("llama-3.1-8b", Serving(platform="rocm"), memory="8GiB").serving.traits
    assert traits.platform == "rocm" and traits.slot_index_dtype == "int64"
    assert traits.raw_mla_row_backends == {"tilelang", "triton", "aiter"}
    assert [rule.describe() for rule in traits.page_size_rules] == ["1 or a multiple of 16"]


@pytest.mark.parametrize("page", [1, 16, 32, 64, 128])
def test_dsa_pages_allowed_on_hip(page: int) -> None:
    assert plan("deepseek-v3.2", Serving(platform="rocm", page_size=page), memory="8GiB")


@pytest.mark.parametrize("page", [2, 8, 24, 100])
def test_dsa_pages_refused_on_hip(page: int) -> None:
    with pytest.raises(UnsupportedCombinationError, match=r"DSA models need page_size 1 or a multiple of 16 on rocm"):
        plan("deepseek-v3.2", Serving(platform="rocm", page_size=page), memory="8GiB")


def test_aiter_mla_workspace_is_charged_and_built() -> None:
    serving = Serving(platform="rocm", max_running_requests=REQUESTS)
    result = plan("deepseek-v3", serving, memory="60GiB")
    workspace = result.pool("aiter_mla_kv_indices")
    assert workspace.bytes == REQUESTS * CONTEXT * 4 == 41_943_040
    assert (workspace.owner, workspace.kind, workspace.sglang_charged) == ("rocm", "workspace", False)
    assert result.provenance["workspaces"] == ("rocm",)
    assert result.planned_bytes <= result.budget.budget_bytes
    cuda = plan("deepseek-v3", Serving(max_running_requests=REQUESTS), memory="60GiB")
    freed = cuda.max_total_num_tokens - result.max_total_num_tokens
    assert freed == -(-workspace.bytes // cuda.cell.bytes_per_token)  # the tokens the workspace displaced
    pools = build(result, "meta")
    assert pools.allocated_by_pool()["aiter_mla_kv_indices"] == workspace.bytes
    assert pools.allocated_bytes == result.planned_bytes
    assert tuple(pools.workspaces["aiter_mla_kv_indices"].shape) == (REQUESTS * CONTEXT,)


def test_the_context_length_sizes_the_workspace() -> None:
    result = plan("deepseek-v3", Serving(platform="rocm", max_running_requests=8, context_length=4096), memory="8GiB")
    assert result.pool("aiter_mla_kv_indices").bytes == 8 * 4096 * 4


@pytest.mark.parametrize(
    ("model", "serving"),
    [
        ("deepseek-v3", Serving(platform="rocm", plugin_options={"rocm.attention_backend": "triton"})),
        ("deepseek-v3.2", Serving(platform="rocm", page_size=16)),  # DSA: the DSA backends, not AITER MLA
        ("llama-3.1-8b", Serving(platform="rocm")),  # not MLA
        ("deepseek-v3", Serving()),  # CUDA
    ],
)
def test_no_workspace_elsewhere(model: str, serving: Serving) -> None:
    result = plan(model, serving, memory="8GiB")
    assert not [p for p in result.pools if p.kind == "workspace"]
    assert "workspaces" not in result.provenance


def test_the_cli_shows_the_workspace(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    args = ["build", "deepseek-v3", "--platform", "rocm", "--device", "meta", "--memory", "60GiB"]
    out = subprocess.run(
        [kvpools_exe, *args, "--max-running-requests", str(REQUESTS)],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("aiter_mla_kv_indices"))
    assert row.count("41,943,040") == 2 and row.rstrip().endswith("ok")
