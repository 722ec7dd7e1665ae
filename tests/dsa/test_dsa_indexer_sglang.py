"""Differential: kvpools' DSA indexer rules against SGLang 0.5.23's own code, run on CPU in the peers venv.

``sglang_dsa_peer.py`` compiles ``is_deepseek_dsa`` and ``dsa_layer_skips_topk`` from the installed
``configs/model_config.py``, builds the installed ``IndexKeyCache`` (``mem_cache/index_key_cache.py``) on ``meta``
and the installed ``HiSparseTokenToKVPoolAllocator`` (``mem_cache/allocator/hisparse.py``) on the CPU; kvpools
answers through the real registry.  The index buffer's slot count is ``DSATokenToKVPool.__init__``'s
(``memory_pool.py`` lines 5335-5344: ``(size + page) x dcp - page``; ``HiSparseDSATokenToKVPool`` passes
``size x host_to_device_ratio``), which the peer cannot run (the pool class needs a GPU), so the test states it.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import Serving, plan
from kvpools_core.config import ConfigReader, is_deepseek_dsa
from kvpools_core.errors import ConfigError
from kvpools_core.models import parse_config
from kvpools_core.parts.hisparse import LOGICAL_TOKENS
from kvpools_core.registry import get_registry
from tests.oracle import locate

from .support import SMALL_DSA

PYTHON, BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_dsa_peer.py")
GiB = 1 << 30


def _peer(cases: list[dict[str, Any]]) -> list[Any]:
    out = subprocess.run(
        [str(PYTHON), str(PEER), str(BENCH)], input=json.dumps(cases), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    answers: list[Any] = json.loads(out.stdout)
    return answers


def _share_fields(rng: random.Random, num_layers: int) -> dict[str, Any]:
    """One of ``dsa_layer_skips_topk``'s rules, with values SGLang accepts or asserts on."""
    rule = rng.choice(["types", "cli", "pattern", "freq", "offset", "none"])
    if rule == "types":
        return {"indexer_types": [rng.choice(["full", "shared"]) for _ in range(rng.randint(0, num_layers + 2))]}
    if rule == "cli":
        return {"cli_factor": rng.choice([None, 0, 1, 2, 3, 5]), "index_topk_freq": rng.choice([None, 4])}
    if rule == "pattern":
        return {"index_topk_pattern": "".join(rng.choice("FS") for _ in range(rng.randint(0, num_layers + 2)))}
    if rule == "freq":
        return {"index_topk_freq": rng.choice([None, 0, 1, 2, 3, 4, 7])}
    if rule == "offset":
        return {"index_topk_freq": rng.choice([1, 2, 4]), "index_skip_topk_offset": rng.choice([0, 1, 2, 3, 5])}
    return {}


def test_indexshare_layers_match_sglang() -> None:
    """200 generated configs: kvpools marks the layers ``dsa_layer_skips_topk`` marks, and refuses what it asserts."""
    rng = random.Random(32)
    configs = []
    for _ in range(200):
        layers = rng.randint(1, 40)
        fields = {key: value for key, value in _share_fields(rng, layers).items() if value is not None}
        configs.append({**SMALL_DSA, "num_hidden_layers": layers, **fields})
    answers = _peer([{"op": "skips", "config": c, "num_layers": c["num_hidden_layers"]} for c in configs])
    registry = get_registry()
    for config, answer in zip(configs, answers, strict=True):
        if isinstance(answer["skips"], str):  # SGLang asserts on a zero frequency, factor or offset
            with pytest.raises(ConfigError):
                parse_config(config, "generated", registry)
            continue
        spec, plugin = parse_config(config, "generated", registry)
        assert plugin == "dsa"
        assert [bool(layer.params.get("skips_topk")) for layer in spec.layers] == answer["skips"], config


ARCHITECTURES = (
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "GlmMoeDsaForCausalLM",
    "GlmMoeDsaForCausalLMNextN",
    "Glm5NextForConditionalGenerationNextN",
    "Glm5NextForConditionalGeneration",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "Dots3NoteForCausalLM",
    "Dots3NoteForCausalLMNextN",
    "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
    "DeepseekV2ForCausalLM",
    "DeepseekV4ForCausalLM",
    "KimiK3ForConditionalGeneration",
    "LlamaForCausalLM",
)


def test_is_deepseek_dsa_matches_sglang() -> None:
    """SGLang 0.5.23 names 15 DSA architectures (kvpools knew 6: GLM5-Next's DSA hybrids were planned without
    index keys); with and without ``index_topk``."""
    configs = [
        {"architectures": [arch], **({"index_topk": 2048} if topk else {})}
        for arch in ARCHITECTURES
        for topk in (True, False)
    ]
    answers = _peer([{"op": "skips", "config": c, "num_layers": 0} for c in configs])
    for config, answer in zip(configs, answers, strict=True):
        assert is_deepseek_dsa(ConfigReader(config, "generated")) == answer["is_deepseek_dsa"], config


INDEX_CASES = [
    # (label, config changes, serving)
    ("page 64", {}, Serving(page_size=64)),
    ("kpool 2, page 128", {"index_kpool": 2}, Serving(page_size=128)),
    ("kpool 4, page 256", {"index_kpool": 4}, Serving(page_size=256)),
    ("IndexShare freq 2", {"index_topk_freq": 2}, Serving(page_size=64)),
    ("IndexShare types", {"indexer_types": ["full", "shared", "shared", "full"]}, Serving(page_size=64)),
    ("DCP 2", {}, Serving(page_size=64, tp_size=2, dcp_size=2)),
    ("DCP 4", {}, Serving(page_size=64, tp_size=4, dcp_size=4)),  # with index_kpool > 1 SGLang refuses DCP
    (
        "HiSparse 3",
        {},
        Serving(
            page_size=64, enable_hisparse=True, disable_radix_cache=True, hisparse_config='{"host_to_device_ratio": 3}'
        ),
    ),
    (
        "HiSparse 2 + IndexShare (not elided)",
        {"index_topk_freq": 2},
        Serving(page_size=64, enable_hisparse=True, disable_radix_cache=True),
    ),
    (
        "IndexShare under HiCache (not elided)",
        {"index_topk_freq": 2},
        Serving(page_size=64, enable_hierarchical_cache=True, hicache_ratio=2.0),
    ),
]


@pytest.fixture(scope="module")
def index_key_caches() -> dict[str, tuple[int, list[int]]]:
    """Per case: the plan's ``indexer`` bytes and SGLang's ``IndexKeyCache`` buffer bytes for the same pool
    arguments (two peer processes for every case)."""
    configs = [{**SMALL_DSA, "num_hidden_layers": 4, **changes} for _, changes, _ in INDEX_CASES]
    skips = _peer([{"op": "skips", "config": config, "num_layers": 4} for config in configs])
    planned, cases = [], []
    for (_, _, serving), config, skip in zip(INDEX_CASES, configs, skips, strict=True):
        spec, _ = parse_config(config, "generated", get_registry())
        got = plan(spec, serving, memory=1 * GiB)
        size, page, dcp = got.max_total_num_tokens, serving.page_size, serving.dcp_size
        if serving.enable_hisparse:  # HiSparseDSATokenToKVPool: index_buf_size=size * host_to_device_ratio
            index_buf_size = got.sizing.token_counts[LOGICAL_TOKENS]
        else:  # DSATokenToKVPool.__init__ (not dcp_replicated)
            index_buf_size = (size + page) * dcp - page
        # _build_dsa_kv_pool passes skip_topk_layers only when _should_elide_dsa_index_k (ref-000 lines 1657-1663)
        elide = not (serving.enable_hisparse or serving.enable_hierarchical_cache)
        cases.append(
            {
                "op": "index_cache",
                "page_size": page,
                "index_kpool": config.get("index_kpool", 1),
                "skip_topk_layers": skip["skips"] if elide else [False] * 4,
                "index_buf_size": index_buf_size,
            }
        )
        planned.append(got.pool("indexer").bytes)
    answers = _peer(cases)
    return {case[0]: (bytes_, buffers) for case, bytes_, buffers in zip(INDEX_CASES, planned, answers, strict=True)}


@pytest.mark.parametrize("label", [case[0] for case in INDEX_CASES])
def test_index_buffers_match_sglang_index_key_cache(label: str, index_key_caches: dict[str, Any]) -> None:
    """The plan's ``indexer`` pool is the bytes of SGLang's ``IndexKeyCache`` for the same pool arguments."""
    planned, buffers = index_key_caches[label]
    assert planned == sum(buffers)
    if "IndexShare types" in label:
        assert buffers[1] == buffers[2] == 0 < buffers[0] == buffers[3]  # the shared layers' 0-row placeholders


@pytest.mark.parametrize("ratio", [2, 4])
def test_hisparse_allocator_sizes_match_sglang(ratio: int) -> None:
    """``size_full``, the device allocator's size and the int64 mapping's entries of SGLang's allocator."""
    serving = Serving(
        tp_size=8,
        enable_hisparse=True,
        disable_radix_cache=True,
        hisparse_config=f'{{"host_to_device_ratio": {ratio}}}',
    )
    got = plan("deepseek-v3.2", serving, memory=30 * GiB)
    size = got.max_total_num_tokens
    [sglang] = _peer([{"op": "hisparse_allocator", "size": size, "page_size": 64, "ratio": ratio}])
    assert sglang["size_full"] == sglang["logical"] == got.sizing.token_counts[LOGICAL_TOKENS]
    assert sglang["device"] == size
    assert (sglang["mapping_dtype"], sglang["mapping_last"]) == ("torch.int64", -1)
    assert got.pool("hisparse_mapping").bytes == sglang["mapping_entries"] * 8
    assert got.pool("hisparse_mapping").slots + got.pool("hisparse_mapping").padding_slots == sglang["mapping_entries"]
