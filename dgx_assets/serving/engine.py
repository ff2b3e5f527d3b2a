"""Paddle Inference around an exported generator: load once, run (prompt, seed, size) -> PNG bytes.

Imported only inside the serving process. Paddle itself is imported when `load_engine` runs, so the
HTTP server can already answer `/status` with "loading" while a large model comes up.

The server takes any engine (`engine: "module:callable"` in its config, `load_engine` by default): an
object with `tokenize(prompt) -> Tokenized`, `generate(tokenized, seed, width, height, count) -> [PNG
bytes]`, `tokenizer.max_tokens`, `native_size` and `device` (a DeviceChoice). `generate` runs on one of
the server's inference threads and may raise EngineUnavailable for "not now" (a 503 the client retries).
"""

from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from dgx_assets.serving.tokenizer import PAD_ID, Tokenized, Tokenizer

META_FILE = "generator_meta.json"


class EngineUnavailable(RuntimeError):
    """The engine cannot serve this request now (device lost, out of memory); the client should retry."""


@dataclass
class DeviceChoice:
    kind: str  # "gpu" or "cpu", what was actually used
    gpu_id: int | None
    note: str = ""


@dataclass(frozen=True)
class Generated:
    png: bytes
    width: int
    height: int
    tokenized: Tokenized


def find_model(model_dir: str | Path) -> tuple[Path, Path, dict]:
    """The `.json` graph, `.pdiparams` weights and metadata in `model_dir`, or a clear error."""
    directory = Path(model_dir)
    meta_path = directory / META_FILE
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    prefix = meta.get("model_prefix")
    if prefix is None:
        graphs = sorted(directory.glob("*.json"))
        graphs = [g for g in graphs if g.name != META_FILE and g.with_suffix(".pdiparams").exists()]
        if not graphs:
            raise FileNotFoundError(
                f"no Paddle Inference model (<name>.json + <name>.pdiparams) in {directory}; "
                "build one with `dgx-assets build-generator --out DIR`"
            )
        prefix = graphs[0].stem
    graph, params = directory / f"{prefix}.json", directory / f"{prefix}.pdiparams"
    for path in (graph, params):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing; build the model with `dgx-assets build-generator --out DIR`")
    return graph, params, meta


class GeneratorEngine:
    """One Paddle predictor per concurrency slot; a slot runs one request at a time, like one GPU stream."""

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "auto",
        gpu_ids: tuple[int, ...] = (0,),
        ir_optim: bool = True,
        concurrency: int = 1,
        cpu_threads: int = 1,
        gpu_memory_mb: int = 512,
    ):
        import paddle.inference as paddle_infer

        graph, params, self.meta = find_model(model_dir)
        if "vocabulary" not in self.meta:
            raise ValueError(f"{model_dir} has no {META_FILE} with the prompt vocabulary; is this a generator?")
        settings = self.meta["settings"]
        self.tokenizer = Tokenizer(self.meta["vocabulary"], int(settings["max_tokens"]))
        self.z_dim = int(settings["z_dim"])
        self.native_size = int(settings["image_size"])
        self.device = _choose_device(device, gpu_ids)

        config = paddle_infer.Config(str(graph), str(params))
        config.switch_ir_optim(ir_optim)
        if self.device.kind == "gpu":
            assert self.device.gpu_id is not None  # _choose_device names the GPU it picks
            config.enable_use_gpu(gpu_memory_mb, self.device.gpu_id)
        else:
            config.disable_gpu()
            # Paddle 3.3.1's oneDNN conv+activation fusion pass segfaults on this graph with ir_optim on.
            config.disable_onednn()
            config.set_cpu_math_library_num_threads(cpu_threads)
        config.disable_glog_info()
        first = paddle_infer.create_predictor(config)
        self._free = [first] + [first.clone() for _ in range(max(1, concurrency) - 1)]
        self._slots = threading.Condition()

    def tokenize(self, prompt: str) -> Tokenized:
        return self.tokenizer.encode(prompt)

    def generate(
        self, tokenized: Tokenized, seed: int, width: int, height: int, count: int = 1, timeout_s: float | None = None
    ) -> list[bytes]:
        """PNG bytes of `count` images; the same prompt and seed give the same image.

        Raises TimeoutError when no predictor frees up within `timeout_s` (the server never lets more
        requests in than there are predictors, so there it does not wait).
        """
        tokens = np.array([tokenized.ids or [PAD_ID]] * count, dtype=np.int64)
        noise = np.stack([np.random.default_rng(seed + i).standard_normal(self.z_dim) for i in range(count)])
        images = self._run(tokens, noise.astype(np.float32), timeout_s)
        return [_to_png(image[0], width, height) for image in images]

    def _run(self, tokens: np.ndarray, noise: np.ndarray, timeout_s: float | None) -> np.ndarray:
        with self._slots:
            if not self._slots.wait_for(lambda: self._free, timeout=timeout_s):
                raise TimeoutError(f"no free predictor within {timeout_s}s")
            predictor = self._free.pop()
        try:
            names = predictor.get_input_names()
            for name, array in zip(names, (tokens, noise)):
                handle = predictor.get_input_handle(name)
                handle.reshape(list(array.shape))
                handle.copy_from_cpu(array)
            predictor.run()
            return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
        finally:
            with self._slots:
                self._free.append(predictor)
                self._slots.notify()


def load_engine(config) -> GeneratorEngine:
    """The default engine: the exported generator in `config.model_dir` (a ServingConfig)."""
    engine = GeneratorEngine(
        config.model_dir,
        device=config.device,
        gpu_ids=config.gpu_ids,
        ir_optim=config.ir_optim,
        concurrency=config.concurrency,
        cpu_threads=config.cpu_threads,
        gpu_memory_mb=config.gpu_memory_mb,
    )
    if config.limits.max_prompt_tokens:
        engine.tokenizer.max_tokens = min(engine.tokenizer.max_tokens, config.limits.max_prompt_tokens)
    return engine


def _to_png(pixels: np.ndarray, width: int, height: int) -> bytes:
    image = Image.fromarray(np.clip(pixels * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _choose_device(device: str, gpu_ids: tuple[int, ...]) -> DeviceChoice:
    import paddle

    if device == "cpu":
        return DeviceChoice("cpu", None)
    has_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if has_gpu:
        return DeviceChoice("gpu", gpu_ids[0] if gpu_ids else 0)
    if device == "gpu":
        # Asked for a GPU and none is usable: say so loudly rather than silently run on the CPU.
        raise RuntimeError(
            "device 'gpu' requested but this paddle build has no CUDA or no GPU is visible "
            "(install paddlepaddle-gpu and check CUDA_VISIBLE_DEVICES)"
        )
    return DeviceChoice("cpu", None, "no GPU visible to paddle: running on the CPU")
