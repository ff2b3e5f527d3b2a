#!/usr/bin/env bash
# Spark GPU discovery script: prints the GPUs this worker (or executor) may use, as the JSON Spark
# expects on stdout:  {"name": "gpu", "addresses": ["4", "5"]}
#
# Spark runs it through spark.worker.resource.gpu.discoveryScript (Standalone) or
# spark.executor.resource.gpu.discoveryScript (Kubernetes). Anything but that one JSON object on stdout
# kills the worker at start ("Error parsing JSON into ResourceInformation"), so diagnostics go to stderr.
#
# Environment:
#   DGX_ALLOWED_GPUS            comma-separated GPU indices the operator gives Spark (for example "4,5");
#                               unset or empty: every GPU present.
#   DGX_GPU_DISCOVERY_OVERRIDE  comma-separated indices to report as present instead of asking nvidia-smi,
#                               for machines without one (CI, laptops); DGX_ALLOWED_GPUS still filters them.
set -euo pipefail

fail() {
    echo "gpu-discovery: $*" >&2
    exit 1
}

# "4, 5" -> "4 5", refusing anything that is not a GPU index (a typo must not become an address).
parse_indices() {
    local source_name=$1 list=$2 item
    for item in ${list//,/ }; do
        [[ $item =~ ^[0-9]+$ ]] || fail "$source_name has '$item', which is not a GPU index (expected e.g. 4,5)"
        echo "$item"
    done
}

if [[ -n ${DGX_GPU_DISCOVERY_OVERRIDE:-} ]]; then
    present=$(parse_indices DGX_GPU_DISCOVERY_OVERRIDE "$DGX_GPU_DISCOVERY_OVERRIDE" | awk '!seen[$0]++')
elif command -v nvidia-smi >/dev/null 2>&1; then
    smi_out=$(nvidia-smi --query-gpu=index --format=csv,noheader) || fail "nvidia-smi failed; is the NVIDIA driver loaded?"
    present=$(parse_indices nvidia-smi "$(echo "$smi_out" | tr -d ' ' | tr '\n' ',')")
else
    fail "nvidia-smi not found and DGX_GPU_DISCOVERY_OVERRIDE not set: cannot tell which GPUs exist"
fi

if [[ -n ${DGX_ALLOWED_GPUS:-} ]]; then
    allowed=$(parse_indices DGX_ALLOWED_GPUS "$DGX_ALLOWED_GPUS")
    chosen=""
    for gpu in $allowed; do
        if [[ " $chosen" == *" $gpu "* ]]; then
            continue  # listed twice: Spark rejects duplicate addresses
        elif grep -qx "$gpu" <<<"$present"; then
            chosen+="$gpu "
        else
            echo "gpu-discovery: allowed GPU $gpu is not present on $(hostname); skipping it" >&2
        fi
    done
else
    chosen=$present
fi

[[ -n ${chosen// /} ]] || fail "no usable GPU on $(hostname) (present: ${present//$'\n'/,}; allowed: ${DGX_ALLOWED_GPUS:-all})"

addresses=""
for gpu in $chosen; do
    addresses+="${addresses:+, }\"$gpu\""
done
echo "{\"name\": \"gpu\", \"addresses\": [$addresses]}"
