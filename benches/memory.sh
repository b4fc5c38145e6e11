#!/usr/bin/env bash
# Peak RSS of the relay and worker examples while 1 GiB streams through them.
# Builds the release examples, then runs the `memory` bench harness
# (benches/memory.rs), which starts them on 127.0.0.1 with tokens from a
# temporary file and the environment, never the command line.
#
#   bash benches/memory.sh                      # slow reader at 64 MiB/s
#   MEMORY_READ_MIBPS=32 bash benches/memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --example relay --example worker
cargo bench --bench memory
