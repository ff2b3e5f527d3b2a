# syntax=docker/dockerfile:1
# The ERNIE serving image (dgx-assets/serving:<version>): `dgx-assets serve` (the ASGI app on uvicorn), the
# one process that imports paddle (never beside TensorFlow or Spark workers). TLS files, when used, come
# from the ernie-serving-tls secret, not the image. Runs from deploy/k8s/ernie-serving.yaml with the
# config from deploy/serving/ and the model folder from the ernie-models volume. Build from the root:
#   docker build -f deploy/docker/serving.Dockerfile -t dgx-assets/serving:0.1.0 .
# Paddle's GPU wheels may live on Paddle's own package index: pass it with
#   --build-arg PIP_EXTRA_INDEX_URL=<that index>
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}
ARG PIP_EXTRA_INDEX_URL=""
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv tini \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/dgx_assets
RUN python3 -m venv .venv
ENV VIRTUAL_ENV=/opt/dgx_assets/.venv \
    PATH=/opt/dgx_assets/.venv/bin:$PATH
# Dependencies first: the `serving` extra from pyproject.toml at the versions constraints.txt pins (cached
# while only code changes); no TensorFlow, Spark or Dagster. The CPU paddlepaddle the extra lists and
# paddlepaddle-gpu provide the same module: install the GPU one instead.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(d for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['serving'] if not d.startswith('paddlepaddle')))" \
        > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt \
    && PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL}" pip install -c constraints.txt "paddlepaddle-gpu==3.3.1"
COPY dgx_assets ./dgx_assets
RUN pip install -c constraints.txt --no-deps .

RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin dgx
USER 10001

EXPOSE 9998
ENTRYPOINT ["/usr/bin/tini", "--", "dgx-assets", "serve"]
# Overridden by the Deployment's args; these are the local defaults.
CMD ["--model-dir", "/models/ernie", "--host", "0.0.0.0", "--port", "9998"]
