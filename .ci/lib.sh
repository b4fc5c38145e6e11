# Shared by the .ci scripts (sourced, not run): the network installs'
# retry and the pins they install.
#
# Pins (change them here, and say why in the commit):
#   CI_FUZZ_TOOLCHAIN   the nightly the fuzzers build with (cargo-fuzz needs
#                       nightly); 2026-05-20 is rustc 1.97.0-nightly
#                       (e50aa6fba 2026-05-19), on which libfuzzer-sys 0.4.13
#                       (fuzz/Cargo.lock) and the harness build.
#   CI_CARGO_FUZZ       cargo-fuzz, installed with --locked (its own lockfile).
#   CI_STRATA_PIN       the real Strata worker (.ci/interop, .ci/wheel); every
#                       package it pulls in is pinned by
#                       .ci/interop-constraints.txt.
#   CI_MATURIN          maturin, which builds the wheel of the binary
#                       worker-relay (.ci/wheel).
CI_FUZZ_TOOLCHAIN="${CI_FUZZ_TOOLCHAIN:-nightly-2026-05-20}"
CI_CARGO_FUZZ="${CI_CARGO_FUZZ:-0.13.2}"
CI_STRATA_PIN='strata-notebook[notebook]==0.11.0'
CI_MATURIN='maturin==1.16.0'

# retry CMD...: runs CMD until it succeeds, at most CI_RETRIES times (4 by
# default), waiting 10 s, 20 s, 40 s between attempts. For network
# installs only: a deterministic failure still fails, just later.
retry() {
    local attempts="${CI_RETRIES:-4}" attempt=1 delay=10
    until "$@"; do
        if [ "$attempt" -ge "$attempts" ]; then
            echo "retry: '$*' failed $attempt times; giving up" >&2
            return 1
        fi
        echo "retry: '$*' failed (attempt $attempt of $attempts); again in ${delay}s" >&2
        sleep "$delay"
        attempt=$((attempt + 1))
        delay=$((delay * 2))
    done
}

# has_toolchain NAME: rustup has toolchain NAME (never installs it).
has_toolchain() {
    RUSTUP_AUTO_INSTALL=0 rustup run "$1" rustc --version >/dev/null 2>&1
}

# install_toolchain NAME: has_toolchain, or installs NAME (minimal profile)
# from static.rust-lang.org: 3 attempts of at most 5 minutes each.
install_toolchain() {
    has_toolchain "$1" \
        || CI_RETRIES=3 retry timeout 300 rustup toolchain install "$1" --profile minimal --no-self-update
}

# apt_update: refreshes Debian's package lists (once per script), as root.
CI_APT_UPDATED=""
apt_update() {
    if [ "$(id -u)" != 0 ]; then
        echo "apt: installing packages needs root" >&2
        return 1
    fi
    [ -n "$CI_APT_UPDATED" ] && return 0
    retry apt-get update -qq || return 1
    CI_APT_UPDATED=1
}

# apt_has PACKAGE: the package lists (after apt_update) have a version of
# PACKAGE to install (not a purely virtual name).
apt_has() {
    # Not a pipe into grep -q: under pipefail, apt-cache's SIGPIPE when grep
    # stops at the first match would read as "no".
    local policy
    policy="$(apt-cache policy "$1" 2>/dev/null)" || return 1
    grep -q '^  Candidate: [^(]' <<<"$policy"
}

# apt_install PACKAGE...: Debian packages without recommends, as root, with
# the package's service kept from starting (a container without an init
# system has none to start it; elsewhere, it stays stopped). Debian's
# archive keeps only the current version of a package, so these are not
# pinned to a version; the scripts print the version they got.
apt_install() {
    apt_update || return 1
    export DEBIAN_FRONTEND=noninteractive
    local added_policy="" status=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        added_policy=1
    fi
    retry apt-get install -y -qq --no-install-recommends "$@" || status=$?
    if [ -n "$added_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
    return "$status"
}

# ci_host: the host's target triple (what `cargo fetch --target` needs to
# skip other platforms' crates).
ci_host() {
    rustc -vV | sed -n 's/^host: //p'
}

# ci_python: prints the path of a Python that really runs (a pyenv shim for
# a version that is not selected exists on PATH but fails) and is at least
# 3.12 (strata-notebook needs it): python3.12 on PATH, pyenv's 3.12, then
# any newer one; fails, saying what it tried, if there is none.
ci_python() {
    local candidates=(python3.12) root c
    if command -v pyenv >/dev/null 2>&1; then
        root="$(pyenv root 2>/dev/null || true)"
        if [ -n "$root" ]; then
            candidates+=("$root"/versions/3.12*/bin/python3)
        fi
    fi
    candidates+=(/root/.pyenv/versions/3.12*/bin/python3 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3)
    # Any newer Python as a last resort (the package needs >= 3.12).
    candidates+=(python3.13 python3)
    for c in "${candidates[@]}"; do
        { [ -x "$c" ] || command -v "$c" >/dev/null 2>&1; } || continue
        if "$c" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; then
            command -v "$c" 2>/dev/null || printf '%s\n' "$c"
            return 0
        fi
    done
    echo "no Python >= 3.12 found (tried python3.12 on PATH, \$(pyenv root)/versions/3.12*/bin/python3," >&2
    echo "/root/.pyenv/versions/3.12*/bin/python3, python3.13, python3). Install one, e.g. 'pyenv install 3.12'." >&2
    return 1
}
