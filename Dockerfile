# refloop worker/API image: `refloop worker` or `refloop api` against TEMPORAL_ADDRESS.
FROM python:3.11.7-slim
# bubblewrap: the OS sandbox of the model's commands (their limits are set by its shell).
# It needs user namespaces: run the container with a seccomp profile that allows them
# (Docker's default blocks unshare/clone of namespaces), see README "Security model".
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap util-linux \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY refloop ./refloop
COPY workflows ./workflows
COPY activities ./activities
COPY worker ./worker
COPY api ./api
COPY cli ./cli
# EXTRAS=semantic adds search_semantic (no PyTorch); EXTRAS=minilm-torch its PyTorch
# embedder too (with PIP_EXTRA_INDEX_URL set to the PyTorch CPU index for a CPU-only
# torch); EXTRAS=otel the OTLP exporter.
ARG EXTRAS=""
# /journal and the data dir's workspaces: docker-compose's mount points, owned by the
# worker's user (a named volume takes the ownership of the directory it is mounted on).
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}" && useradd --create-home refloop \
    && mkdir -p /journal /home/refloop/data/workspaces \
    && chown -R refloop:refloop /journal /home/refloop/data
USER refloop
ENV REFLOOP_DATA_DIR=/home/refloop/data
EXPOSE 8000
CMD ["refloop", "worker"]
