"""What a model was trained on: CPU, memory, container quota and, where there are GPUs, nvidia-smi's view."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from dgx_assets.tracking.lineage import TAG_LIMIT


def hardware_baseline(timeout_s: float = 30.0) -> dict[str, Any]:
    """What trained the model: GPUs and nvidia-smi clocks/power/temperature where there are GPUs, CPU always."""
    baseline: dict[str, Any] = {
        "captured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_quota": _cgroup_cpu_quota(),
        "memory_bytes": _memory_bytes(),
        "gpus": [],
        "kind": "cpu",
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=timeout_s, check=True)
            query = subprocess.run(
                [smi, "-q", "-d", "POWER,CLOCK,TEMPERATURE"],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=True,
            )
            baseline["gpus"] = [line.strip() for line in listing.stdout.splitlines() if line.strip()]
            baseline["nvidia_smi_query"] = query.stdout
            baseline["kind"] = "gpu" if baseline["gpus"] else "cpu"
        except (OSError, subprocess.SubprocessError) as exc:
            baseline["nvidia_smi_error"] = f"{type(exc).__name__}: {exc}"
    return baseline


def hardware_tags(baseline: dict[str, Any]) -> dict[str, str]:
    """The baseline's headline as MLflow run tags (searchable in the UI)."""
    tags = {
        "hardware.kind": baseline["kind"],
        "hardware.cpu_model": str(baseline["cpu_model"]),
        "hardware.cpu_cores": str(baseline["cpu_cores"]),
        "hardware.memory_gib": f"{(baseline['memory_bytes'] or 0) / 2**30:.1f}",
        "hardware.gpu_count": str(len(baseline["gpus"])),
    }
    if baseline["gpus"]:
        tags["hardware.gpus"] = "; ".join(baseline["gpus"])[:TAG_LIMIT]
    return tags


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_cpu_quota() -> float | None:
    """CPUs a container may use (Kubernetes limits), which os.cpu_count() does not show."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return None if quota == "max" else round(int(quota) / int(period), 2)
    except (OSError, ValueError):
        return None
