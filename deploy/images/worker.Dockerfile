# syntax=docker/dockerfile:1.7
# A vLLM worker on GPUs: the official vLLM image with Goodput installed beside it, so that
#   * `goodput worker --engine vllm --device cuda ...` supervises the vLLM server
#     (NixlConnector, kv_role kv_both; serving/workers/config.py), and
#   * vLLM loads our stat-logger plugin through its entry point
#     (`vllm.stat_logger_plugins`: goodput); it ships engine records once
#     GOODPUT_CONTROL_PLANE_URL is set in the server's environment.
#
#   docker build -f deploy/images/worker.Dockerfile -t goodput-worker:0.1.0 .
#
# The plugin is written against vLLM 0.32.0 (serving/vllm_plugin/stat_logger.py): keep
# VLLM_IMAGE on that release unless the plugin's tests pass on another one.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0

FROM ${VLLM_IMAGE}
LABEL org.opencontainers.image.title="goodput-worker" \
      org.opencontainers.image.description="vLLM with the Goodput worker supervisor and stat-logger plugin" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/goodput/goodput"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/goodput-src
COPY pyproject.toml README.md ./
COPY goodput ./goodput
COPY controlplane ./controlplane
COPY exporters ./exporters
COPY serving ./serving
COPY migrations ./migrations
COPY dashboards ./dashboards
# Everything the vLLM image ships stays at its version (the constraints): a dependency of
# ours that would move vLLM's torch, fastapi or numpy fails the build instead of breaking
# the engine. Then check that vLLM will find the plugin.
RUN python3 -m pip list --format=freeze > /tmp/vllm-constraints.txt \
    && python3 -m pip install --constraint /tmp/vllm-constraints.txt . \
    && python3 -c "from importlib.metadata import entry_points; \
names = {e.name for e in entry_points(group='vllm.stat_logger_plugins')}; \
assert 'goodput' in names, names" \
    && goodput worker --help >/dev/null \
    && rm -rf /opt/goodput-src /tmp/vllm-constraints.txt
WORKDIR /var/lib/goodput
# 8000: the vLLM OpenAI server (goodput worker --port); 5600: NIXL's side channel.
EXPOSE 8000 5600
ENTRYPOINT ["goodput"]
CMD ["worker", "--help"]
