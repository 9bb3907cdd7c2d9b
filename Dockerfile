# Operator image: the specpilot package (kopf operator + CLI) on a pinned slim Python, with the runtime
# dependencies only (no extras: no simulator plots or test tools; the sandbox and the demo are their own
# distribution in sandbox/, which is not copied).
# Build from the repository root: docker build -t ghcr.io/specpilot/specpilot:0.1.0 .
FROM python:3.11.11-slim-bookworm

# The chart mounts the root filesystem read-only with an emptyDir at /tmp, so HOME (caches) points there.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp

WORKDIR /build
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY benchmark-job/ benchmark-job/
RUN pip install --no-cache-dir . \
    && rm -rf /build \
    && groupadd --gid 65532 specpilot \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin specpilot

WORKDIR /
USER 65532:65532
# 8080: kopf liveness endpoint (/healthz); 9090: Prometheus metrics (/metrics).
EXPOSE 8080 9090
ENTRYPOINT ["specpilot"]
CMD ["run"]
