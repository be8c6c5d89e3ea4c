# The vLLM worker image: vLLM's own CUDA image (the engine, torch and CUDA as vLLM ships them)
# plus tokenyard, whose worker runs vLLM's AsyncLLM in-process. Build from the repository root:
#   docker build -f deploy/docker/worker-vllm.Dockerfile -t tokenyard-worker-vllm:0.1.0 .
# VLLM_VERSION must match the `vllm-cuda` extra of pyproject.toml.
ARG VLLM_VERSION=0.32.0
FROM vllm/vllm-openai:v${VLLM_VERSION}
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY tokenyard ./tokenyard
COPY services ./services
COPY shared ./shared
COPY loadgen ./loadgen
COPY simulator ./simulator
COPY tuning ./tuning
# vLLM is in the image already: install tokenyard and its own dependencies, not the extra.
RUN pip install --no-cache-dir ".[hf]" "pyzmq>=25" && python3 -c "import vllm, tokenyard.services.worker.vllm.engine"
ENTRYPOINT ["tokenyard"]
CMD ["worker", "--engine", "vllm"]
