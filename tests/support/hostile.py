"""A hostile landing zone on the real file system: links out of the zone, into a folder, back to the batch and to
themselves, a dangling link, a FIFO, a Unix socket and a name that is not UTF-8, beside one good image."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from imagefactory import valid_images

GOOD = valid_images()["grey.png"]
SECRET = valid_images(seed=7)["grey.png"]  # an image outside the landing zone: must never be read


@contextlib.contextmanager
def hostile_batch(landing: Path, outside: Path, batch: str = "hostile"):
    """Yield {name: expected status} for `<landing>/<batch>/functional/`; the socket is closed afterwards."""
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "secret.png").write_bytes(SECRET)
    (outside / "folder").mkdir(exist_ok=True)
    (outside / "folder" / "also_secret.png").write_bytes(SECRET)
    folder = landing / batch / "functional"
    folder.mkdir(parents=True)
    (folder / "good.png").write_bytes(GOOD)
    (folder / "out.png").symlink_to(outside / "secret.png")
    (folder / "outdir").symlink_to(outside / "folder", target_is_directory=True)
    (folder / "loop").symlink_to(landing / batch, target_is_directory=True)  # back to the batch: a cycle
    (folder / "self.png").symlink_to(folder / "self.png")  # loops on itself
    (folder / "dangling.png").symlink_to(outside / "nowhere.png")
    os.mkfifo(folder / "fifo.png")  # opening it for reading would block forever
    with open(os.path.join(os.fsencode(folder), b"latin1-\xe9.png"), "wb") as handle:  # b"\xe9" alone is not UTF-8
        handle.write(GOOD)
    server = socket.socket(socket.AF_UNIX)
    try:
        _bind_inside(server, folder, "sock.png")
        yield {
            "good.png": "valid",
            "out.png": "symlink",
            "outdir": "symlink",
            "loop": "symlink",
            "self.png": "symlink",
            "dangling.png": "symlink",
            "fifo.png": "special_file",
            "sock.png": "special_file",
            "latin1-\\xe9.png": "bad_name",  # how the row spells it
        }
    finally:
        server.close()


def _bind_inside(server: socket.socket, folder: Path, name: str) -> None:
    """Bind through the folder's descriptor: a socket's path holds at most 107 bytes, a deep tmp_path more."""
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        server.bind(f"/proc/self/fd/{folder_fd}/{name}")
    finally:
        os.close(folder_fd)
