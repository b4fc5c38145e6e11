#!/usr/bin/env bash
# Issue 23: 10,000 tokens, 8 clients sending WebSocket handshakes with a
# 60 KiB bearer token (and then a 32-byte one) for 20 s each, while
# /w/abc/health is probed through a good worker; the relay's CPU per
# refused handshake. Builds the release relay and worker examples, then
# runs the `handshake_flood` bench harness (benches/handshake_flood.rs).
# About 1.5 minutes per build.
#
#   bash benches/handshake_flood.sh                     # this checkout
#   BEFORE=98ad246 bash benches/handshake_flood.sh      # that commit too, in the same run
#   HANDSHAKE_FLOOD_TOKEN_BYTES=61440 bash benches/handshake_flood.sh
#
# BEFORE's tree is exported with `git archive` into a temporary directory
# (no worktree, no checkout) and built in target/handshake-flood-before
# (the first time, all the dependencies too: several minutes). All on 127.0.0.1;
# tokens in a 0600 file and the worker's environment, never a command line.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
dir="$(mktemp -d /tmp/worker-relay-flood.XXXXXX)"
trap 'rm -rf "$dir"' EXIT

builds=""
if [ -n "${BEFORE:-}" ]; then
    before="$(git rev-parse --short "$BEFORE^{commit}")"
    mkdir "$dir/src" "$dir/before"
    git archive "$before" | tar -x -C "$dir/src"
    # Cargo names the crate's artifacts after the package, not its
    # directory, and tells trees apart by file times only: so a target
    # directory of its own (under target/: the dependencies build once), and
    # files newer than its last build (git archive dates them at the commit).
    find "$dir/src" -type f -exec touch {} +
    CARGO_TARGET_DIR="$target/handshake-flood-before" cargo build --release \
        --example relay --example worker --manifest-path "$dir/src/Cargo.toml"
    cp "$target/handshake-flood-before/release/examples/relay" \
        "$target/handshake-flood-before/release/examples/worker" "$dir/before/"
    builds="before ($before)=$dir/before;"
fi
cargo build --release --example relay --example worker
after="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src examples || echo '+changes')"
builds+="after ($after)=$target/release/examples"

echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')); load average $(cut -d' ' -f1-3 /proc/loadavg)"
HANDSHAKE_FLOOD_BUILDS="$builds" cargo bench --bench handshake_flood
