# The operator image: `rtj-operator` (kopf) and only the operator's runtime dependencies.
#
#   docker build -t rtj-operator:0.1.0 .
#
# Stage 1 builds the project's wheel; stage 2 installs that wheel without extras, so torch, NVRx
# and the local-cluster tools (the [trainer] and [local] extras) never enter the image. The
# trainer has its own image: trainer_image/Dockerfile.

FROM python:3.12.8-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# setuptools discovers packages in all five source folders (pyproject.toml), so all are copied;
# the runtime stage installs none of their optional dependencies.
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY trainer_image/rtj_trainer ./trainer_image/rtj_trainer
COPY localcluster ./localcluster
COPY demo ./demo
COPY contract ./contract
RUN pip wheel --no-deps --wheel-dir /wheels .


FROM python:3.12.8-slim-bookworm

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="rtj-operator" \
      org.opencontainers.image.description="Kubernetes operator that keeps distributed PyTorch training jobs making progress through faults" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/resilient-training/resilient-training-operator" \
      org.opencontainers.image.base.name="docker.io/library/python:3.12.8-slim-bookworm"

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp

COPY --from=build /wheels /wheels
# The wheel's dependencies are pinned exactly in pyproject.toml ([project] dependencies); the
# --help call imports the operator, so a missing dependency fails the build, not the pod.
RUN pip install /wheels/*.whl \
    && rm -rf /wheels \
    && rtj-operator --help > /dev/null

# A numeric user (no /etc/passwd entry needed) lets Kubernetes verify runAsNonRoot; the chart runs
# the container with the same ids and a read-only root filesystem.
USER 65532:65532

# 8080: kopf's liveness endpoint (/healthz); 9090: Prometheus metrics.
EXPOSE 8080 9090

# No HEALTHCHECK: Kubernetes ignores it; the chart's livenessProbe calls kopf's endpoint instead.
ENTRYPOINT ["rtj-operator"]
CMD ["--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz", "--metrics-port=9090"]
