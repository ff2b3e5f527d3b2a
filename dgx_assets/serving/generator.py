"""The small text-conditioned image generator that stands in for ERNIE-Image offline (Paddle).

A conditional variational autoencoder: a bag-of-words text encoder turns the prompt into a condition
vector, the decoder turns (noise drawn from the seed, condition) into a grey image. Trained on the demo
images with captions written from their labels, it produces images that look like the training domain,
change with the prompt's words and differ from seed to seed. Only the decoder path (tokens, noise -> image)
is exported with `paddle.jit.save`, which in Paddle 3.x writes `<prefix>.json` + `<prefix>.pdiparams` for
Paddle Inference.

This module imports paddle at the top: only the `build-generator` command imports it, never the code location.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from dgx_assets.serving import training_data
from dgx_assets.serving.tokenizer import PAD_ID, UNK_ID, Tokenizer

MODEL_PREFIX = "generator"  # <dir>/generator.json + <dir>/generator.pdiparams
META_FILE = "generator_meta.json"


@dataclass
class TrainSettings:
    image_size: int = 64
    z_dim: int = 32
    text_dim: int = 64
    hidden: int = 512
    max_tokens: int = 256
    epochs: int = 30
    max_seconds: float = 180.0  # a hard cap so a slow machine still finishes in minutes
    batch_size: int = 64
    learning_rate: float = 3e-3
    # Weights of the two terms on images decoded from prior noise (see `_loss`), per image as the
    # reconstruction's. Chosen on the 12 demo prompts: BENCHMARKS.md, "Stand-in generator diversity".
    prior_weight: float = 0.3
    condition_weight: float = 100.0
    limit: int | None = None
    seed: int = 0

    @classmethod
    def quick(cls) -> TrainSettings:
        """Seconds on a CPU, for tests and smoke runs; already answers to defective/functional, mono/poly.
        Its 96 steps are too few to learn cells under the classifier's full weight: the images' likeness to
        their class fell below the real cells' 5th percentile at 100, not at 30."""
        return cls(
            image_size=32, z_dim=16, text_dim=32, hidden=256, epochs=12, max_seconds=45.0, limit=512, condition_weight=30.0
        )


class TextEncoder(nn.Layer):
    """Bag of words: the mean says what the prompt is about overall, the max lets one decisive word
    ("defective", "多晶") stand out among many filler words."""

    def __init__(self, vocabulary_size: int, dim: int):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary_size, dim, padding_idx=PAD_ID)
        self.project = nn.Linear(2 * dim, dim)

    def forward(self, tokens):
        mask = paddle.cast(tokens != PAD_ID, "float32").unsqueeze(-1)
        embedded = self.embedding(tokens)
        mean = (embedded * mask).sum(axis=1) / paddle.clip(mask.sum(axis=1), min=1.0)
        peak = (embedded + (mask - 1.0) * 1e4).max(axis=1) * paddle.clip(mask.sum(axis=1), max=1.0)
        return F.tanh(self.project(paddle.concat([mean, peak], axis=1)))


class Decoder(nn.Layer):
    """(noise, condition) -> a dense layer lays out the image at a quarter of its size (the cells in the
    demo data are aligned, so global layout is cheap to learn), two upsampling convolutions add texture.
    Small on purpose: Paddle's CPU convolutions are slow and training must fit in minutes."""

    def __init__(self, z_dim: int, text_dim: int, size: int, hidden: int, channels: int = 16):
        super().__init__()
        if size % 4:
            raise ValueError(f"image_size must be a multiple of 4, got {size}")
        self.quarter, self.channels = size // 4, channels
        self.dense = nn.Sequential(
            nn.Linear(z_dim + text_dim, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, channels * self.quarter**2),
            nn.LeakyReLU(0.2),
        )
        self.upsample = nn.Sequential(
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2D(channels, channels // 2, 3, padding=1),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2D(channels // 2, 1, 3, padding=1),
        )

    def forward(self, z, condition):
        hidden = self.dense(paddle.concat([z, condition], axis=1))
        return F.sigmoid(self.upsample(hidden.reshape([-1, self.channels, self.quarter, self.quarter])))


class Encoder(nn.Layer):
    """(image, condition) -> the mean and log-variance of the noise that explains the image (training only)."""

    def __init__(self, z_dim: int, text_dim: int, size: int, hidden: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(size * size + text_dim, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 2 * z_dim))

    def forward(self, images, condition):
        stats = self.body(paddle.concat([images.flatten(start_axis=1), condition], axis=1))
        return paddle.chunk(stats, 2, axis=1)  # mean, log-variance


class ConditionClassifier(nn.Layer):
    """Which condition keys ("defective", "mono", ...) an image shows: a linear model over its pixels,
    fitted to the real images as training goes (training only)."""

    def __init__(self, size: int, keys: list[str]):
        super().__init__()
        self.keys = keys
        self.linear = nn.Linear(size * size, len(keys))

    def targets(self, conditions: list[list[str]]) -> np.ndarray:
        return np.array([[key in keys for key in self.keys] for keys in conditions], dtype=np.float32)

    def forward(self, images):
        return self.linear(images.flatten(start_axis=1))

    def judge(self, images, targets):
        """Binary cross-entropy per image with this step's weights held fixed: the decoder learns from the
        verdict, the classifier does not learn to accept the decoder's images."""
        weight, bias = self.linear.weight.detach(), self.linear.bias.detach()
        logits = F.linear(images.flatten(start_axis=1), weight, bias)
        return F.binary_cross_entropy_with_logits(logits, targets, reduction="sum") / images.shape[0]


class Generator(nn.Layer):
    """The exported graph: (token ids [B, T<=max_tokens] int64, noise [B, z_dim] float32) -> images [B, 1, S, S]."""

    def __init__(self, text: TextEncoder, decoder: Decoder):
        super().__init__()
        self.text = text
        self.decoder = decoder

    def forward(self, tokens, z):
        return self.decoder(z, self.text(tokens))


def _load_training_set(settings: TrainSettings, images_dir: str | None) -> training_data.TrainingSet:
    if images_dir:
        return training_data.load_folder(images_dir, settings.image_size, settings.limit, settings.seed)
    if not training_data.elpv_available():
        raise RuntimeError("no training images: install the `elpv-dataset` package or pass --images DIR")
    return training_data.load_elpv(settings.image_size, settings.limit, settings.seed)


def train_and_export(out_dir: str | Path, settings: TrainSettings, images_dir: str | None = None, log=print) -> dict:
    """Train on the demo images and write the Paddle Inference model + its metadata to `out_dir`."""
    started = time.monotonic()
    paddle.seed(settings.seed)
    rng = random.Random(settings.seed)
    data = _load_training_set(settings, images_dir)
    tokenizer = Tokenizer.from_texts(training_data.all_caption_words(data.conditions), settings.max_tokens)
    log(f"training on {len(data.images)} images from {data.source}, vocabulary {len(tokenizer.vocabulary)}")

    model = _Training(settings, len(tokenizer.vocabulary), data.conditions)

    # The budget counts training only: loading the images on a busy machine must not cost the model epochs.
    training_started = time.monotonic()
    count, steps, last_loss = len(data.images), 0, float("nan")
    for epoch in range(settings.epochs):
        order = np.random.default_rng(settings.seed + epoch).permutation(count)
        for start in range(0, count, settings.batch_size):
            batch = order[start : start + settings.batch_size]
            tokens = paddle.to_tensor(_pad_batch([_caption_ids(tokenizer, data.conditions[i], rng) for i in batch]))
            last_loss = model.step(tokens, paddle.to_tensor(data.images[batch]), batch)
            steps += 1
        elapsed = time.monotonic() - training_started
        log(f"epoch {epoch + 1}/{settings.epochs} loss {last_loss:.4f} ({elapsed:.0f}s)")
        if elapsed + elapsed / (epoch + 1) > settings.max_seconds:  # another epoch would overrun the budget
            log(f"stopping at the {settings.max_seconds:.0f}s training budget")
            break

    generator = Generator(model.text, model.decoder)
    generator.eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Any prompt length up to max_tokens: the server pads a request only to its own longest prompt.
    specs = [
        paddle.static.InputSpec([None, None], "int64", "tokens"),
        paddle.static.InputSpec([None, settings.z_dim], "float32", "z"),
    ]
    paddle.jit.save(generator, str(out / MODEL_PREFIX), input_spec=specs)
    meta = {
        "model_prefix": MODEL_PREFIX,
        "vocabulary": tokenizer.vocabulary,
        "settings": asdict(settings),
        "source": data.source,
        "images": len(data.images),
        "steps": steps,
        "final_loss": last_loss,
        "train_seconds": round(time.monotonic() - started, 1),
        "paddle_version": paddle.__version__,  # pyright: ignore[reportPrivateImportUsage]
    }
    (out / META_FILE).write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    log(f"exported {out / MODEL_PREFIX}.json/.pdiparams in {meta['train_seconds']}s")
    return meta


class _Training:
    """The layers being trained, their optimizers, and one step of the loss."""

    def __init__(self, settings: TrainSettings, vocabulary_size: int, conditions: list[list[str]]):
        self.settings = settings
        self.text = TextEncoder(vocabulary_size, settings.text_dim)
        self.decoder = Decoder(settings.z_dim, settings.text_dim, settings.image_size, settings.hidden)
        self.encoder = Encoder(settings.z_dim, settings.text_dim, settings.image_size, settings.hidden)
        parameters = self.text.parameters() + self.decoder.parameters() + self.encoder.parameters()
        self.optimizer = paddle.optimizer.Adam(learning_rate=settings.learning_rate, parameters=parameters)
        keys = sorted({key for image_keys in conditions for key in image_keys})
        # Images under a folder with no condition names have no keys to classify.
        self.classifier = ConditionClassifier(settings.image_size, keys) if keys and settings.condition_weight else None
        self.targets = None if self.classifier is None else self.classifier.targets(conditions)
        if self.classifier is not None:
            self.classifier_optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=self.classifier.parameters())

    def step(self, tokens, images, batch: np.ndarray) -> float:
        """One optimizer step on these images, `batch` their indices in the training set."""
        targets = None
        if self.classifier is not None and self.targets is not None:  # it learns the real images, then judges samples
            targets = paddle.to_tensor(self.targets[batch])
            fit = F.binary_cross_entropy_with_logits(self.classifier(images), targets)
            fit.backward()
            self.classifier_optimizer.step()
            self.classifier_optimizer.clear_grad()
        loss = self._loss(tokens, images, targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.clear_grad()
        return float(loss)

    def _loss(self, tokens, images, targets):
        """The VAE's reconstruction and KL terms, and two terms on an image decoded from prior noise, which is
        what serving draws. A pixel loss against the batch's image keeps it looking like a cell; at full weight
        it pulled every sample to its class mean whatever the noise. The classifier's verdict makes it show the
        prompt's conditions in its own way. Alternatives measured: BENCHMARKS.md, "Stand-in generator diversity"."""
        settings = self.settings
        condition = self.text(tokens)
        mean, log_var = self.encoder(images, condition)
        z = mean + paddle.exp(0.5 * log_var) * paddle.randn(mean.shape)
        reconstruction = _bce(self.decoder(z, condition), images)
        kl = -0.5 * paddle.sum(1 + log_var - mean.square() - log_var.exp()) / images.shape[0]
        sampled = self.decoder(paddle.randn(mean.shape), condition)
        loss = reconstruction + kl + settings.prior_weight * _bce(sampled, images)
        if self.classifier is not None:
            loss = loss + settings.condition_weight * self.classifier.judge(sampled, targets)
        return loss / float(images[0].numel())


def _caption_ids(tokenizer: Tokenizer, conditions: list[str], rng: random.Random) -> list[int]:
    ids = tokenizer.encode(training_data.caption(conditions, rng)).ids
    # A few words become <unk> so unseen words in real prompts do not throw the condition off.
    ids = [UNK_ID if rng.random() < 0.05 else token for token in ids]
    if rng.random() < 0.3:
        ids.insert(rng.randrange(len(ids) + 1), UNK_ID)
    return ids


def _bce(predicted, images):
    return F.binary_cross_entropy(predicted, images, reduction="sum") / images.shape[0]


def _pad_batch(rows: list[list[int]]) -> np.ndarray:
    """Pad to the longest caption in the batch: padding to max_tokens would make the embedding 10x slower."""
    length = max(1, max(len(row) for row in rows))
    return np.array([row + [PAD_ID] * (length - len(row)) for row in rows], dtype=np.int64)
