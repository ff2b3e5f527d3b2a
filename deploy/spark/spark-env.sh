# Spark Standalone on a DGX node. Spark's launch scripts (spark-class, start-master.sh, start-worker.sh)
# source this file from $SPARK_CONF_DIR: point SPARK_CONF_DIR at this folder (or copy it there).
# Every setting keeps a value already in the environment, so one file serves every node.
# Not `set -e`: this file is sourced by Spark's own scripts.

DGX_SPARK_CONF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Which GPUs Spark may use on this node, e.g. "4,5" when GPUs 0-3 belong to serving; empty = all.
# gpu-discovery.sh reports only these, and the worker offers exactly that many to executors.
DGX_ALLOWED_GPUS=${DGX_ALLOWED_GPUS:-}

dgx_count_gpus() {
    local list
    if [[ -n $DGX_ALLOWED_GPUS ]]; then
        list=$DGX_ALLOWED_GPUS
    elif [[ -n ${DGX_GPU_DISCOVERY_OVERRIDE:-} ]]; then
        list=$DGX_GPU_DISCOVERY_OVERRIDE
    elif command -v nvidia-smi >/dev/null 2>&1; then
        list=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\n' ',')
    fi
    local items=(${list//,/ })
    echo "${#items[@]}"
}

SPARK_WORKER_GPU_AMOUNT=${SPARK_WORKER_GPU_AMOUNT:-$(dgx_count_gpus)}
if [[ $SPARK_WORKER_GPU_AMOUNT -gt 0 ]]; then
    # The discovery script must print JSON ({"name": "gpu", "addresses": [...]}); the one-line
    # "gpu.0:4" form kills the worker at start.
    SPARK_WORKER_OPTS="${SPARK_WORKER_OPTS:-} -Dspark.worker.resource.gpu.amount=$SPARK_WORKER_GPU_AMOUNT"
    SPARK_WORKER_OPTS+=" -Dspark.worker.resource.gpu.discoveryScript=$DGX_SPARK_CONF_DIR/gpu-discovery.sh"
fi
# Finished applications' work dirs (jars, stderr) otherwise fill the disk over weeks.
SPARK_WORKER_OPTS="${SPARK_WORKER_OPTS:-} -Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.appDataTtl=604800"

# Shuffle and executor work dirs on the DGX's local NVMe RAID, not the root disk.
SPARK_LOCAL_DIRS=${SPARK_LOCAL_DIRS:-/raid/spark/local}
SPARK_WORKER_DIR=${SPARK_WORKER_DIR:-/raid/spark/work}

# Cores and memory the worker offers: leave some for the OS, the HDFS DataNode and the serving
# processes. Unset = Spark's defaults (all cores; all memory minus 1 GiB). Never set them empty:
# Spark reads an empty SPARK_WORKER_CORES as a number and the worker dies. For example:
#   SPARK_WORKER_CORES=96 SPARK_WORKER_MEMORY=1500g

# Executors run the project's Python (with tensorflow) from the same path on every node.
PYSPARK_PYTHON=${PYSPARK_PYTHON:-/opt/dgx_assets/.venv/bin/python}

# Spark binds to the first non-loopback address; on DGX nodes with InfiniBand and a management network,
# export SPARK_LOCAL_IP=<the address other nodes reach this one on>. Never set it empty: Spark resolves
# "" to the loopback address and the node becomes unreachable.
