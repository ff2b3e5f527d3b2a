# syntax=docker/dockerfile:1
# The dgx_assets code location image (dgx-assets/code-location:<version>): the Dagster gRPC code server,
# every run pod (K8sRunLauncher) and step pod (k8s_job_executor), and in the `k8s` profile the Spark
# driver and executors too (DGX_SPARK_IMAGE). CUDA base: TensorFlow in GPU steps and in Spark executors
# finds the GPU the pod was given. Build from the repository root:
#   docker build -f deploy/docker/code-location.Dockerfile -t dgx-assets/code-location:0.1.0 .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ARG HADOOP_IMAGE=apache/hadoop:3.4.1

# Hadoop's client (libhdfs and its jars) for pyarrow's hdfs:// filesystem (DGX_LAKE_ROOT=hdfs://...).
FROM ${HADOOP_IMAGE} AS hadoop

FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Java for the Spark driver and libhdfs; tini reaps Spark's and Dagster's child processes.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv default-jre-headless tini procps \
    && rm -rf /var/lib/apt/lists/*
COPY --from=hadoop /opt/hadoop /opt/hadoop
ENV JAVA_HOME=/usr/lib/jvm/default-java \
    HADOOP_HOME=/opt/hadoop \
    ARROW_LIBHDFS_DIR=/opt/hadoop/lib/native

WORKDIR /opt/dgx_assets
RUN python3 -m venv .venv
ENV VIRTUAL_ENV=/opt/dgx_assets/.venv \
    PATH=/opt/dgx_assets/.venv/bin:/opt/hadoop/bin:$PATH
# Dependencies first: the `core` extra from pyproject.toml at the versions constraints.txt pins (this layer
# stays cached while only code changes), with TensorFlow's CUDA libraries; then the package itself.
# No Paddle or serving stack: the serving process has its own image.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['core']))" \
        > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt "tensorflow[and-cuda]==2.21.0"
COPY dgx_assets ./dgx_assets
RUN pip install -c constraints.txt --no-deps .
# Spark's conf dir: spark-defaults.conf for the driver, the GPU discovery script for executors.
COPY deploy/spark ./deploy/spark

ENV SPARK_CONF_DIR=/opt/dgx_assets/deploy/spark \
    PYSPARK_PYTHON=/opt/dgx_assets/.venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/dgx_assets/.venv/bin/python \
    DAGSTER_HOME=/opt/dagster/dagster_home \
    DAGSTER_DISABLE_TELEMETRY=true \
    MLFLOW_DISABLE_TELEMETRY=true \
    GX_ANALYTICS_ENABLED=false

# Never root: the same uid the manifests and the Helm values run as.
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin dgx \
    && mkdir -p /opt/dagster/dagster_home \
    && chown -R 10001:10001 /opt/dagster
USER 10001

EXPOSE 3030
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["dagster", "api", "grpc", "--module-name", "dgx_assets.definitions", "--host", "0.0.0.0", "--port", "3030"]
