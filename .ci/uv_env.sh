# Sourced by .ci/run and .ci/sglang_venv.sh: install with uv from the sources pip is configured with.
#   new_venv DIR              a fresh venv with pip in it (tests build wheels with `python -m pip wheel`)
#   uvpip PYTHON ARGS...      `pip install ARGS` into PYTHON's environment
#   check_cpu_torch PYTHON    fail unless PYTHON's torch is the CPU build
#   compile_env PYTHON [DIR...]  byte-compile PYTHON's site-packages (and DIRs, e.g. an editable checkout)
# uv itself lives in a venv of its own ($WB_UV_VENV; .ci/run makes one per run), never in the
# interpreter that runs this: nothing here installs into the system python ($WB_BASE_PYTHON, default
# the `python` on PATH, only creates venvs and reads pip's configuration).
# Sources: this machine's pip reads find-links (the CPU torch wheel on disk), extra local indexes and a
# constraints file from its config; uv reads none of that, so they are handed over here, and uv picks the
# best match across all of them as pip does (uv's default takes the first index that has a name).
WB_BASE_PYTHON="${WB_BASE_PYTHON:-$(command -v python)}"
WB_UV_VENV="${WB_UV_VENV:?set WB_UV_VENV: the directory of the venv that holds uv}"
if [ ! -x "$WB_UV_VENV/bin/uv" ]; then
    "$WB_BASE_PYTHON" -m venv "$WB_UV_VENV"
    "$WB_UV_VENV/bin/python" -m pip install --quiet uv==0.13.8
fi
uv() { "$WB_UV_VENV/bin/uv" "$@"; }
_pipcfg() { "$WB_BASE_PYTHON" -m pip config get "$1" 2>/dev/null || true; }
_v="${PIP_FIND_LINKS:-$(_pipcfg global.find-links)}"; [ -n "$_v" ] && export UV_FIND_LINKS="${_v// /,}"
_v="${PIP_EXTRA_INDEX_URL:-$(_pipcfg global.extra-index-url)}"; [ -n "$_v" ] && export UV_EXTRA_INDEX_URL="$_v"
_v="${PIP_CONSTRAINT:-$(_pipcfg global.constraint)}"; [ -n "$_v" ] && export UV_CONSTRAINT="$_v"
unset _v
export UV_INDEX_STRATEGY=unsafe-best-match UV_LINK_MODE=copy UV_HTTP_TIMEOUT=180
new_venv() { uv venv --quiet --seed --python "$WB_BASE_PYTHON" "$1"; }
uvpip() { local py="$1"; shift; uv pip install --quiet --python "$py" "$@"; }
check_cpu_torch() {
    "$1" -c 'import torch, sys; v = torch.__version__; sys.exit(0 if v.endswith("+cpu") else f"not the CPU torch: {v}")'
}
# These machines set PYTHONDONTWRITEBYTECODE=1 and uv does not byte-compile what it installs, so every
# process compiled every module it imported from source, every time: importing SGLang's scheduler took
# 24 s instead of 11 s, torch 4.2 s instead of 2.5 s (measured 2026-12-03), in each of the hundreds of
# processes the tests start. Compiled once per environment here (files already compiled are skipped).
# compileall's exit status is ignored: some packages ship files that are not valid Python 3 (templates),
# and a file left uncompiled only costs time.
compile_env() {
    local py="$1"; shift
    "$py" -m compileall -q -j 0 "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" "$@" \
        > /dev/null 2>&1 || true
}
