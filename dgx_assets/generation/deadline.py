"""A total deadline under urllib3. Its read timeout applies to each socket read, so a server dripping one byte
at a time would hold a request for as long as it drips; through these pools every read of a response gets
only what is left of the deadline the calling thread set in `DEADLINE.at` (`_DeadlineResponse`)."""

from __future__ import annotations

import http.client
import io
import threading
import time

import urllib3
import urllib3.connection

DEADLINE = threading.local()  # `at`: the monotonic time the current thread's request must end by


class _DeadlineReader(io.RawIOBase):
    """The socket under one HTTP response: each read waits at most for what is left of the deadline."""

    def __init__(self, sock, deadline: float):
        # A socket file of its own keeps the descriptor open after http.client closes the connection of a
        # response that ends it (`Connection: close`), as http.client's own file does.
        self._raw, self._sock, self._deadline = sock.makefile("rb", buffering=0), sock, deadline
        self._read_timeout = sock.gettimeout()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline has passed")
        self._sock.settimeout(left if self._read_timeout is None else min(left, self._read_timeout))
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    """http.client's response, reading its status line, headers and body through a `_DeadlineReader`."""

    def __init__(self, sock, *args, **kwargs):
        super().__init__(sock, *args, **kwargs)
        deadline = getattr(DEADLINE, "at", None)
        if deadline is not None:
            self.fp.close()  # the plain socket file http.client made, replaced by one that keeps the deadline
            self.fp = io.BufferedReader(_DeadlineReader(sock, deadline))


class _HTTPConnection(urllib3.connection.HTTPConnection):
    response_class = _DeadlineResponse


class _HTTPSConnection(urllib3.connection.HTTPSConnection):
    response_class = _DeadlineResponse


class HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection  # pyright: ignore[reportAssignmentType]  # urllib3's Protocol stub, not its class


class HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection  # pyright: ignore[reportAssignmentType]  # urllib3's Protocol stub, not its class
