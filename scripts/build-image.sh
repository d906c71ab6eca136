#!/usr/bin/env bash
# Build diagnoser's container image (Dockerfile) with whichever builder is installed: docker (its
# daemon running), podman, or buildah. `make image` runs this.
#
#   make image                                   # tags diagnoser:dev
#   make image IMAGE=ghcr.io/acme/diagnoser:0.1.0 BUILDER=podman
#   make image BASE_IMAGE=python:3.11-slim-bookworm@sha256:...   # another base for one build
#   BUILD_FLAGS="--network host" make image      # extra flags for the builder
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-diagnoser:dev}
builder=${BUILDER:-}
if [ -z "$builder" ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    builder=docker
  elif command -v podman >/dev/null 2>&1; then
    builder=podman
  elif command -v buildah >/dev/null 2>&1; then
    builder=buildah
  elif command -v docker >/dev/null 2>&1; then
    echo "make image: docker is installed but its daemon does not answer (docker info failed), and" \
      "neither podman nor buildah is installed. Start the docker daemon or install podman" \
      "(Debian: apt-get install podman)." >&2
    exit 1
  else
    echo "make image: no container builder: install docker, podman or buildah" \
      "(Debian: apt-get install podman), or set BUILDER." >&2
    exit 1
  fi
fi

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# SOURCE_DATE_EPOCH (reproducible-builds.org) fixes the creation date, e.g. to the commit's.
created=$(date -u ${SOURCE_DATE_EPOCH:+--date=@$SOURCE_DATE_EPOCH} +%Y-%m-%dT%H:%M:%SZ)
args=(--tag "$IMAGE" --file Dockerfile
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "CREATED=$created")
if [ -n "${BASE_IMAGE:-}" ]; then args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE"); fi
# shellcheck disable=SC2206  # BUILD_FLAGS is a list of flags, split on purpose
extra=(${BUILD_FLAGS:-})

echo "make image: building $IMAGE with $builder"
case "$builder" in
  docker | podman) exec "$builder" build "${args[@]}" "${extra[@]}" . ;;
  buildah) exec buildah build "${args[@]}" "${extra[@]}" . ;;
  *) echo "make image: unknown BUILDER '$builder' (docker, podman or buildah)" >&2; exit 1 ;;
esac
