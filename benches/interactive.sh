#!/usr/bin/env bash
# Issue 23: an interactive upload through the relay and worker examples
# (send a piece, read its echo, ten times). Builds the release examples,
# then runs the `interactive` bench harness (benches/interactive.rs).
#
#   bash benches/interactive.sh
#   INTERACTIVE_RUNS=20 bash benches/interactive.sh
#   INTERACTIVE_BIN=/path/to/other/target/release/examples bash benches/interactive.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${INTERACTIVE_BIN:-}" ]; then
    cargo build --release --example relay --example worker
fi
cargo bench --bench interactive
