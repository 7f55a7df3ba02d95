#!/usr/bin/env bash
# Builds llama.cpp's own server (`llama-server`) from the llama.cpp that the pinned
# llama-cpp-python vendors (its sdist holds vendor/llama.cpp, tools/server included), with
# the same CPU flags as scripts/install.sh gives the wheel: the fair outside anchor for
# `python -m bench peer`, same kernels. Built once per (version, flags) into
# ~/.cache/gpuq-llama-server/<key>/ and reused; prints the binary's path.
# Takes 10-15 minutes on two cores the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
FLAGS=${CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"}
key=$(printf '%s %s' "$VERSION" "$FLAGS" | sha256sum | cut -c1-16)
home="${GPUQ_LLAMA_SERVER_CACHE:-$HOME/.cache/gpuq-llama-server}/$key"
if [ -x "$home/llama-server" ]; then
  echo "$home/llama-server"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
PYTHON=${PYTHON:-python3}
echo "building llama-server from llama-cpp-python $VERSION's vendored llama.cpp ($FLAGS); once" >&2
"$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work" >&2
tar xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
# shellcheck disable=SC2086
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF $FLAGS >&2
cmake --build "$work/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" >&2
mkdir -p "$home"
cp "$work/build/bin/llama-server" "$home/llama-server"
echo "$home/llama-server"
