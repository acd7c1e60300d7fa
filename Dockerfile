# stratameter container image: `stratameter run` as a non-root user.
#
#   docker build -t stratameter:0.1.0 .
#   docker run --rm -p 9108:9108 -e STRATAMETER_KAFKA_BOOTSTRAP_SERVERS=kafka:9092 \
#       -e STRATAMETER_REDIS_URL=redis://redis:6379/0 stratameter:0.1.0
#
# Stage 1 builds a virtualenv with the project and its runtime dependencies
# (wheels only, no compilers needed); stage 2 copies just that venv onto a
# clean slim base.  Settings come from STRATAMETER_* variables (see
# service/config/); secrets are best passed as files (*_FILE variables).
# The filesystem can be mounted read-only: the code is byte-compiled at build
# time and the service writes nothing to disk.
#
# CI has no Docker engine, so the image is not built there; tests/test_ops.py
# runs hadolint on this file.  Deploy with the Helm chart in helm/stratameter.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY service ./service
RUN /opt/venv/bin/python -m pip install --no-cache-dir . \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="stratameter" \
      org.opencontainers.image.description="Continuous, label-efficient precision monitoring of deployed classifiers" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    STRATAMETER_HTTP_PORT=9108
RUN groupadd --system --gid 10001 stratameter \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin stratameter
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
EXPOSE 9108
# Liveness of the HTTP server, with the interpreter already in the image (no curl).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('STRATAMETER_HTTP_PORT', '9108'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status == 200 else 1)"]
# SIGTERM (docker stop, Kubernetes) makes the service finish its batch, commit and exit 0.
# `docker run IMAGE simulate --builtin calibrated` runs another subcommand.
ENTRYPOINT ["stratameter"]
CMD ["run"]
