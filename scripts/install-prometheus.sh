#!/usr/bin/env bash
# Installs a real Prometheus server (Debian's `prometheus` package) for the observer's integration tests;
# the package also ships promtool, which the alert rules' tests run.
#
# The tests start the binary themselves on 127.0.0.1 with a temporary config and TSDB, so only the binary
# is needed: the package's own service is stopped and disabled where systemd runs it. Idempotent: does
# nothing when `prometheus` is already on PATH. Needs root (or sudo) for apt-get.
set -euo pipefail

die() {
    echo "install-prometheus: $*" >&2
    exit 1
}

print_version() {
    prometheus --version 2>&1 | head -n 1
}

if command -v prometheus >/dev/null; then
    print_version
    exit 0
fi

command -v apt-get >/dev/null || die "no apt-get here; install a prometheus >= 2.40 binary onto PATH by hand"

sudo=""
if [[ "$(id -u)" != "0" ]]; then
    command -v sudo >/dev/null || die "apt-get needs root; run as root or install sudo"
    sudo="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
${sudo} apt-get update -q
# --no-install-recommends keeps out the node exporter and the web console assets the tests do not use.
${sudo} apt-get install -y -q --no-install-recommends prometheus
if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    ${sudo} systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

command -v prometheus >/dev/null || die "apt-get installed the package but 'prometheus' is not on PATH"
print_version
