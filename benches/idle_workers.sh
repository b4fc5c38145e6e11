#!/usr/bin/env bash
# The relay's memory per idle worker with 5,000 workers connected (issue 15).
# Builds the release relay example, then runs the `idle_workers` bench
# harness (benches/idle_workers.rs): it starts the relay on 127.0.0.1 with
# tokens from a temporary file (never the command line), connects 5,000
# workers from its own process, and reads the relay's VmRSS. About 2 minutes.
#
#   bash benches/idle_workers.sh
#   IDLE_WORKERS=2500 bash benches/idle_workers.sh     # another worker count
#   MALLOC_ARENA_MAX=2 bash benches/idle_workers.sh    # glibc malloc, 2 arenas
set -euo pipefail
cd "$(dirname "$0")/.."
n="${IDLE_WORKERS:-5000}"
# Each connection costs the relay one fd, and this bench one more (the
# worker's end): both processes need n + some.
need=$((n + 1024))
soft="$(ulimit -Sn)"
if [ "$soft" != unlimited ] && [ "$soft" -lt "$need" ]; then
    hard="$(ulimit -Hn)"
    if [ "$hard" != unlimited ] && [ "$hard" -lt "$need" ]; then
        echo "idle_workers.sh: the file limit is $soft (hard $hard); $n workers need $need:" \
             "raise the hard limit or set IDLE_WORKERS lower" >&2
        exit 2
    fi
    ulimit -Sn "$need"
fi
cargo build --release --example relay
cargo bench --bench idle_workers
