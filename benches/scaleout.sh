#!/usr/bin/env bash
# Issue 19: requests through nginx + relay vs the relay alone, and the
# failover time, with the release examples (docs/scale-out.md).
#
#   bash benches/scaleout.sh
#   SCALEOUT_SECONDS=20 SCALEOUT_CONNECTIONS=32 bash benches/scaleout.sh
#
# Starts 3 relays, nginx with tests/scaleout/nginx.conf.template, and 3
# worker example processes dialling nginx at /connect/<id>, all on
# 127.0.0.1. Runs wrk on GET /w/b0/health at the relay that holds b0 and
# through nginx, alternately, twice each; then SIGKILLs that relay and
# times how long until b0 answers 200 through nginx again. Tokens are
# drawn at random, kept in a private directory and passed through files
# and the environment, never a command line. wrk and nginx are installed
# with apt-get if missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${SCALEOUT_SECONDS:-10}"
conns="${SCALEOUT_CONNECTIONS:-16}"

. benches/lib.sh   # need, port, secret, wait_port, us
need wrk wrk
need nginx nginx-light
nginx_bin="$(command -v nginx || echo /usr/sbin/nginx)"
cargo build --release --example relay --example worker
bin=target/release/examples

dir="$(mktemp -d /tmp/worker-relay-scaleout-bench.XXXXXX)"
chmod 755 "$dir"   # nginx's worker processes run as nobody
pids=() nginx_pid=""
cleanup() {
    exec 2>/dev/null   # no "Killed" notices
    if [ -n "$nginx_pid" ]; then
        kill -TERM "$nginx_pid" || true   # nginx stops its own workers
        for _ in $(seq 100); do kill -0 "$nginx_pid" || break; sleep 0.05; done
        kill -KILL "$nginx_pid" || true
    fi
    for p in "${pids[@]}"; do kill -KILL "$p" || true; done
    wait || true
    rm -rf "$dir"
}
trap cleanup EXIT

worker_token="wt-$(secret)"
(umask 077; : > "$dir/tokens.txt"; printf 'Authorization: Bearer %s\n' "$worker_token" > "$dir/auth.header")
declare -A ct
for id in b0 b1 b2; do ct[$id]="ct-$(secret)"; echo "$id ${ct[$id]}" >> "$dir/tokens.txt"; done

relay_ports=() relay_pids=()
for i in 0 1 2; do
    p="$(port)"
    "$bin/relay" --listen "127.0.0.1:$p" --tokens "$dir/tokens.txt" 2> "$dir/relay$i.log" &
    pids+=($!) relay_pids+=($!) relay_ports+=("$p")
done
for p in "${relay_ports[@]}"; do wait_port "$p"; done
np="$(port)"
sed -e "s#@DIR@#$dir#g" -e "s#@LISTEN@#127.0.0.1:$np#" \
    -e "s#@RELAY1@#127.0.0.1:${relay_ports[0]}#" -e "s#@RELAY2@#127.0.0.1:${relay_ports[1]}#" \
    -e "s#@RELAY3@#127.0.0.1:${relay_ports[2]}#" tests/scaleout/nginx.conf.template > "$dir/nginx.conf"
"$nginx_bin" -c "$dir/nginx.conf" -p "$dir" &
nginx_pid=$!
wait_port "$np"
for id in b0 b1 b2; do
    STRATA_WORKER_CONNECT_TOKEN="${ct[$id]}" STRATA_WORKER_TOKEN="$worker_token" \
        "$bin/worker" --connect "ws://127.0.0.1:$np/connect/$id" 2> "$dir/worker-$id.log" &
    pids+=($!)
done

status() { curl -s -o /dev/null -m 5 -w '%{http_code}' -H "@$dir/auth.header" "$1" || true; }
holder=""
for _ in $(seq 200); do
    for i in 0 1 2; do
        [ "$(status "http://127.0.0.1:${relay_ports[$i]}/w/b0/health")" = 200 ] && holder=$i
    done
    [ -n "$holder" ] && break
    sleep 0.05
done
[ -n "$holder" ] || { echo "b0 never connected" >&2; cat "$dir"/*.log >&2; exit 1; }

export SCALEOUT_WORKER_TOKEN="$worker_token"
declare -A total=()
run_wrk() {  # run_wrk KEY LABEL URL
    local out rate p50 p99 errors
    out="$(wrk -t2 -c"$conns" -d"${seconds}s" --latency -s benches/scaleout.lua "$3")"
    rate="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
    p50="$(us "$(awk '$1 == "50%" {print $2}' <<<"$out")")"
    p99="$(us "$(awk '$1 == "99%" {print $2}' <<<"$out")")"
    errors="$(awk '/Non-2xx|Socket errors/' <<<"$out")"
    total[$1]="${total[$1]:-} $rate:$p50"
    printf '| %s | %.0f | %s µs | %s µs | %s |\n' "$2" "$rate" "$p50" "$p99" "${errors:-none}"
}
echo
echo "GET /w/b0/health, wrk -t2 -c$conns -d${seconds}s, b0 on relay $holder"
echo "| path | requests/s | p50 | p99 | errors |"
echo "|---|---|---|---|---|"
for round in 1 2; do
    run_wrk relay "relay alone (round $round)" "http://127.0.0.1:${relay_ports[$holder]}/w/b0/health"
    run_wrk nginx "nginx + relay (round $round)" "http://127.0.0.1:$np/w/b0/health"
done
# Ratios of the sums over both rounds: nginx + relay / relay alone.
awk -v r="${total[relay]}" -v n="${total[nginx]}" 'BEGIN {
    split(r, a, " "); split(n, b, " ");
    for (i in a) { split(a[i], x, ":"); rr += x[1]; rp += x[2] }
    for (i in b) { split(b[i], y, ":"); nr += y[1]; np += y[2] }
    printf "\nnginx + relay vs relay alone: %.2fx the rate, %.2fx the p50\n", nr / rr, np / rp
}'

# Failover: SIGKILL b0's relay; time until b0 answers through nginx again.
start=$(date +%s%N)
{ kill -KILL "${relay_pids[$holder]}"; wait "${relay_pids[$holder]}"; } 2>/dev/null || true
back=""
while [ $(( $(date +%s%N) - start )) -lt 20000000000 ]; do
    if [ "$(status "http://127.0.0.1:$np/w/b0/health")" = 200 ]; then
        back=$(( ($(date +%s%N) - start) / 1000000 )); break
    fi
    sleep 0.02
done
echo
echo "failover: b0 answers through nginx again ${back:-never (over 20 s)} ms after its relay was killed"
[ -n "$back" ]
