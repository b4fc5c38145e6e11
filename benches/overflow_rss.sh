#!/usr/bin/env bash
# Issue 23's memory check: the README's axum embed (default gateway) while
# slow callers download large responses from several workers; reports the
# relay's peak RSS and overflow on disk, checks every download byte for byte
# and that no overflow file is left (benches/overflow_rss.rs).
#
#   bash benches/overflow_rss.sh                 # 20 × 200 MiB at 100 KB/s, 4 workers: ~35 min
#   OVERFLOW_RSS_MIB=20 OVERFLOW_RSS_KBPS=1000 bash benches/overflow_rss.sh   # ~20 s
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --example worker
cargo bench --bench overflow_rss
