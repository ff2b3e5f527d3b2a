# syntax=docker/dockerfile:1
# The edge runtime image (dgx-assets/edge-runtime:<version>) for KubeEdge edge nodes: `dgx-assets edge-run`
# (LiteRT, numpy, Pillow, and starlette on uvicorn as the serving process uses them) and `dgx-assets
# edge-fetch` (MLflow's client, mlflow-skinny) and nothing else of the platform: no TensorFlow, Spark or
# Paddle, so it stays small enough for an inspection station.
# Multi-arch (ai-edge-litert ships x86_64 and aarch64 wheels). Build from the repository root:
#   docker buildx build --platform linux/amd64,linux/arm64 -f deploy/docker/edge-runtime.Dockerfile \
#     -t dgx-assets/edge-runtime:0.1.0 .
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/dgx_assets
# The `edge` extra from pyproject.toml at the versions constraints.txt pins, and mlflow-skinny for
# `edge-fetch` (the pods' init container); then the package itself.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['edge']))" \
        > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt mlflow-skinny
COPY dgx_assets ./dgx_assets
RUN pip install -c constraints.txt --no-deps . && useradd --uid 10001 --no-create-home edge
USER 10001
ENTRYPOINT ["dgx-assets"]
CMD ["edge-run", "--help"]
