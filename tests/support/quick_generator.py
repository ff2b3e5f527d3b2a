"""The quick generator the tests and benchmarks serve: built once per version of the generator's code.

Seconds to build (`dgx-assets build-generator --quick`), kept under `<repo>/.dgx/cache/` and rebuilt when
generator.py, training_data.py or tokenizer.py change. Not part of the product: a deployment builds its
generator once with `dgx-assets build-generator`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from dgx_assets import settings
from dgx_assets.generation.launcher import ensure_generator

GENERATOR_SOURCES = ("generator.py", "training_data.py", "tokenizer.py")


def source_fingerprint() -> str:
    """A hash of the generator's source: a cached model is rebuilt when the code that made it changes."""
    digest = hashlib.sha256()
    serving = settings.repo_root() / "dgx_assets" / "serving"
    for name in GENERATOR_SOURCES:
        digest.update((serving / name).read_bytes())
    return digest.hexdigest()[:12]


def cached_quick_generator(cache_root: str | Path | None = None) -> Path:
    """The quick generator's model folder under `cache_root` (default `<repo>/.dgx/cache/`), built if missing."""
    root = Path(cache_root) if cache_root else settings.repo_root() / ".dgx" / "cache"
    return ensure_generator(root / f"quick-generator-{source_fingerprint()}", quick=True)
