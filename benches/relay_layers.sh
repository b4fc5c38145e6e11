#!/usr/bin/env bash
# Issue 42: what the gateway's layers cost over the crate's core, in one
# run. wrk (1 thread, 16 connections) on GET /w/abc/health of the worker
# example's app, through five relays in turn, each with a worker example
# of its own dialled into it, from the most to the least:
#   relay    the relay example (the gateway, its server, access log, metrics);
#   gateway  benches/relay_layers.rs: the same gateway service and server,
#            no log subscriber (no access line formatted);
#   server   the crate's server with a minimal service that copies the heads
#            to and from the crate's RelayHandle;
#   hyper    that service on hyper's HTTP/1 server alone;
#   lean     httparse and one write per response.
# All on one event loop, over the same core (rt, proto, frames) and the
# same Gateway for the workers' side. Reported: requests/s and the relay
# process's CPU per request (utime + stime from /proc), per round, the
# medians, and what each layer adds.
#
#   bash benches/relay_layers.sh
#   LAYERS_ROUNDS=5 LAYERS_SECONDS=10 bash benches/relay_layers.sh
#
# All on 127.0.0.1; tokens drawn at random, passed through a file and the
# environment, never a command line. wrk is installed with apt-get if
# missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${LAYERS_SECONDS:-5}"
rounds="${LAYERS_ROUNDS:-3}"

# need, port, secret, wait_port
. benches/lib.sh
need wrk wrk
cargo build --release --example relay --example worker
bin=target/release/examples
layers="$(cargo bench --no-run --bench relay_layers 2>&1 | sed -n 's/.*Executable .*(\(.*relay_layers-[0-9a-f]*\)).*/\1/p' | tail -1)"
[ -x "$layers" ] || { echo "relay_layers.sh: no relay_layers bench binary" >&2; exit 1; }

dir="$(mktemp -d /tmp/worker-relay-layers.XXXXXX)"
pids=()
cleanup() {
    exec 2>/dev/null
    for p in "${pids[@]}"; do kill -KILL "$p" || true; done
    wait || true
    rm -rf "$dir"
}
trap cleanup EXIT
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

worker_token="wt-$(secret)" connect_token="ct-$(secret)"
(umask 077; echo "abc $connect_token" > "$dir/tokens.txt")
declare -A relay_pid=() url=()

# worker KEY WS_URL: a worker example dialled into that relay.
worker() {
    STRATA_WORKER_CONNECT_TOKEN="$connect_token" STRATA_WORKER_TOKEN="$worker_token" \
        "$bin/worker" --connect "$2" 2> "$dir/$1-worker.log" &
    pids+=($!)
    for _ in $(seq 200); do grep -q "connected" "$dir/$1-worker.log" && return; sleep 0.05; done
    echo "relay_layers.sh: the $1 worker did not connect" >&2; cat "$dir/$1"*.log >&2; exit 1
}

p="$(port)"
"$bin/relay" --listen "127.0.0.1:$p" --tokens "$dir/tokens.txt" 2> "$dir/relay.log" &
relay_pid[relay]=$!; pids+=($!); url[relay]="http://127.0.0.1:$p/w/abc/health"
wait_port "$p"
worker relay "ws://127.0.0.1:$p/connect"
for mode in gateway server hyper lean; do
    wp="$(port)" cp="$(port)"
    RELAY_LAYERS_TOKEN="$connect_token" "$layers" "$mode" "127.0.0.1:$wp" "127.0.0.1:$cp" 2> "$dir/$mode.log" &
    relay_pid[$mode]=$!; pids+=($!); url[$mode]="http://127.0.0.1:$cp/w/abc/health"
    wait_port "$cp"
    worker "$mode" "ws://127.0.0.1:$wp/connect"
done

export E2E_WRK_AUTH="$worker_token"
hz="$(getconf CLK_TCK)"
declare -A rates=() cpus=()
echo
echo "GET /w/abc/health, wrk -t1 -c16 -d${seconds}s, $rounds rounds; CPU of the relay process per request"
keys="relay gateway server hyper lean"
echo "| round | relay | gateway | server | hyper | lean |"
echo "|---|---|---|---|---|---|"
for key in $keys; do
    # A second of each first: the first requests of a fresh process are not compared.
    wrk -t1 -c16 -d1s -s benches/e2e_wrk.lua "${url[$key]}" > /dev/null
done
for round in $(seq "$rounds"); do
    row="| $round |"
    for key in $keys; do
        before="$(cpu "${relay_pid[$key]}")"
        wrk -t1 -c16 -d"${seconds}s" -s benches/e2e_wrk.lua "${url[$key]}" > "$dir/wrk.out"
        after="$(cpu "${relay_pid[$key]}")"
        grep -qE "Non-2xx|Socket errors" "$dir/wrk.out" && { echo "relay_layers.sh: $key: errors" >&2; cat "$dir/wrk.out" >&2; exit 1; }
        r="$(awk '/^Requests\/sec:/ {print $2}' "$dir/wrk.out")"
        c="$(awk -v a="$after" -v b="$before" -v hz="$hz" -v r="$r" -v s="$seconds" 'BEGIN { printf "%.1f", (a - b) / hz * 1e6 / (r * s) }')"
        rates[$key]+=" $r"; cpus[$key]+=" $c"
        row+=" $(printf '%.0f' "$r") req/s, $c µs |"
    done
    echo "$row"
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
prev=""
for key in $keys; do
    r="$(median <<<"${rates[$key]}")" c="$(median <<<"${cpus[$key]}")"
    if [ -n "$prev" ]; then
        awk -v k="$prev" -v n="$key" -v r="$pr" -v c="$pc" -v r2="$r" -v c2="$c" 'BEGIN {
            printf "%-8s %.0f req/s, %.1f us per request: %.2fx the rate of %s, %+.1f us\n", k, r, c, r / r2, n, c - c2 }'
    fi
    prev="$key" pr="$r" pc="$c"
done
awk -v r="$pr" -v c="$pc" 'BEGIN { printf "lean     %.0f req/s, %.1f us per request\n", r, c }'
