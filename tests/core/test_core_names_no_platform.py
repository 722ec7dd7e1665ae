"""The core compares no platform name: a platform's rules are its plugin's traits (``PlatformTraits``), code review.

An AST scan of every ``kvpools_core/**/*.py`` (but ``testing/``) refuses a comparison of something named
``platform`` (``serving.platform``, a ``platform`` argument) with a string constant (``==``, ``!=``, ``in``), the
shape of ``platform == "cuda"``.  The comparisons still in the core are listed with why, each to go; the scan is
tested on synthetic sources, so it cannot pass by seeing nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
CORE = ROOT / "kvpools_core"
EXCLUDED = ("testing",)

ALLOWED = {
    ("kvpools_core/engines/trtllm/deployment.py", "cuda"): "TensorRT-LLM runs on CUDA only: its accounting "
    "refuses another platform. To go: an engine's platforms declared by its Engine value.",
    ("kvpools_core/pipeline/post_capture.py", "cuda"): "SGLang plans post-capture KV sizing on CUDA only "
    "(L1805). To go: a PlatformTraits field the cuda plugin declares.",
    ("kvpools_core/pipeline/noop.py", "cuda"): "SGLang's no-op prefill-only KV pool is plain MHA on CUDA. To go: a "
    "PlatformTraits field.",
    ("kvpools_core/parts/nvfp4.py", "cuda"): "the NVFP4 KV cache's kernels are CUDA's. To go: a KVDtypeRule of "
    "the other platforms, or a PlatformTraits field.",
    ("kvpools_core/engines/vllm/runtime_memory.py", "cuda"): "the attention backend vLLM picks (FlashInfer's "
    "workspace) is its CUDA platform's priority list (platforms/cuda.py); a ROCm GPU picks from rocm.py, not "
    "modelled. To go: the vLLM backend choice as a PlatformTraits field the cuda plugin declares.",
}
"""``(file, platform)`` → why that file still compares that platform name; every entry must still be needed."""


def platform_comparisons(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every comparison of a ``platform`` name or attribute with a string constant."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(_is_platform(side) for side in sides):
            continue
        for side in sides:
            for constant in _strings(side):
                found.append((node.lineno, constant))
    return found


def _is_platform(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "platform") or (
        isinstance(node, ast.Attribute) and node.attr == "platform"
    )


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [item.value for item in node.elts if isinstance(item, ast.Constant) and isinstance(item.value, str)]
    return []


def core_comparisons() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(CORE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.split("/")[1] in EXCLUDED:
            continue
        for line, name in platform_comparisons(path.read_text(encoding="utf-8")):
            found.setdefault((relative, name), []).append(line)
    return found


def test_the_core_compares_no_platform_name() -> None:
    found = core_comparisons()
    unexplained = [
        f"{file}:{lines[0]}: platform {name!r}" for (file, name), lines in found.items() if (file, name) not in ALLOWED
    ]
    assert not unexplained, f"declare the platform's rule in its plugin's PlatformTraits instead: {unexplained}"
    assert not set(ALLOWED) - set(found), "an ALLOWED entry is no longer needed: drop it"


def test_the_scan_sees_platform_comparisons() -> None:
    source = (
        "def f(serving, platform):\n"
        "    a = serving.platform == 'cuda'\n"
        "    b = platform in ('rocm', 'ascend')\n"
        "    c = 'npu' != serving.platform\n"
        "    d = serving.page_size == 'cuda'\n"
    )
    assert platform_comparisons(source) == [(2, "cuda"), (3, "rocm"), (3, "ascend"), (4, "npu")]
