#!/usr/bin/env bash
# Everything `make test` needs on a fresh Debian 12 machine: compilers and the fuzzer
# runtime from apt (only what is missing), NVIDIA's nvidia-smi binary (ci/nvidia-smi.sh),
# then the project's venv with pinned packages.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v gcc >/dev/null || need+=(gcc)
command -v strace >/dev/null || need+=(strace) # tests/fakenvml/test_call_path.py
command -v clang-14 >/dev/null || need+=(clang-14)
# libFuzzer's runtime ships in libclang-rt-14-dev on Debian 12.
dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
if ((${#need[@]})); then
  echo "==> apt: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

ci/nvidia-smi.sh

if [[ ! -x .venv/bin/python ]]; then
  echo "==> python: creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml "$0" | sha256sum | cut -c1-16)
if [[ ! -e $stamp ]]; then
  echo "==> python: installing gpulab and pinned dependencies"
  # compat: a plain path in a .pth; the default editable finder costs every `fakenvml`
  # command ~10 ms of start-up (docs/benchmarks.md, "Injection that starts fast").
  # lab: what a lab runner needs beyond a node (pyproject.toml: the extras); docs: mkdocs.
  # uv: 36 s a fresh clone where pip took ~110 s on 2 cores (its wheels are cached in
  # ~/.cache/uv), with the same byte-compiling pip did (this machine sets
  # PYTHONDONTWRITEBYTECODE, so nothing else would write the .pyc files).
  extras=lab,dev,build,docs
  .venv/bin/pip install -q --disable-pip-version-check uv==0.13.9
  .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -e ".[$extras]" \
    --config-setting editable_mode=compat
  touch "$stamp"
fi
# Bytecode for the project's own modules: machines that set PYTHONDONTWRITEBYTECODE never
# cache it, and compiling them anew doubled every CLI start. Stale files are only ignored.
.venv/bin/python -m compileall -q -j 0 fakenvml plugin clusters e2e standin gpulab >/dev/null
