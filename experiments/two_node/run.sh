#!/usr/bin/env bash
# Two heterogeneous nodes (LoRA on llama.cpp, full fine-tuning on HF) through a local relay.
#   bash experiments/two_node/run.sh        (from the project root; ~15 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
ADDR="tcp://127.0.0.1:${PORT:-5599}"
.venv/bin/ftis-relay --bind "$ADDR" & RELAY=$!
trap 'kill $RELAY 2>/dev/null || true' EXIT
sleep 2
.venv/bin/ftis-edge start experiments/two_node/alice.toml --headless --relay "$ADDR" --overwrite & A=$!
.venv/bin/ftis-edge start experiments/two_node/bob.toml --headless --relay "$ADDR" --overwrite & B=$!
wait $A $B
.venv/bin/ftis-relay status --connect "$ADDR" || true
.venv/bin/python -m experiments.summarize_run runs/two_node/alice runs/two_node/bob --window 4
