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
# The head of a one-process nginx configuration in directory $1: pid file
# and error log named after $2, temporary files in $1, no access log, up to
# and inside its `http {`; the caller writes the rest and the closing brace.
nginx_conf_head() {  # nginx_conf_head DIR NAME
    cat <<NGINX
daemon off;
worker_processes 1;
pid $1/$2.pid;
error_log $1/$2-error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $1/client_body;
    proxy_temp_path $1/proxy;
    fastcgi_temp_path $1/fastcgi;
    uwsgi_temp_path $1/uwsgi;
    scgi_temp_path $1/scgi;
NGINX
}
