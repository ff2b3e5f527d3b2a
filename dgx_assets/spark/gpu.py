"""Executor-side GPU binding for Python workers that run TensorFlow.

Spark hands each task the GPU addresses it scheduled for it (``TaskContext.resources()["gpu"]``).
CUDA only honours ``CUDA_VISIBLE_DEVICES`` when it initialises, i.e. on TensorFlow's first import in the
process, so the worker must set it *before* that import, and must never silently keep computing on an
old GPU when Spark reuses the worker for a task that was given a different one (this happens whenever
an executor holds several GPUs and ``spark.python.worker.reuse`` is on, which is Spark's default).

Usage inside a ``mapInPandas`` / ``predict_batch_udf`` function::

    binding = bind_task_gpus()  # before anything imports tensorflow
    tf = binding.tensorflow()  # imports and configures TensorFlow once per worker

No TensorFlow import happens at module level here, on purpose.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

GPU_RESOURCE = "gpu"
# Hides every GPU from CUDA: what a task that Spark gave no GPU must see, so that several CPU tasks on
# a DGX node do not each open a CUDA context on GPU 0.
NO_GPU = "-1"


class GpuBindingError(RuntimeError):
    """The worker cannot honour the GPU Spark assigned to the current task."""


@dataclasses.dataclass(frozen=True)
class GpuBinding:
    """What one Python worker process is bound to."""

    # GPU addresses Spark gave the task (empty: CPU). None: not in a Spark task, so the process keeps
    # whatever CUDA_VISIBLE_DEVICES its launcher chose.
    addresses: tuple[str, ...] | None
    cpu_threads: int  # TensorFlow intra-op threads for this worker
    pid: int

    @property
    def from_spark_task(self) -> bool:
        return self.addresses is not None

    @property
    def uses_gpu(self) -> bool:
        return bool(self.addresses)

    @property
    def device_label(self) -> str:
        """A short label for lineage columns: ``gpu:4`` / ``gpu:4,5`` / ``cpu`` / ``process``."""
        if self.addresses is None:
            return "process"
        return "gpu:" + ",".join(self.addresses) if self.addresses else "cpu"

    def tensorflow(self) -> Any:
        """Import TensorFlow for this binding (configured once per worker) and return the module."""
        return _WORKER.tensorflow()


def task_gpu_addresses(task_context: Any = None) -> tuple[str, ...]:
    """GPU addresses Spark assigned to the running task; empty outside a task or without GPUs."""
    if task_context is None:
        from pyspark import TaskContext

        task_context = TaskContext.get()
    if task_context is None:
        return ()
    resource = task_context.resources().get(GPU_RESOURCE)
    return tuple(resource.addresses) if resource is not None else ()


def task_cpu_count(task_context: Any = None) -> int:
    """Cores Spark gave the running task (``spark.task.cpus``); the machine's cores outside Spark."""
    if task_context is None:
        from pyspark import TaskContext

        task_context = TaskContext.get()
    if task_context is None:
        return os.cpu_count() or 1
    return max(1, int(task_context.cpus()))


class WorkerGpuBinder:
    """Per-process binding state. One instance per worker (module level below); tests make their own.

    ``tensorflow_loaded`` says whether CUDA may already be initialised in this process: once it is, the
    binding is frozen and a task with other addresses is refused with :class:`GpuBindingError`.
    """

    def __init__(
        self,
        environ: MutableMapping[str, str] | None = None,
        tensorflow_loaded: Callable[[], bool] | None = None,
        tensorflow_gpus: Callable[[], int] | None = None,
    ) -> None:
        self._environ = os.environ if environ is None else environ
        self._tensorflow_loaded = tensorflow_loaded or (lambda: "tensorflow" in sys.modules)
        self._tensorflow_gpus = tensorflow_gpus or _loaded_tensorflow_gpus
        self._binding: GpuBinding | None = None
        self._tf_configured = False
        self._lock = threading.Lock()

    @property
    def binding(self) -> GpuBinding | None:
        return self._binding

    def bind(self, addresses: Sequence[str], cpu_threads: int) -> GpuBinding:
        """Bind this process to ``addresses`` (empty: CPU with ``cpu_threads`` threads)."""
        wanted = tuple(str(a) for a in addresses)
        with self._lock:
            current = self._binding
            if current is not None and current.addresses == wanted:
                return current
            if self._tensorflow_loaded():
                visible = self._environ.get("CUDA_VISIBLE_DEVICES")
                if current is None and visible == _visible_devices(wanted):
                    # TensorFlow came first but already sees exactly this task's GPUs: adopt that.
                    self._binding = GpuBinding(wanted, cpu_threads, os.getpid())
                    return self._binding
                if current is None and not wanted and self._tensorflow_gpus() == 0:
                    # Another function of the session (a user's UDF) imported TensorFlow first on a worker
                    # with no GPU at all: a CPU task runs exactly where it was meant to.
                    self._binding = GpuBinding(wanted, cpu_threads, os.getpid())
                    return self._binding
                bound_to = current.device_label if current else f"CUDA_VISIBLE_DEVICES={visible!r}"
                raise GpuBindingError(
                    f"Spark assigned GPU address(es) {list(wanted) or 'none'} to this task, but Python "
                    f"worker pid {os.getpid()} already initialised TensorFlow on {bound_to}; "
                    "CUDA_VISIBLE_DEVICES cannot change after that, so the task would run on the wrong "
                    "device. Give each executor one GPU (spark.executor.resource.gpu.amount=1, sharing "
                    "it with spark.task.resource.gpu.amount<1) or set spark.python.worker.reuse=false."
                )
            self._environ["CUDA_VISIBLE_DEVICES"] = _visible_devices(wanted)
            # Read by TensorFlow (and oneDNN/OpenMP) at initialisation: match the task's cores so that
            # concurrent workers on one executor do not oversubscribe the CPUs.
            threads = str(max(1, cpu_threads))
            self._environ["TF_NUM_INTRAOP_THREADS"] = threads
            self._environ["TF_NUM_INTEROP_THREADS"] = "2" if cpu_threads > 1 else "1"
            self._environ["OMP_NUM_THREADS"] = threads
            self._binding = GpuBinding(wanted, max(1, cpu_threads), os.getpid())
            return self._binding

    def bind_process(self, cpu_threads: int) -> GpuBinding:
        """Outside a Spark task: leave the process's devices alone, only record the thread count."""
        with self._lock:
            if self._binding is None:
                self._binding = GpuBinding(None, max(1, cpu_threads), os.getpid())
            return self._binding

    def tensorflow(self) -> Any:
        """Import TensorFlow and configure it for the binding, once per process."""
        if self._binding is None:
            raise GpuBindingError("bind the worker (bind_task_gpus) before importing TensorFlow")
        import tensorflow as tf

        with self._lock:
            if not self._tf_configured:
                _configure_tensorflow(tf, self._binding)
                self._tf_configured = True
        return tf


def _loaded_tensorflow_gpus() -> int:
    """GPUs the already imported TensorFlow of this process sees."""
    return len(sys.modules["tensorflow"].config.list_physical_devices("GPU"))


def _visible_devices(addresses: tuple[str, ...]) -> str:
    return ",".join(addresses) if addresses else NO_GPU


def _configure_tensorflow(tf: Any, binding: GpuBinding) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    if binding.from_spark_task:
        for gpu in gpus:
            # Without memory growth the first worker grabs the whole GPU and every other task on it fails.
            tf.config.experimental.set_memory_growth(gpu, True)
        if binding.uses_gpu and not gpus:
            # Correct results, wrong speed: say so in the executor log (describe_device marks the rows).
            print(
                f"dgx_assets: Spark assigned GPU {list(binding.addresses or ())} but TensorFlow sees no GPU "
                "(no CUDA build or driver in the executor image?); computing on CPU",
                file=sys.stderr,
            )
    try:
        tf.config.threading.set_intra_op_parallelism_threads(binding.cpu_threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(2, binding.cpu_threads))
    except RuntimeError:
        pass  # the runtime is already up; the TF_NUM_* variables set before import applied instead


def describe_device(binding: GpuBinding, tf: Any) -> str:
    """Where this worker actually computes, for lineage: ``gpu:4``, ``cpu``, or ``cpu (gpu:4 not visible)``."""
    visible = bool(tf.config.list_physical_devices("GPU"))
    if not binding.from_spark_task:
        return "gpu" if visible else "cpu"
    if binding.uses_gpu and not visible:
        return f"cpu ({binding.device_label} assigned, not visible to TensorFlow)"
    return binding.device_label


_WORKER = WorkerGpuBinder()


def bind_task_gpus(task_context: Any = None, cpu_threads: int | None = None) -> GpuBinding:
    """Bind this Python worker to the GPUs Spark assigned to the running task.

    Call it at the start of every executor-side function, before TensorFlow is imported. Outside a Spark
    task (the driver, plain-Python use) it changes nothing: the process keeps the devices it was started
    with.
    """
    if task_context is None:
        from pyspark import TaskContext

        task_context = TaskContext.get()
    threads = cpu_threads if cpu_threads is not None else task_cpu_count(task_context)
    if task_context is None:
        return _WORKER.bind_process(threads)
    return _WORKER.bind(task_gpu_addresses(task_context), threads)
