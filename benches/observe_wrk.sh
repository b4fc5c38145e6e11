#!/usr/bin/env bash
# Issue 26: what metrics and the access log cost. Two relay + worker pairs
# of the examples, side by side: one with neither (no --admin, the access
# log filtered off), one with both (--admin on the relay and the worker,
# so the Prometheus recorder is installed, and the access log written to
# a file). wrk (1 thread, 16 connections) on GET /w/abc/health through
# each, alternately, three times each; the ratio is of the summed rates.
#
#   bash benches/observe_wrk.sh
#   WRK_SECONDS=10 bash benches/observe_wrk.sh
#
# All on 127.0.0.1; tokens drawn at random, passed through a file and the
# environment, never a command line. wrk is installed with apt-get if
# missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${WRK_SECONDS:-5}"
conns="${WRK_CONNECTIONS:-16}"

if ! command -v wrk >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "observe_wrk.sh: wrk is missing (apt-get install wrk)" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; }
fi
cargo build --release --example relay --example worker
bin=target/release/examples

dir="$(mktemp -d /tmp/worker-relay-observe.XXXXXX)"
pids=()
cleanup() {
    exec 2>/dev/null
    for p in "${pids[@]}"; do kill -KILL "$p" || true; done
    wait || true
    rm -rf "$dir"
}
trap cleanup EXIT
. benches/lib.sh

worker_token="wt-$(secret)" connect_token="ct-$(secret)"
(umask 077; echo "abc $connect_token" > "$dir/tokens.txt")

# stack NAME LOG_FILTER ADMIN(yes|no) PORT: a relay on PORT and its worker.
stack() {
    local name="$1" filter="$2" admin="$3" rp="$4" relay_admin=() worker_admin=()
    if [ "$admin" = yes ]; then
        relay_admin=(--admin "127.0.0.1:$(port)") worker_admin=(--admin "127.0.0.1:$(port)")
    fi
    RUST_LOG="$filter" "$bin/relay" --listen "127.0.0.1:$rp" --tokens "$dir/tokens.txt" \
        "${relay_admin[@]}" > /dev/null 2> "$dir/$name-relay.log" &
    pids+=($!)
    wait_port "$rp"
    RUST_LOG="$filter" STRATA_WORKER_CONNECT_TOKEN="$connect_token" STRATA_WORKER_TOKEN="$worker_token" \
        "$bin/worker" --connect "ws://127.0.0.1:$rp/connect" "${worker_admin[@]}" > /dev/null 2> "$dir/$name-worker.log" &
    pids+=($!)
    for _ in $(seq 200); do grep -q "worker abc connected" "$dir/$name-relay.log" && break; sleep 0.05; done
    grep -q "worker abc connected" "$dir/$name-relay.log" || { cat "$dir"/*.log >&2; exit 1; }
}
off_port="$(port)" on_port="$(port)"
stack off "info,worker_relay::access=off" no "$off_port"
stack on "info" yes "$on_port"

export E2E_WRK_AUTH="$worker_token"
declare -A rate=()
run() {  # run KEY PORT
    local r
    r="$(wrk -t1 -c"$conns" -d"${seconds}s" -s benches/e2e_wrk.lua "http://127.0.0.1:$2/w/abc/health" \
        | awk '/^Requests\/sec:/ {print $2}')"
    rate[$1]="${rate[$1]:-0} + $r"
    printf '| %s | %.0f |\n' "$1" "$r"
}
echo
echo "GET /w/abc/health through relay + worker, wrk -t1 -c$conns -d${seconds}s"
echo "| metrics + access log | requests/s |"
echo "|---|---|"
for round in 1 2 3; do
    run off "$off_port"
    run on "$on_port"
done
lines="$(grep -c "access worker=" "$dir/on-relay.log" || true)"
awk -v on="$(awk "BEGIN { print ${rate[on]} }")" -v off="$(awk "BEGIN { print ${rate[off]} }")" -v n="$lines" 'BEGIN {
    printf "\nwith metrics and the access log vs without: %.3fx the rate (goal >= 0.97x); %d access log lines written\n", on / off, n
}'
