#!/usr/bin/env bash
# Replay the shared serving trace against kvpools' allocators and the SGLang / vLLM peers.
#   usage: bash benchmarks/run_bench.sh [extra bench_alloc.py args, e.g. --repeat 5 --quick]
# Env: KVPOOLS_PEERS_VENV (default /tmp/kvpools-peers-venv), KVPOOLS_BENCH_DIR (default
# ../shared/bench beside the checkout), ADAPTERS, SCENARIOS,
# ROUNDS (default 5; 0 skips benchmarks/compare.py and benchmarks/swa_bench.py, the paired ours-vs-peer rounds).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=${KVPOOLS_BENCH_DIR:-$ROOT/../shared/bench}
if [[ ! -f "$BENCH/bench_alloc.py" ]]; then
    echo "error: the benchmark driver $BENCH/bench_alloc.py is missing. It ships in the shared checkout" \
         "(../shared/bench beside the repository root); put it there or set KVPOOLS_BENCH_DIR." >&2
    exit 2
fi
VENV=${KVPOOLS_PEERS_VENV:-/tmp/kvpools-peers-venv}
OURS=kvpools-token,kvpools-token-checked,kvpools-paged16-extend,kvpools-paged64-extend,kvpools-paged16-pages,kvpools-paged64-pages
PEERS=sglang-token,sglang-paged16-extend,sglang-paged64-extend,vllm-blockpool16,vllm-blockpool64
ADAPTERS=${ADAPTERS:-$OURS,$PEERS}
SCENARIOS=${SCENARIOS:-unique_prompts}

# 1. peers venv (torch 2.13 CPU, numpy, cbor2, sglang + vllm --no-deps); idempotent
bash "$BENCH/setup_peers.sh" "$VENV"
# 2. kvpools into the same venv. The adapter imports only kvpools_core.allocators (torch only)
#    and falls back to this checkout when the install or the package's other imports fail.
if ! "$VENV/bin/pip" install -q --no-deps -e "$ROOT"; then
    echo "note: pip install -e $ROOT failed; the adapter imports the checkout directly" >&2
fi
# 3. replay; results (JSON + log) go to benchmarks/results/ (gitignored)
OUT="$ROOT/benchmarks/results"
mkdir -p "$OUT"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
cd "$ROOT"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" "$BENCH/bench_alloc.py" \
    --plugin benchmarks.bench_adapter:register \
    --adapters "$ADAPTERS" --scenarios "$SCENARIOS" \
    --out "$OUT/bench_alloc_$STAMP.json" "$@" 2>&1 | tee "$OUT/bench_alloc_$STAMP.log"
"$VENV/bin/python" "$ROOT/benchmarks/summarize.py" "$OUT/bench_alloc_$STAMP.json" | tee "$OUT/summary_$STAMP.md"
# 4. paired rounds: per-round ratios ours / faster peer, robust to load changes
ROUNDS=${ROUNDS:-5}
if (( ROUNDS > 0 )); then
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" "$ROOT/benchmarks/compare.py" \
        --bench-dir "$BENCH" --rounds "$ROUNDS" --scenario "${SCENARIOS%%,*}" \
        --out "$OUT/compare_$STAMP.json" | tee -a "$OUT/summary_$STAMP.md"
    # 5. the dual full / SWA allocator against SGLang 0.5.23's, page 1 and 16, paired rounds
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" "$ROOT/benchmarks/swa_bench.py" \
        --bench-dir "$BENCH" --rounds "$ROUNDS" --out "$OUT/swa_$STAMP.json" | tee -a "$OUT/summary_$STAMP.md"
fi
