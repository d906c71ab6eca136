# diagnoser's container image: `diagnose serve` as UID 10001 on a read-only root filesystem.
#
#   make image                      # docker, podman or buildah, whichever is installed
#   docker run --rm --read-only --tmpfs /tmp -v diagnoser-state:/var/lib/diagnoser \
#     -p 8080:8080 diagnoser:dev serve --prometheus-url http://prometheus:9090 --listen 0.0.0.0:8080
#
# Two stages: the first builds diagnoser's wheel and installs it with its dependencies into a
# virtualenv; the second is the slim Python runtime with that virtualenv alone (no compiler, no
# pip, no source tree). No HEALTHCHECK: Kubernetes probes /healthz and /readyz (deploy/).
#
# The base image is pinned by digest, so a rebuild gets the same bits until the pin is moved on
# purpose. To move it (e.g. for Debian security updates), look up the current digest of the tag
#   docker buildx imagetools inspect docker.io/library/python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}'
#   (or: skopeo inspect --raw docker://docker.io/library/python:3.11-slim-bookworm | sha256sum)
# and replace the sha256 below; `make image BASE_IMAGE=...` overrides it for one build.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The dependencies first, from pyproject.toml alone, so a change to the code reuses this layer.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/requirements.txt \
 && python3 -m venv /opt/diagnoser \
 && /opt/diagnoser/bin/pip install --requirement /tmp/requirements.txt
# Then diagnoser's wheel, from only what it is made of (see .dockerignore). Byte-code is compiled
# here: the runtime's root filesystem is read-only, so Python could not cache it later. pip and
# setuptools leave the virtualenv: the runtime installs nothing.
COPY README.md ./
COPY diagnoser ./diagnoser
COPY rules ./rules
COPY probes ./probes
COPY signals ./signals
RUN /opt/diagnoser/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/diagnoser/bin/pip install --no-deps /wheels/diagnoser-*.whl \
 && /opt/diagnoser/bin/pip uninstall --yes pip setuptools \
 && python3 -m compileall -q /opt/diagnoser

FROM ${BASE_IMAGE}
# A fixed, unprivileged identity that Kubernetes' runAsUser/runAsNonRoot can check numerically.
RUN groupadd --gid 10001 diagnoser \
 && useradd --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin diagnoser \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/diagnoser /etc/diagnoser
COPY --from=build /opt/diagnoser /opt/diagnoser
ENV PATH=/opt/diagnoser/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# State (SQLite) and temporary files are the only writes: mount volumes at these two paths and
# the root filesystem can be read-only.
VOLUME ["/var/lib/diagnoser"]
WORKDIR /var/lib/diagnoser
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["diagnose"]
# Configuration from DIAGNOSER_* variables (e.g. DIAGNOSER_PROMETHEUS__URL) or, as the manifests
# in deploy/ do, `serve --config /etc/diagnoser/config.yaml ...` from a mounted ConfigMap.
CMD ["serve", "--listen", "0.0.0.0:8080", "--state", "/var/lib/diagnoser/state.sqlite3", \
     "--log-format", "json"]

# Last, so that a new revision or date rebuilds only this layer.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="diagnoser" \
      org.opencontainers.image.description="Finds why a service is slow or failing, names the root cause, and tells the on-call engineer." \
      org.opencontainers.image.source="https://github.com/diagnoser/diagnoser" \
      org.opencontainers.image.documentation="https://github.com/diagnoser/diagnoser/blob/main/deploy/README.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
