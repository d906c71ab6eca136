#!/usr/bin/env bash
# Prepare a Debian/Ubuntu machine for diagnoser's demo, tests and benchmarks:
# the real servers the tests run (Prometheus, Redis, redis_exporter, elasticsearch_exporter),
# load-generator references (wrk, hey), and a virtualenv with diagnoser installed in it.
# Safe to re-run: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(prometheus redis-server prometheus-redis-exporter prometheus-elasticsearch-exporter wrk hey openssl python3-venv)
NEEDED_COMMANDS=(prometheus promtool redis-server prometheus-redis-exporter prometheus-elasticsearch-exporter wrk hey openssl)
VENV=${VENV:-.venv}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for command in "${NEEDED_COMMANDS[@]}"; do
  command -v "$command" >/dev/null 2>&1 || missing+=("$command")
done
python3 -m venv --help >/dev/null 2>&1 || missing+=(python3-venv)

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages (missing: ${missing[*]})"
  # The packages ship daemons; keep apt from starting them (the tests start their own on
  # 127.0.0.1). policy-rc.d is created only for the install and only if it was absent.
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod +x /usr/sbin/policy-rc.d
    created_policy=1
  fi
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
  if [ "$created_policy" -eq 1 ]; then as_root rm -f /usr/sbin/policy-rc.d; fi
fi

stamp="$VENV/.diagnoser-installed"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing diagnoser and its development tools into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e '.[dev]'
  touch "$stamp"
fi
