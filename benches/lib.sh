# Shell helpers shared by the benchmark scripts (sourced, not run).

# A free TCP port on 127.0.0.1.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# 32 random hex digits, for tokens.
secret() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
# Waits (at most 10 s) until something listens on 127.0.0.1:$1.
wait_port() {
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "nothing listens on $1" >&2; exit 1
}
# wrk's "631.00us" / "1.74ms" / "1.02s" in microseconds.
us() {
    awk '{ v = $1 + 0; if ($1 ~ /us$/) m = 1; else if ($1 ~ /ms$/) m = 1000; else m = 1000000; printf "%.0f", v * m }' <<<"$1"
}
# Installs a missing command with apt-get (as root; else says what to install).
need() {  # need COMMAND PACKAGE...
    command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "$(basename "$0"): $1 is missing (apt-get install ${*:2})" >&2
        exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${@:2}" \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
             apt-get install -y -qq --no-install-recommends "${@:2}"; }
}
