#!/usr/bin/env bash
# A shaped link: does a small request (GET /health) through relay + worker wait
# behind another stream's bulk body? Measured against a floor, the same app
# served directly across the same link.
#
#   bash benches/slow_link.sh [--rates "2 10 40"] [--relay PATH] [--worker PATH] [--quick] [--warmup S] [--tls]
#
# --warmup S: seconds between a bulk transfer's start and the first probe
# (the probe's default, 0.5 s). A probe in the first second of a transfer
# sometimes waits 70-370 ms (BENCHMARKS.md, "On a slow link"); the test
# measures after it (1.5 s).
#   bash benches/slow_link.sh --strata VENV_BIN_DIR [--upload-mib 64] [--rates ..] [--relay PATH] [--tls]
#
# Two network namespaces of its own (wrl-a-PID: the relay and the callers;
# wrl-b-PID: the worker and the floor), a veth pair between them addressed
# 10.213.X.1/24 (A) and 10.213.X.2/24 (B), nothing else addressed, and on both
# ends `tc qdisc ... root tbf rate ${R}mbit burst 32kbit latency 50ms` (each
# direction shaped; no netem: no added delay, the queue is the tbf's). Needs
# root, `ip`, `tc` and python3; without them it says why and exits 0
# ("skipped"). The namespaces and every process in them go on exit, whatever
# the exit (the trap). benches/slow_link_probe.py measures, inside A:
#
#   floor: worker --listen 10.213.X.2:PORT, called from A across the link
#   relay: relay --listen in A; worker --connect ws://10.213.X.1:PORT/connect
#          --allow-insecure in B (--tls: https/wss with a CA made here); called
#          at http://127.0.0.1:PORT/w/slow/... in A
#
# For each rate and each of download and upload: one bulk transfer, then 30
# probes GET /health 100 ms apart on a kept-alive connection of their own,
# while the bulk runs (p50, p99 = nearest rank: of 30, the largest), and the
# bulk's Mbit/s; then two bulk downloads at once (fairness: each one's share).
# Prints a table and the RESULT lines (one per result, key=value).
#
# --strata VENV_BIN_DIR: the real Strata worker instead of our example
# (VENV_BIN_DIR/strata-worker, PyPI strata-notebook, e.g. target/interop-venv/bin
# as .ci/interop makes it): `strata-worker --connect ws://10.213.X.1:PORT/connect`
# in B (--tls: wss, trusting the CA through SSL_CERT_FILE), and as the floor the
# same strata-worker serving directly (its uvicorn mode: --host 10.213.X.2
# --port PORT) in B. Both with the tokens in their environment only, no
# inherited STRATA_* or proxy variables, TMPDIR in this run's temporary
# directory. Strata has no /bytes or /sha256, so per rate and path: 30 probes on
# an idle link (dir=idle), then 30 probes during one upload (dir=upload) of
# --upload-mib MiB (default 64) to POST /v1/execute: a multipart body whose
# input part is a JSON string of that many bytes, which the cell hashes; the
# answer (a tar) must hold the length and SHA-256 sent (answer_ok=1), and
# bulk_ok=1 also needs all 30 probes to have ended while the body was still
# crossing the link (in_upload=30). The upload's rate comes from the link
# itself (A's veth tx counter): see the probe. After
# each rate, a `dir=worker` line counts the relay worker's (re)connects and
# losses in its log (a keepalive timeout shows there).
#
# Each probe phase is bounded (150 s; --quick: 12 s): probes still to run
# then are reported as unrun=K (and the table shows them). --quick also has a
# 4 s fairness window (else 5 s; longer below 8 Mbit/s, see PIECE in the
# probe) and no floor fairness run (tests/slow_link.rs uses --quick). Each
# rate's probe run is bounded by timeout(1). Without --relay and --worker the
# release examples are used (built if absent).
set -uo pipefail

usage() {
    echo 'usage: bash benches/slow_link.sh [--rates "2 10 40"] [--relay PATH] [--worker PATH] [--quick] [--warmup S] [--tls] [--strata VENV_BIN_DIR [--upload-mib N]]' >&2
    echo '       bash benches/slow_link.sh --strata VENV_BIN_DIR [--upload-mib N] [--rates ..] [--relay PATH] [--quick] [--tls]' >&2
    exit 2
}

RATES="2 10 40"
RELAY_BIN="" WORKER_BIN="" QUICK=0 TLS=0 STRATA_DIR="" UPLOAD_MIB=64 WARMUP=""
while [ $# -gt 0 ]; do
    case "$1" in
        --rates) [ $# -ge 2 ] || usage; RATES="$2"; shift 2 ;;
        --relay) [ $# -ge 2 ] || usage; RELAY_BIN="$2"; shift 2 ;;
        --worker) [ $# -ge 2 ] || usage; WORKER_BIN="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --warmup) [ $# -ge 2 ] || usage; WARMUP="$2"; shift 2 ;;
        --tls) TLS=1; shift ;;
        --strata) [ $# -ge 2 ] || usage; STRATA_DIR="$2"; shift 2 ;;
        --upload-mib) [ $# -ge 2 ] || usage; UPLOAD_MIB="$2"; shift 2 ;;
        -h|--help) usage ;;
        *) echo "slow_link: unknown argument $1" >&2; usage ;;
    esac
done
for r in $RATES; do
    [[ "$r" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "slow_link: --rates: $r is not a number of Mbit/s" >&2; exit 2; }
done
[ -n "${RATES// /}" ] || usage
[[ "$UPLOAD_MIB" =~ ^[1-9][0-9]*$ ]] || { echo "slow_link: --upload-mib: $UPLOAD_MIB is not a whole number of MiB" >&2; exit 2; }
if [ -n "$STRATA_DIR" ] && [ -n "$WORKER_BIN" ]; then
    echo "slow_link: --strata and --worker exclude each other" >&2; exit 2
fi

skip() {
    echo "slow_link: skipped: $*"
    exit 0
}
say() { echo "slow_link: $*" >&2; }

# Paths given are taken from the caller's directory, before the cd.
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
[ -n "$RELAY_BIN" ] && RELAY_BIN=$(abs "$RELAY_BIN")
[ -n "$WORKER_BIN" ] && WORKER_BIN=$(abs "$WORKER_BIN")
[ -n "$STRATA_DIR" ] && STRATA_DIR=$(abs "$STRATA_DIR")
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
PROBE="$ROOT/benches/slow_link_probe.py"

# What it needs, or a skip.
[ "$(id -u)" = 0 ] || skip "not root (network namespaces and tc need it)"
PATH="$PATH:/usr/sbin:/sbin"
command -v ip >/dev/null || skip "no ip (iproute2)"
command -v tc >/dev/null || skip "no tc (iproute2)"
command -v python3 >/dev/null || skip "no python3"
command -v timeout >/dev/null || skip "no timeout (coreutils)"
if [ "$TLS" = 1 ] && ! command -v openssl >/dev/null; then
    skip "--tls needs openssl to make the certificate"
fi

# The binaries.
STRATA_BIN=""
if [ -n "$STRATA_DIR" ]; then
    STRATA_BIN="$STRATA_DIR/strata-worker"
    [ -x "$STRATA_BIN" ] || { say "--strata: $STRATA_BIN: not an executable (bash .ci/interop makes target/interop-venv)"; exit 2; }
    WORKER_BIN="$STRATA_BIN"
fi
if [ -z "$RELAY_BIN" ] || [ -z "$WORKER_BIN" ]; then
    : "${RELAY_BIN:=$ROOT/target/release/examples/relay}"
    : "${WORKER_BIN:=$ROOT/target/release/examples/worker}"
    if [ ! -x "$RELAY_BIN" ] || [ ! -x "$WORKER_BIN" ]; then
        say "building the release examples"
        cargo build --release --examples >&2 || { say "the build failed"; exit 1; }
    fi
fi
for b in "$RELAY_BIN" "$WORKER_BIN"; do
    [ -x "$b" ] || { say "$b: not an executable"; exit 2; }
done

NS_A="wrl-a-$$"
NS_B="wrl-b-$$"
X=$(( $$ % 250 + 1 ))
IP_A="10.213.$X.1"
IP_B="10.213.$X.2"
DEV_A="wrl-va"
DEV_B="wrl-vb"
RPORT=8080   # the relay, in A (the namespace is private: a fixed port is fine)
FPORT=8081   # the floor, in B
WORKER_ID="slow"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/slow-link.XXXXXX") || exit 1
PIDS=()
MADE_NS=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    # Whatever else runs in our own namespaces (started by us): the same.
    local ns
    for ns in "${MADE_NS[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$p" 2>/dev/null; done
    done
    local _
    for _ in $(seq 30); do   # at most 3 s for them to go
        local alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        for ns in "${MADE_NS[@]}"; do [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for ns in "${MADE_NS[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null || say "warning: could not delete namespace $ns"
    done
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

# Runs "$@" in the background and waits for it, so that a signal's trap runs
# at once (bash defers traps while a foreground child runs).
bg_wait() {
    "$@" &
    local pid=$!
    PIDS+=("$pid")
    wait "$pid"
}

# The namespaces and the link.
ip netns add "$NS_A" 2>"$TMP/err" || skip "cannot create a network namespace: $(cat "$TMP/err")"
MADE_NS+=("$NS_A")
ip netns add "$NS_B" 2>"$TMP/err" || skip "cannot create a network namespace: $(cat "$TMP/err")"
MADE_NS+=("$NS_B")
ip -n "$NS_A" link add "$DEV_A" type veth peer name "$DEV_B" netns "$NS_B" 2>"$TMP/err" \
    || skip "cannot create a veth pair: $(cat "$TMP/err")"
ip -n "$NS_A" addr add "$IP_A/24" dev "$DEV_A" || exit 1
ip -n "$NS_B" addr add "$IP_B/24" dev "$DEV_B" || exit 1
for ns_dev in "$NS_A:$DEV_A" "$NS_B:$DEV_B"; do
    ip -n "${ns_dev%%:*}" link set lo up || exit 1
    ip -n "${ns_dev%%:*}" link set "${ns_dev#*:}" up || exit 1
done

# Shapes both ends (each direction) to $1 Mbit/s.
shape() {
    local ns_dev
    for ns_dev in "$NS_A:$DEV_A" "$NS_B:$DEV_B"; do
        ip netns exec "${ns_dev%%:*}" tc qdisc replace dev "${ns_dev#*:}" root \
            tbf rate "${1}mbit" burst 32kbit latency 50ms 2>"$TMP/err" || return 1
    done
}
shape "${RATES%% *}" || skip "tc tbf is not available: $(cat "$TMP/err")"

# Tokens (never on a command line).
secret() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
CONNECT_TOKEN="ct-$(secret)"
export WRL_TOKEN="wt-$(secret)"
printf '# slow_link.sh\n%s %s\n' "$WORKER_ID" "$CONNECT_TOKEN" >"$TMP/tokens"

# TLS: a CA and a leaf for 10.213.X.1 (the worker's dial) and 127.0.0.1 (callers).
RELAY_TLS=() WORKER_TLS=() CAFILE=()
SCHEME=http WS=ws
if [ "$TLS" = 1 ]; then
    (
        cd "$TMP" || exit 1
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout ca.key -out ca.pem -days 2 -subj "/CN=slow-link test CA" &&
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout relay.key -out relay.csr -subj "/CN=$IP_A" &&
        printf 'subjectAltName=IP:%s,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
            "$IP_A" >leaf.ext &&
        openssl x509 -req -in relay.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -out relay.pem -days 2 -extfile leaf.ext
    ) >"$TMP/openssl.log" 2>&1 || { cat "$TMP/openssl.log" >&2; skip "--tls: openssl could not make a certificate"; }
    RELAY_TLS=(--tls-cert "$TMP/relay.pem" --tls-key "$TMP/relay.key")
    WORKER_TLS=(--ca-file "$TMP/ca.pem")
    CAFILE=(--cafile "$TMP/ca.pem")
    SCHEME=https WS=wss
fi

# Waits (at most $3 s) until file $1 has a line containing $2, while pid $4 lives.
wait_log() {
    local end=$(( SECONDS + $3 ))
    while [ "$SECONDS" -lt "$end" ]; do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        kill -0 "$4" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
died() {
    say "$1; its log:"
    tail -n 20 "$2" >&2
    exit 1
}

# The relay, in A; the worker only once the relay listens.
ip netns exec "$NS_A" "$RELAY_BIN" --listen "0.0.0.0:$RPORT" --tokens "$TMP/tokens" "${RELAY_TLS[@]}" \
    </dev/null >/dev/null 2>"$TMP/relay.log" &
RELAY_PID=$!
PIDS+=("$RELAY_PID")
wait_log "$TMP/relay.log" "listening on" 20 "$RELAY_PID" || died "the relay did not start" "$TMP/relay.log"

if [ -z "$STRATA_BIN" ]; then
STRATA_WORKER_CONNECT_TOKEN="$CONNECT_TOKEN" STRATA_WORKER_TOKEN="$WRL_TOKEN" \
    ip netns exec "$NS_B" "$WORKER_BIN" --connect "$WS://$IP_A:$RPORT/connect" --allow-insecure "${WORKER_TLS[@]}" \
    </dev/null >/dev/null 2>"$TMP/worker.log" &
WORKER_PID=$!
PIDS+=("$WORKER_PID")

# The floor: the same app, directly, in B.
STRATA_WORKER_TOKEN="$WRL_TOKEN" ip netns exec "$NS_B" "$WORKER_BIN" --listen "0.0.0.0:$FPORT" \
    </dev/null >/dev/null 2>"$TMP/floor.log" &
FLOOR_PID=$!
PIDS+=("$FLOOR_PID")
wait_log "$TMP/floor.log" "serving the app directly" 20 "$FLOOR_PID" || died "the floor did not start" "$TMP/floor.log"
else
# strata-worker: its environment without inherited STRATA_* or proxy
# variables (as .ci/interop), the tokens in it only, its scratch files in $TMP.
mkdir -p "$TMP/strata-tmp" || exit 1
strata() {   # strata ENV_ASSIGNMENTS... -- ARGS...: exec's strata-worker in B
    local v
    for v in $(compgen -e); do
        case "$v" in STRATA_* | *_proxy | *_PROXY | SSL_CERT_FILE | SSL_CERT_DIR | WRL_TOKEN) unset "$v" ;; esac
    done
    export PYTHONUNBUFFERED=1 TMPDIR="$TMP/strata-tmp"
    while [ "$1" != -- ]; do export "${1?}"; shift; done
    shift
    exec ip netns exec "$NS_B" "$STRATA_BIN" "$@"
}
STRATA_CA=()
[ "$TLS" = 1 ] && STRATA_CA=("SSL_CERT_FILE=$TMP/ca.pem")
( strata "STRATA_WORKER_CONNECT_TOKEN=$CONNECT_TOKEN" "STRATA_WORKER_TOKEN=$WRL_TOKEN" "${STRATA_CA[@]}" -- \
    --connect "$WS://$IP_A:$RPORT/connect" --log-level info ) </dev/null >/dev/null 2>"$TMP/worker.log" &
WORKER_PID=$!
PIDS+=("$WORKER_PID")

# The floor: strata-worker serving directly (uvicorn), in B.
( strata "STRATA_WORKER_TOKEN=$WRL_TOKEN" -- --host "$IP_B" --port "$FPORT" --log-level warning ) \
    </dev/null >/dev/null 2>"$TMP/floor.log" &
FLOOR_PID=$!
PIDS+=("$FLOOR_PID")
# (at --log-level warning uvicorn says nothing once it listens: the probe's
# --ready below waits for it.)
fi

FLOOR_URL="http://$IP_B:$FPORT"
READY=20
[ -n "$STRATA_BIN" ] && READY=60   # Python's start-up, and on 2 busy cores
RELAY_URL="$SCHEME://127.0.0.1:$RPORT/w/$WORKER_ID"
# Both answer /health 200 (the worker has connected), within $READY s.
if ! bg_wait ip netns exec "$NS_A" timeout $(( READY + 10 )) python3 "$PROBE" --rate "${RATES%% *}" \
        --floor "$FLOOR_URL" --relay "$RELAY_URL" "${CAFILE[@]}" --ready "$READY"; then
    kill -0 "$WORKER_PID" 2>/dev/null || died "the worker exited" "$TMP/worker.log"
    say "relay log:"; tail -n 20 "$TMP/relay.log" >&2
    [ -n "$STRATA_BIN" ] && { say "floor log:"; tail -n 20 "$TMP/floor.log" >&2; }
    died "the worker is not reachable through the relay" "$TMP/worker.log"
fi

if [ "$QUICK" = 1 ]; then
    MODE=(--phase-limit 12 --fair-window 4)
    LIMIT=150
else
    MODE=(--phase-limit 150 --fair-window 5 --floor-fair)
    LIMIT=1200
fi
[ -z "$WARMUP" ] || MODE+=(--warmup "$WARMUP")
if [ -n "$STRATA_BIN" ]; then
    MODE+=(--strata-upload "$UPLOAD_MIB" --link-dev "$DEV_A")
fi
# Strata: a rate's run is two uploads (floor, relay) of UPLOAD_MIB MiB, each
# bounded in the probe by 1.5 x its time at the link's rate + 120 s; this
# bounds the whole run above that.
strata_limit() {
    awk -v m="$UPLOAD_MIB" -v r="$1" 'BEGIN { printf "%d", 2 * (m * 8.389 / r * 1.5 + 120 + 60) + 120 }'
}

say "namespaces $NS_A ($IP_A) and $NS_B ($IP_B); tbf burst 32kbit latency 50ms on both ends;" \
    "$(if [ "$TLS" = 1 ]; then echo TLS; else echo plain; fi); relay $RELAY_BIN; worker $WORKER_BIN$([ -n "$STRATA_BIN" ] && echo " (strata, floor: the same, directly; upload $UPLOAD_MIB MiB)")"
: >"$TMP/results"
for rate in $RATES; do
    shape "$rate" || { say "tc: $(cat "$TMP/err")"; exit 1; }
    say "rate ${rate} Mbit/s ..."
    [ -n "$STRATA_BIN" ] && LIMIT=$(strata_limit "$rate")
    bg_wait ip netns exec "$NS_A" timeout "$LIMIT" python3 "$PROBE" --rate "$rate" \
        --floor "$FLOOR_URL" --relay "$RELAY_URL" "${CAFILE[@]}" "${MODE[@]}" >"$TMP/rate.out"
    rc=$?
    grep '^RESULT ' "$TMP/rate.out" | tee -a "$TMP/results" >&2
    [ "$rc" = 0 ] || say "warning: the probes at ${rate} Mbit/s ended with status $rc (124: timed out)"
    if [ -n "$STRATA_BIN" ]; then
        # The relay worker's connection during this rate: connects (the first
        # one included at the first rate), losses (a keepalive timeout among
        # them), the relay closing it.
        seen=$(wc -l <"$TMP/worker.log")
        tail -n +"$(( ${SEEN:-0} + 1 ))" "$TMP/worker.log" | head -n "$(( seen - ${SEEN:-0} ))" >"$TMP/worker.part"
        SEEN=$seen
        printf 'RESULT rate=%s path=relay dir=worker connects=%s lost=%s keepalive_timeouts=%s closed_by_relay=%s\n' "$rate" \
            "$(grep -c 'Connected to the relay' "$TMP/worker.part")" \
            "$(grep -c 'Lost the relay' "$TMP/worker.part")" \
            "$(grep -ci 'keepalive ping timeout' "$TMP/worker.part")" \
            "$(grep -c 'closed the connection' "$TMP/worker.part")" | tee -a "$TMP/results" >&2
        grep -E 'Lost the relay|closed the connection|Traceback|ERROR' "$TMP/worker.part" | head -n 5 | sed 's/^/slow_link: worker: /' >&2
    fi
    for p in "$RELAY_PID" "$WORKER_PID" "$FLOOR_PID"; do
        kill -0 "$p" 2>/dev/null || { say "a process died; logs:"; tail -n 20 "$TMP"/*.log >&2; exit 1; }
    done
done

# The table. Both kinds read the RESULT lines the same way: get(line, key),
# and r, p, d (rate, path, dir) with the rates in order of appearance.
AWK_RESULT='
function get(line, key,    n, i, f, kv) {
    n = split(line, f, " ")
    for (i = 2; i <= n; i++) { split(f[i], kv, "="); if (kv[1] == key) return kv[2] }
    return "-"
}
/^RESULT / {
    r = get($0, "rate"); p = get($0, "path"); d = get($0, "dir")
    if (!(r in seen)) { seen[r] = 1; order[++nr] = r }
'
echo
if [ -n "$STRATA_BIN" ]; then
echo "slow link, strata-worker: tbf rate R burst 32kbit latency 50ms each way; /health probes p50/p99 ms (p99 of 30 = the max); upload of $UPLOAD_MIB MiB to /v1/execute: body Mbit/s (its goodput on the link), (the link's Mbit/s while probed)"
awk "$AWK_RESULT"'
    if (d == "worker") {
        w[r] = sprintf("connects %s, lost %s, keepalive timeouts %s", get($0, "connects"), get($0, "lost"), get($0, "keepalive_timeouts"))
    } else if (d == "idle") {
        c[r, p, d] = sprintf("%s/%s", get($0, "p50_ms"), get($0, "p99_ms"))
    } else {
        cell = sprintf("%s/%s, %s (%s)", get($0, "p50_ms"), get($0, "p99_ms"), get($0, "bulk_mbps"), get($0, "link_mbps"))
        if (get($0, "answer_ok") != "1") cell = cell " BAD ANSWER"
        else if (get($0, "bulk_ok") != "1") cell = cell sprintf(" (%s in upload)", get($0, "in_upload"))
        if (get($0, "fail") + 0 > 0 || get($0, "unrun") + 0 > 0)
            cell = cell sprintf(" [%s fail, %s unrun]", get($0, "fail"), get($0, "unrun"))
        c[r, p, d] = cell
    }
}
END {
    fmt = "%-5s | %-11s | %-11s | %-40s | %-40s\n"
    printf fmt, "rate", "floor idle", "relay idle", "floor upload", "relay upload"
    printf fmt, "Mbit", "p50/p99 ms", "p50/p99 ms", "p50/p99 ms, Mbit/s (link)", "p50/p99 ms, Mbit/s (link)"
    for (i = 1; i <= nr; i++) {
        r = order[i]
        printf fmt, r, c[r, "floor", "idle"], c[r, "relay", "idle"], c[r, "floor", "upload"], c[r, "relay", "upload"]
    }
    print ""
    for (i = 1; i <= nr; i++) if (order[i] in w) printf "relay worker at %s Mbit/s: %s\n", order[i], w[order[i]]
}' "$TMP/results"
echo
cat "$TMP/results"
exit 0
fi
echo "slow link: tbf rate R burst 32kbit latency 50ms each way; /health probes p50/p99 ms (p99 of 30 = the max), bulk Mbit/s"
awk "$AWK_RESULT"'
    if (d == "fair") {
        fair[r, p] = sprintf("%s + %s (min share %s)", get($0, "a_mbps"), get($0, "b_mbps"), get($0, "min_share"))
    } else {
        cell = sprintf("%s/%s, %s", get($0, "p50_ms"), get($0, "p99_ms"), get($0, "bulk_mbps"))
        if (get($0, "fail") + 0 > 0 || get($0, "unrun") + 0 > 0)
            cell = cell sprintf(" [%s fail, %s unrun]", get($0, "fail"), get($0, "unrun"))
        c[r, p, d] = cell
    }
}
END {
    fmt = "%-5s | %-22s | %-22s | %-22s | %-22s\n"
    printf fmt, "rate", "floor download", "relay download", "floor upload", "relay upload"
    printf fmt, "Mbit", "p50/p99 ms, Mbit/s", "p50/p99 ms, Mbit/s", "p50/p99 ms, Mbit/s", "p50/p99 ms, Mbit/s"
    for (i = 1; i <= nr; i++) {
        r = order[i]
        printf fmt, r, c[r, "floor", "download"], c[r, "relay", "download"], c[r, "floor", "upload"], c[r, "relay", "upload"]
    }
    print ""
    for (i = 1; i <= nr; i++) {
        r = order[i]
        if ((r, "relay") in fair) printf "fairness at %s Mbit/s, relay: %s Mbit/s\n", r, fair[r, "relay"]
        if ((r, "floor") in fair) printf "fairness at %s Mbit/s, floor: %s Mbit/s\n", r, fair[r, "floor"]
    }
}' "$TMP/results"
echo
cat "$TMP/results"
