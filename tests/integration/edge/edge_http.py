"""What the edge HTTP tests share: an edge server on 127.0.0.1, in this process or in one of its own (whose
memory is its own to measure), stopped when the test ends; PNGs of any size built row by row."""

from __future__ import annotations

import contextlib
import re
import struct
import subprocess
import sys
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from support.waiting import wait_for

from dgx_assets.station.runtime import EdgeClassifier
from dgx_assets.station.server import make_server


@contextlib.contextmanager
def running_server(model_dir, **limits):
    server = make_server(EdgeClassifier(model_dir), "127.0.0.1", 0, **limits)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.uvicorn.started, what="the edge server listening")
        yield server
    finally:
        server.shutdown()
        thread.join(timeout=10)


@dataclass
class EdgeProcess:
    pid: int
    port: int
    log_path: Path

    def memory_mb(self, field: str = "VmHWM") -> float:
        """VmHWM: the peak resident memory so far; VmRSS: now."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise KeyError(field)


@contextlib.contextmanager
def edge_process(model_dir, log_path: Path, *flags: str):
    """`dgx-assets edge-run --serve` in a process of its own on a free port, its log in `log_path`."""
    command = [sys.executable, "-m", "dgx_assets", "edge-run", "--model-dir", str(model_dir), "--serve", "--port", "0", *flags]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
    try:
        line = process.stdout.readline().decode()  # "edge-run: serving DIR on http://127.0.0.1:PORT (...)", or EOF
        found = re.search(r"http://127\.0\.0\.1:(\d+) ", line)
        assert found, f"edge-run did not start: {line!r} {log_path.read_text()[-2000:]}"
        yield EdgeProcess(process.pid, int(found.group(1)), log_path)
    finally:
        process.terminate()
        process.wait(30)
        process.stdout.close()


def blank_png(width: int, height: int, bit_depth: int = 8) -> bytes:
    """A grey PNG of any size, compressed row by row (a 13000x13000 16-bit one is 330 KB and never in memory)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor, row = zlib.compressobj(9), bytes(1 + width * bit_depth // 8)  # filter byte 0, then zeros
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, bit_depth, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
