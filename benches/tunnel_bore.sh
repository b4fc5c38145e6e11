#!/usr/bin/env bash
# Issue 28: the tunnel (`worker --upstream`) against nginx alone and against
# bore (a TCP tunnel from crates.io), side by side in one run; issue 42 adds
# nginx in the tunnel's own shape.
#
#   bash benches/tunnel_bore.sh
#   TUNNEL_SECONDS=10 TUNNEL_ROUNDS=3 bash benches/tunnel_bore.sh
#   TUNNEL_CONNS=64 bash benches/tunnel_bore.sh   # wrk's connections (16)
#
# nginx serves a 2-byte file and a 256 MiB file (sendfile on) on
# 127.0.0.1. The same files are fetched five ways (six with rathole):
#   nginx   directly;
#   tunnel  through the relay example and the worker example in tunnel
#           mode in front of that nginx (/w/abc/<file>), release builds;
#   bore    through `bore server` + `bore local` (both on 127.0.0.1);
#   proxy   through one nginx `proxy_pass` (kept-alive upstream connections,
#           one worker process): a proxy with no tunnel behind it;
#   chain   through two such nginx processes, one proxying to the other:
#           the tunnel's shape (two processes between the caller and the
#           server, each parsing HTTP) done by nginx;
#   rathole with TUNNEL_RATHOLE=1: another TCP tunnel (see below).
# Small: wrk -t1 -c16 (TUNNEL_CONNS) on the 2-byte file, each way in turn, TUNNEL_ROUNDS
# times, on kept-alive connections and then with a new connection per
# request (`Connection: close`: bore opens a tunnel connection per caller
# connection, the relay does not). Bulk: curl of the 256 MiB file, each way in turn, TUNNEL_ROUNDS
# times; the median rate. Tokens (the relay's, the worker's, bore's secret)
# are drawn at random and passed through files and the environment, never a
# command line. wrk and nginx are installed with apt-get if missing (as
# root), bore-cli with cargo into target/bore-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${TUNNEL_SECONDS:-5}"
rounds="${TUNNEL_ROUNDS:-2}"
conns="${TUNNEL_CONNS:-16}"
big_mib=256

. benches/lib.sh
need wrk wrk
need nginx nginx-light
need curl curl
nginx_bin="$(command -v nginx || echo /usr/sbin/nginx)"
bore=target/bore-cli/bin/bore
[ -x "$bore" ] || cargo install --locked --root target/bore-cli bore-cli --version 0.6.0
cargo build --release --example relay --example worker
bin=target/release/examples

dir="$(mktemp -d /tmp/worker-relay-tunnel.XXXXXX)"
chmod 755 "$dir"   # nginx's worker processes run as nobody
pids=() nginx_pid=""
cleanup() {
    exec 2>/dev/null
    [ -z "$nginx_pid" ] || kill -TERM "$nginx_pid" || true
    # TERM first: the nginx proxies' workers go with their masters.
    for p in "${pids[@]}"; do kill -TERM "$p" || true; done
    sleep 0.2
    for p in "${pids[@]}"; do kill -KILL "$p" || true; done
    wait || true
    rm -rf "$dir"
}
trap cleanup EXIT

mkdir -p "$dir/www"
printf ok > "$dir/www/small"
head -c "$((big_mib << 20))" /dev/urandom > "$dir/www/big"
chmod -R a+rX "$dir/www"
np="$(port)" rp="$(port)" bp="$(port)"
{ nginx_conf_head "$dir" nginx; cat <<EOF
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$np;
        root $dir/www;
    }
}
EOF
} > "$dir/nginx.conf"
"$nginx_bin" -c "$dir/nginx.conf" -p "$dir" &
nginx_pid=$!
wait_port "$np"

# An nginx proxy_pass to 127.0.0.1:$2 listening on $1 (one worker process,
# kept-alive upstream connections, up to 256 idle, nothing spilled to disk);
# its pid in proxy_pid.
nginx_proxy() {
    { nginx_conf_head "$dir" "proxy-$1"; cat <<EOF
    keepalive_requests 1000000;
    upstream up { server 127.0.0.1:$2; keepalive 256; }
    server {
        listen 127.0.0.1:$1;
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_max_temp_file_size 0;
        }
    }
}
EOF
    } > "$dir/proxy-$1.conf"
    "$nginx_bin" -c "$dir/proxy-$1.conf" -p "$dir" &
    proxy_pid=$!
    wait_port "$1"
}
pp="$(port)" cp1="$(port)" cp2="$(port)"
nginx_proxy "$pp" "$np"; proxy_master=$proxy_pid; pids+=("$proxy_pid")
nginx_proxy "$cp2" "$np"; chain_inner=$proxy_pid; pids+=("$proxy_pid")
nginx_proxy "$cp1" "$cp2"; chain_outer=$proxy_pid; pids+=("$proxy_pid")

worker_token="wt-$(secret)" connect_token="ct-$(secret)"
(umask 077; echo "abc $connect_token" > "$dir/tokens.txt"
 printf 'Authorization: Bearer %s\n' "$worker_token" > "$dir/auth.header")
"$bin/relay" --listen "127.0.0.1:$rp" --tokens "$dir/tokens.txt" 2> "$dir/relay.log" &
relay_pid=$!; pids+=($!)
wait_port "$rp"
STRATA_WORKER_CONNECT_TOKEN="$connect_token" STRATA_WORKER_TOKEN="$worker_token" \
    "$bin/worker" --connect "ws://127.0.0.1:$rp/connect" --upstream "http://127.0.0.1:$np" \
    2> "$dir/worker.log" &
worker_pid=$!; pids+=($!)
for _ in $(seq 200); do grep -q "worker abc connected" "$dir/relay.log" && break; sleep 0.05; done
grep -q "worker abc connected" "$dir/relay.log" || { cat "$dir"/*.log >&2; exit 1; }

BORE_SECRET="$(secret)"
export BORE_SECRET
"$bore" server --bind-addr 127.0.0.1 --min-port "$bp" --max-port "$bp" > "$dir/bore-server.log" 2>&1 &
bore_server_pid=$!; pids+=($!)
wait_port 7835
"$bore" local "$np" --local-host 127.0.0.1 --to 127.0.0.1 --port "$bp" > "$dir/bore-local.log" 2>&1 &
bore_local_pid=$!; pids+=($!)
wait_port "$bp"

# TUNNEL_RATHOLE=1: rathole too, another TCP tunnel from crates.io (a pool
# of data connections, no encryption, as bore), installed into
# target/rathole. Its lockfile pins a `time` that today's rustc no longer
# compiles, so it is resolved anew (not --locked).
rathole=target/rathole/bin/rathole
if [ -n "${TUNNEL_RATHOLE:-}" ]; then
    [ -x "$rathole" ] || cargo install --root target/rathole rathole --version 0.5.0 \
        --no-default-features --features server,client
    rhc="$(port)" rhp="$(port)" rathole_token="$(secret)"
    (umask 077
     printf '[server]\nbind_addr = "127.0.0.1:%s"\ndefault_token = "%s"\n[server.services.n]\nbind_addr = "127.0.0.1:%s"\n' \
         "$rhc" "$rathole_token" "$rhp" > "$dir/rathole-server.toml"
     printf '[client]\nremote_addr = "127.0.0.1:%s"\ndefault_token = "%s"\n[client.services.n]\nlocal_addr = "127.0.0.1:%s"\n' \
         "$rhc" "$rathole_token" "$np" > "$dir/rathole-client.toml")
    "$rathole" -s "$dir/rathole-server.toml" > "$dir/rathole-server.log" 2>&1 &
    rathole_server_pid=$!; pids+=($!)
    wait_port "$rhc"
    "$rathole" -c "$dir/rathole-client.toml" > "$dir/rathole-client.log" 2>&1 &
    rathole_client_pid=$!; pids+=($!)
    wait_port "$rhp"
fi

# CPU seconds (user + system) the processes of a way have used so far:
# nginx's workers in every way, and the way's own: the tunnel's, bore's or
# rathole's two processes, the proxies' nginx workers.
cpu() { for p in "$@"; do awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f\n", ($14 + $15) / hz }' "/proc/$p/stat"; done | awk '{ s += $1 } END { printf "%.3f", s }'; }
workers() { pgrep -P "$1" | tr '\n' ' '; }
nginx_workers="$(workers "$nginx_pid")"
declare -A procs=(
    [nginx]=""
    [tunnel]="$relay_pid $worker_pid"
    [bore]="$bore_server_pid $bore_local_pid"
    [proxy]="$(workers "$proxy_master")"
    [chain]="$(workers "$chain_outer") $(workers "$chain_inner")"
)
declare -A url=(
    [nginx]="http://127.0.0.1:$np"
    [tunnel]="http://127.0.0.1:$rp/w/abc"
    [bore]="http://127.0.0.1:$bp"
    [proxy]="http://127.0.0.1:$pp"
    [chain]="http://127.0.0.1:$cp1"
)
ways=(nginx tunnel bore proxy chain)
if [ -n "${TUNNEL_RATHOLE:-}" ]; then
    procs[rathole]="$rathole_server_pid $rathole_client_pid"
    url[rathole]="http://127.0.0.1:$rhp"
    ways+=(rathole)
    # Its client opens the data connections when the control one is up.
    for _ in $(seq 100); do curl -sf -m 1 -o /dev/null "${url[rathole]}/small" && break; sleep 0.1; done
fi
# Every way answers the small file before anything is measured.
for w in "${ways[@]}"; do
    got="$(curl -sf -H @"$dir/auth.header" "${url[$w]}/small")" \
        || { echo "$w does not answer" >&2; cat "$dir"/*.log >&2; exit 1; }
    [ "$got" = ok ] || { echo "$w answered '$got'" >&2; exit 1; }
done

export E2E_WRK_AUTH="$worker_token"
declare -A small=() bulk=() small_cpu=() fresh=()
for round in $(seq "$rounds"); do
    for w in "${ways[@]}"; do
        # shellcheck disable=SC2086 # pid lists
        before="$(cpu $nginx_workers ${procs[$w]})"
        out="$(wrk -t1 -c"$conns" -d"${seconds}s" -s benches/e2e_wrk.lua "${url[$w]}/small")"
        # shellcheck disable=SC2086
        after="$(cpu $nginx_workers ${procs[$w]})"
        errors="$(awk '/Non-2xx|Socket errors/' <<<"$out")"
        [ -z "$errors" ] || { echo "$w: $errors" >&2; exit 1; }
        r="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
        small[$w]="${small[$w]:-} $r"
        n="$(awk '/requests in/ {print $1}' <<<"$out")"
        us_per="$(awk -v a="$after" -v b="$before" -v n="$n" 'BEGIN { printf "%.1f", (a - b) * 1e6 / n }')"
        small_cpu[$w]="${small_cpu[$w]:-} $us_per"
        echo "round $round small $w: $r req/s, $us_per µs CPU per request (nginx + the way's processes)" >&2
    done
    for w in "${ways[@]}"; do
        out="$(wrk -t1 -c"$conns" -d"${seconds}s" -H "Connection: close" -s benches/e2e_wrk.lua "${url[$w]}/small")"
        r="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
        fresh[$w]="${fresh[$w]:-} $r"
        echo "round $round small, a connection each $w: $r req/s ($(awk '/Socket errors/' <<<"$out"))" >&2
    done
    for w in "${ways[@]}"; do
        read -r size t < <(curl -sf -H @"$dir/auth.header" -o /dev/null \
            -w '%{size_download} %{time_total}\n' "${url[$w]}/big")
        [ "$size" = "$((big_mib << 20))" ] || { echo "$w: $size bytes of the big file" >&2; exit 1; }
        m="$(awk -v s="$size" -v t="$t" 'BEGIN { printf "%.0f", s / t / 1048576 }')"
        bulk[$w]="${bulk[$w]:-} $m"
        echo "round $round bulk $w: $m MiB/s" >&2
    done
done

# Medians of the rounds, then the ratios.
median() { tr ' ' '\n' <<<"$1" | awk 'NF' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
echo "| way | small: req/s (rounds) | median | CPU µs/request (rounds) | a connection per request: req/s (rounds) | median | 256 MiB: MiB/s (rounds) | median |"
echo "|---|---|---|---|---|---|---|---|"
declare -A ms=() mb=() mf=()
for w in "${ways[@]}"; do
    ms[$w]="$(median "${small[$w]}")" mb[$w]="$(median "${bulk[$w]}")" mf[$w]="$(median "${fresh[$w]}")"
    printf '| %s |%s | %.0f |%s |%s | %.0f |%s | %.0f |\n' "$w" "${small[$w]}" "${ms[$w]}" "${small_cpu[$w]}" \
        "${fresh[$w]}" "${mf[$w]}" "${bulk[$w]}" "${mb[$w]}"
done
awk -v ts="${ms[tunnel]}" -v ns="${ms[nginx]}" -v bs="${ms[bore]}" -v ps="${ms[proxy]}" -v cs="${ms[chain]}" \
    -v tb="${mb[tunnel]}" -v nb="${mb[nginx]}" -v bb="${mb[bore]}" \
    -v tf="${mf[tunnel]}" -v nf="${mf[nginx]}" -v bf="${mf[bore]}" 'BEGIN {
    printf "\ntunnel / nginx: small %.2fx, 256 MiB %.2fx\n", ts / ns, tb / nb
    printf "tunnel / bore:  small %.2fx (issue 42: >= 1.5), 256 MiB %.2fx (issue 42: >= 1.3)\n", ts / bs, tb / bb
    printf "bore / nginx:   small %.2fx, 256 MiB %.2fx\n", bs / ns, bb / nb
    printf "nginx in the tunnel shape, small: chain / bore %.2fx, proxy / bore %.2fx; tunnel / chain %.2fx, tunnel / proxy %.2fx\n", cs / bs, ps / bs, ts / cs, ts / ps
    printf "a connection per request: tunnel / nginx %.2fx, tunnel / bore %.2fx\n", tf / nf, tf / bf
}'
[ -z "${TUNNEL_RATHOLE:-}" ] || awk -v ts="${ms[tunnel]}" -v bs="${ms[bore]}" -v rs="${ms[rathole]}" 'BEGIN {
    printf "rathole, small: rathole / bore %.2fx, tunnel / rathole %.2fx\n", rs / bs, ts / rs
}'
