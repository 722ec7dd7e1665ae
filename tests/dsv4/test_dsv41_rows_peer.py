"""kvpools' V4.1 KV rows byte for byte against SGLang 0.5.23's own V4.1 store oracle (issue 33).

kvpools builds the synthetic V4.1 config's pools on CPU and writes one page of random latents through
``PackedRows.set_kv``; ``sglang_dsv41_rows_peer.py`` runs SGLang's ``quantize_k_cache_v41`` /
``quantize_k_cache_v41_fp4`` (+ ``interleave_pages``) on the same latents in the peers venv.  The page bytes must
be equal, and kvpools' read-back must be the oracle's dequantisation, exactly.  Skips without the peers venv
(fails under ``KVPOOLS_REQUIRE_SHARED=1``), as every peer test.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from kvpools_core import Serving, build
from kvpools_core.pipeline import plan
from tests.oracle import locate

PYTHON, _BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_dsv41_rows_peer.py")
V41 = str(Path(__file__).with_name("configs") / "dsv41_synthetic.json")
LAYOUTS = [("v41", "auto"), ("v41_new", "auto"), ("v41", "fp4"), ("v41_new", "fp4")]


@pytest.mark.parametrize(("main", "option"), LAYOUTS, ids=[f"{m}-{o}" for m, o in LAYOUTS])
def test_v41_pages_are_sglangs_bytes(tmp_path: Path, main: str, option: str) -> None:
    serving = Serving(max_running_requests=4, context_length=4096, dsv4_kv_layout=main,
                      dsv4_compressed_kv_layout=option)  # fmt: skip
    pool = build(plan(V41, serving, memory="1GiB"), "cpu").kv_pool
    generator = torch.Generator().manual_seed(33)
    cases, written = [], []
    # the SWA pool (main layout, every layer) and the ratio-1 pool (fp4 under auto / fp4, layer 1 its source)
    for rows, layer in ((pool.swa_kv_pool, 0), (pool.low_ratio_kv_pools[1], 1)):
        page = rows.page_size
        latent = torch.randn(page, 512, generator=generator) * torch.logspace(-3, 2, page).unsqueeze(1)
        latent[3] = 0.0  # an all-zero token: the scale floors
        loc = torch.arange(page, 2 * page)  # page 1, every slot
        rows.set_kv(layer, loc, latent[:, :448], latent[:, 448:])
        source, out = tmp_path / f"in{layer}.pt", tmp_path / f"out{layer}.pt"
        torch.save(latent, source)
        cases.append({"input": str(source), "layout": rows.layout.name, "page_size": page, "output": str(out)})
        written.append((rows, layer, loc, out))
    done = subprocess.run(
        [str(PYTHON), str(PEER)], input=json.dumps(cases), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    for rows, layer, loc, out in written:
        sglang = torch.load(out)
        raw = rows.page_size * rows.layout.bytes_per_token
        assert torch.equal(rows.buffer(layer)[1, :raw], sglang["page"]), rows.name
        nope, rope = rows.get_kv(layer, loc, torch.float32)
        assert torch.equal(torch.cat((nope, rope), dim=-1), sglang["read"]), rows.name
