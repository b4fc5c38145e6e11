#!/usr/bin/env bash
# Issue 24: TLS through the relay vs plain hyper + rustls alone, and the
# relay's CPU per worker TLS handshake (benches/tls.rs). Builds the release
# relay example first (the handshake part runs it as a process).
#
#   bash benches/tls.sh
#   TLS_ROUNDS=10000 bash benches/tls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --example relay
cargo bench --bench tls
