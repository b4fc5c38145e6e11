#!/usr/bin/env bash
# Issues 17 and 42: small requests with a real load generator. wrk (1
# thread, 16 connections) on GET /health of the worker example's app, served
# three ways, in turn, twice each, with the CPU each process used during
# each run:
#   - through the relay example and a worker example dialled into it
#     (/w/abc/health);
#   - through nginx `proxy_pass` into the same app, one worker process,
#     kept-alive upstream connections: the proxy users would put there
#     instead (issue 42's baseline; nginx-light installed if missing);
#   - directly by the same app (`worker --listen`, the crate's hyper server).
# And, like for like on the access log (the relay logs each request by
# default, the nginx above logs none): the relay with its access log off
# (`RUST_LOG=info,worker_relay::access=off`, a second relay + worker), and
# nginx logging each request (its default `access_log`, to a file).
#
#   bash benches/e2e_wrk.sh
#   WRK_SECONDS=10 WRK_CONNECTIONS=32 bash benches/e2e_wrk.sh
#   THREADS=2 bash benches/e2e_wrk.sh     # relay, worker and direct app with --threads 2
#                                         # (defaults: relay and worker 1, direct app one per core)
#   WORKER_THREADS=1 bash benches/e2e_wrk.sh   # only the worker (RELAY_THREADS: the relay)
#
# All on 127.0.0.1; tokens drawn at random, passed through a file and the
# environment, never a command line. wrk is installed with apt-get if
# missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${WRK_SECONDS:-5}"
conns="${WRK_CONNECTIONS:-16}"
threads=() relay_threads=() worker_threads=()
[ -z "${THREADS:-}" ] || threads=(--threads "$THREADS")
relay_threads=("${threads[@]}") worker_threads=("${threads[@]}")
[ -z "${RELAY_THREADS:-}" ] || relay_threads=(--threads "$RELAY_THREADS")
[ -z "${WORKER_THREADS:-}" ] || worker_threads=(--threads "$WORKER_THREADS")

# need, port, secret, wait_port, us
. benches/lib.sh
need wrk wrk
need nginx nginx-light
nginx_bin="$(command -v nginx || echo /usr/sbin/nginx)"
cargo build --release --example relay --example worker
bin=target/release/examples

dir="$(mktemp -d /tmp/worker-relay-wrk.XXXXXX)"
chmod 755 "$dir"   # nginx's worker process runs as nobody
pids=() nginx_pid=""
cleanup() {
    exec 2>/dev/null
    if [ -n "$nginx_pid" ]; then
        kill -TERM "$nginx_pid" || true   # nginx stops its own worker
        for _ in $(seq 100); do kill -0 "$nginx_pid" || break; sleep 0.05; done
        kill -KILL "$nginx_pid" || true
    fi
    for p in "${pids[@]}"; do kill -KILL "$p" || true; done
    wait || true
    rm -rf "$dir"
}
trap cleanup EXIT
# CPU seconds (user + system) a process has used so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"; }

worker_token="wt-$(secret)" connect_token="ct-$(secret)"
(umask 077; echo "abc $connect_token" > "$dir/tokens.txt")
relay_port="$(port)" direct_port="$(port)"
"$bin/relay" --listen "127.0.0.1:$relay_port" --tokens "$dir/tokens.txt" ${RELAY_ARGS:-} "${relay_threads[@]}" 2> "$dir/relay.log" &
relay_pid=$!; pids+=($!)
wait_port "$relay_port"
STRATA_WORKER_CONNECT_TOKEN="$connect_token" STRATA_WORKER_TOKEN="$worker_token" \
    "$bin/worker" --connect "ws://127.0.0.1:$relay_port/connect" "${worker_threads[@]}" 2> "$dir/worker.log" &
worker_pid=$!; pids+=($!)
quiet_port="$(port)"
RUST_LOG="info,worker_relay::access=off" "$bin/relay" --listen "127.0.0.1:$quiet_port" --tokens "$dir/tokens.txt" ${RELAY_ARGS:-} "${relay_threads[@]}" 2> "$dir/quiet-relay.log" &
quiet_relay_pid=$!; pids+=($!)
wait_port "$quiet_port"
STRATA_WORKER_CONNECT_TOKEN="$connect_token" STRATA_WORKER_TOKEN="$worker_token" \
    "$bin/worker" --connect "ws://127.0.0.1:$quiet_port/connect" "${worker_threads[@]}" 2> "$dir/quiet-worker.log" &
quiet_worker_pid=$!; pids+=($!)
STRATA_WORKER_TOKEN="$worker_token" "$bin/worker" --listen "127.0.0.1:$direct_port" "${threads[@]}" 2> "$dir/direct.log" &
direct_pid=$!; pids+=($!)
wait_port "$direct_port"
for _ in $(seq 200); do grep -q "worker abc connected" "$dir/relay.log" && break; sleep 0.05; done
grep -q "worker abc connected" "$dir/relay.log" || { cat "$dir"/*.log >&2; exit 1; }
for _ in $(seq 200); do grep -q "worker abc connected" "$dir/quiet-relay.log" && break; sleep 0.05; done
grep -q "worker abc connected" "$dir/quiet-relay.log" || { cat "$dir"/*.log >&2; exit 1; }

# nginx: one worker process, HTTP/1.1 with kept-alive connections to the
# app (as a proxy in front of an app is set up), no access log.
nginx_port="$(port)" logging_port="$(port)"
{ nginx_conf_head "$dir" nginx; cat <<NGINX
    upstream app {
        server 127.0.0.1:$direct_port;
        keepalive 32;
    }
    server {
        listen 127.0.0.1:$nginx_port;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
    server {
        listen 127.0.0.1:$logging_port;
        access_log $dir/access.log;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NGINX
} > "$dir/nginx.conf"
"$nginx_bin" -c "$dir/nginx.conf" -p "$dir" 2> "$dir/nginx.log" &
nginx_pid=$!
wait_port "$nginx_port"
nginx_worker=""
for _ in $(seq 100); do nginx_worker="$(pgrep -P "$nginx_pid" | head -1)" && [ -n "$nginx_worker" ] && break; sleep 0.05; done
[ -n "$nginx_worker" ] || { echo "e2e_wrk.sh: nginx started no worker process" >&2; cat "$dir/nginx.log" >&2; exit 1; }

export E2E_WRK_AUTH="$worker_token"
declare -A rate=() p50=()
run() {  # run KEY URL PID...
    local key="$1" url="$2"; shift 2
    local before=() after=() out t0 t1
    for p in "$@"; do before+=("$(cpu "$p")"); done
    /usr/bin/time -f "%U %S" -o "$dir/wrk.time" \
        wrk -t1 -c"$conns" -d"${seconds}s" --latency -s benches/e2e_wrk.lua "$url" > "$dir/wrk.out"
    out="$(cat "$dir/wrk.out")"
    for p in "$@"; do after+=("$(cpu "$p")"); done
    local r l99 errors split=""
    r="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
    l50="$(us "$(awk '$1 == "50%" {print $2}' <<<"$out")")"
    l99="$(us "$(awk '$1 == "99%" {print $2}' <<<"$out")")"
    errors="$(awk '/Non-2xx|Socket errors/' <<<"$out" | tr '\n' ' ')"
    for i in "${!before[@]}"; do
        split+="$(awk -v a="${after[$i]}" -v b="${before[$i]}" 'BEGIN { printf "%.2f", a - b }') / "
    done
    split+="$(awk '{ printf "%.2f", $1 + $2 }' "$dir/wrk.time")"
    rate[$key]="${rate[$key]:-0} + $r"; p50[$key]="${p50[$key]:-0} + $l50"
    printf '| %s | %.0f | %s µs | %s µs | %s | %s |\n' "$key" "$r" "$l50" "$l99" "$split" "${errors:-none}"
}
echo
echo "GET /health, wrk -t1 -c$conns -d${seconds}s --latency; runtime threads: relay ${RELAY_THREADS:-${THREADS:-1 (default)}}, worker ${WORKER_THREADS:-${THREADS:-1 (default)}}, direct app ${THREADS:-one per core (default)}; CPU seconds during the run"
echo "| path | requests/s | p50 | p99 | CPU s: relay / worker / wrk (nginx: nginx / app / wrk; direct: app / wrk) | errors |"
echo "|---|---|---|---|---|---|"
# A second of each before anything is measured: the first requests of a
# fresh process (page faults, first connections, allocator growth) are not
# what is compared.
for url in "http://127.0.0.1:$relay_port/w/abc/health" "http://127.0.0.1:$nginx_port/health" \
    "http://127.0.0.1:$quiet_port/w/abc/health" "http://127.0.0.1:$logging_port/health" \
    "http://127.0.0.1:$direct_port/health"; do
    wrk -t1 -c"$conns" -d1s -s benches/e2e_wrk.lua "$url" > /dev/null
done
for round in 1 2; do
    run relay "http://127.0.0.1:$relay_port/w/abc/health" "$relay_pid" "$worker_pid"
    run nginx "http://127.0.0.1:$nginx_port/health" "$nginx_worker" "$direct_pid"
    run relay-quiet "http://127.0.0.1:$quiet_port/w/abc/health" "$quiet_relay_pid" "$quiet_worker_pid"
    run nginx-logging "http://127.0.0.1:$logging_port/health" "$nginx_worker" "$direct_pid"
    run direct "http://127.0.0.1:$direct_port/health" "$direct_pid"
done
relay_rate="$(awk "BEGIN { print ${rate[relay]} }")" direct_rate="$(awk "BEGIN { print ${rate[direct]} }")"
nginx_rate="$(awk "BEGIN { print ${rate[nginx]} }")"
relay_p50="$(awk "BEGIN { print (${p50[relay]}) / 2 }")" direct_p50="$(awk "BEGIN { print (${p50[direct]}) / 2 }")"
awk -v r="$relay_rate" -v d="$direct_rate" -v rp="$relay_p50" -v dp="$direct_p50" 'BEGIN {
    printf "\nthrough the relay vs direct: %.2fx the rate; p50 %.0f vs %.0f us: %.0f us added (goal <= 50 us)\n",
        r / d, rp, dp, rp - dp
}'
awk -v r="$relay_rate" -v n="$nginx_rate" -v d="$direct_rate" 'BEGIN {
    printf "nginx proxy_pass vs direct: %.2fx; relay + worker vs nginx proxy_pass: %.2fx (issue 42: goal >= 1.0x, stretch 1.2x)\n",
        n / d, r / n
}'
quiet_rate="$(awk "BEGIN { print ${rate[relay-quiet]} }")" logging_rate="$(awk "BEGIN { print ${rate[nginx-logging]} }")"
awk -v r="$relay_rate" -v q="$quiet_rate" -v n="$nginx_rate" -v l="$logging_rate" 'BEGIN {
    printf "like for like: neither logging each request %.2fx (relay-quiet / nginx), both logging each request %.2fx (relay / nginx-logging)\n",
        q / n, r / l
}'
