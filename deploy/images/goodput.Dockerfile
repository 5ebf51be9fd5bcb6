# syntax=docker/dockerfile:1.7
# The control plane and the gateway: one image, two entry points.
#
#   docker build -f deploy/images/goodput.Dockerfile -t goodput:0.1.0 .
#   docker run goodput:0.1.0 controlplane serve --host 0.0.0.0 --no-migrate
#   docker run goodput:0.1.0 gateway --host 0.0.0.0 --control-plane http://cp:8000
#
# Build from the repository root (the context). No vLLM here: the workers' image is
# worker.Dockerfile. `goodput worker --engine sim` (the timing-model engine) runs in this image.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/goodput
WORKDIR /src
# Dependencies first, in their own layer: a change to the code does not reinstall them.
COPY pyproject.toml README.md ./
RUN python - <<'PY' > /tmp/requirements.txt
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))
PY
RUN /opt/goodput/bin/pip install -r /tmp/requirements.txt
COPY goodput ./goodput
COPY controlplane ./controlplane
COPY exporters ./exporters
COPY serving ./serving
COPY migrations ./migrations
COPY dashboards ./dashboards
RUN /opt/goodput/bin/pip install --no-deps . \
    && /opt/goodput/bin/goodput --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="goodput" \
      org.opencontainers.image.description="Goodput control plane and PD gateway" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/goodput/goodput"
RUN useradd --uid 10001 --user-group --home-dir /var/lib/goodput --create-home goodput
COPY --from=build /opt/goodput /opt/goodput
# No MALLOC_MMAP_THRESHOLD_ here: `controlplane serve` fixes glibc's mmap threshold itself
# (32 MiB, trim threshold twice it) and calls malloc_trim every 5 s, which bounds its RSS
# in the 10-min soak and keeps an ingest batch's arrays on the heap (at 128 KiB each is a
# fresh mmap: about 1.6 x the CPU per batch; docs/ingest.md). An operator's
# MALLOC_MMAP_THRESHOLD_ is still kept; GOODPUT_MALLOC_MMAP_THRESHOLD and
# GOODPUT_MALLOC_TRIM_INTERVAL_S tune the start-up setting. The other commands (the gateway,
# the workers) run with glibc's default, as everywhere they are tested and measured.
ENV PATH=/opt/goodput/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /var/lib/goodput
# 8000: control plane (GOODPUT_PORT); 8080: gateway (--port).
EXPOSE 8000 8080
ENTRYPOINT ["goodput"]
CMD ["controlplane", "serve", "--host", "0.0.0.0"]
