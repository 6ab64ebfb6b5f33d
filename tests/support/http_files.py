"""A local HTTP server of a folder's files for the remote-shard tests and benchmark: HEAD, GET and single-range GET
(``Range: bytes=a-b``, answered 206), an ETag, 404 for a missing file, 403 under ``/private/``, and a fault on call:
the first GET of a chosen path sends the headers of the whole answer, then only some bytes, and closes the socket
(a dropped connection). Python's SimpleHTTPRequestHandler answers no Range request, hence this one.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class FolderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, folder: Path):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.folder = Path(folder)
        self.cuts: dict[str, int] = {}  # path -> bytes sent before the first GET of it is cut off (then forgotten)
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Range header or "")
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FolderServer
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers: a cut connection is then a surprise to the client

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without this, Nagle's algorithm holds the body until the client's
        # delayed ACK of the headers (40 ms a request on Linux); real servers (nginx, object stores) set it too
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        wanted = self.headers.get("Range", "")
        with self.server.lock:
            self.server.requests.append((self.command, path, wanted))
            cut = self.server.cuts.pop(path, None) if body else None
        if path.startswith("/private/"):
            return self._status(403)
        file = self.server.folder / path.lstrip("/")
        if not file.is_file():
            return self._status(404)
        size = file.stat().st_size
        start, end, status = 0, size, 200
        match = _RANGE.match(wanted)
        if match:
            start, end, status = int(match.group(1)), min(int(match.group(2) or size - 1) + 1, size), 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{size:x}-{file.stat().st_mtime_ns:x}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not body:
            return
        with open(file, "rb") as f:
            f.seek(start)
            data = f.read(end - start if cut is None else min(cut, end - start))
        self.wfile.write(data)
        if cut is not None:  # the dropped connection: part of the promised bytes, then the socket closed
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)

    def _status(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextlib.contextmanager
def serve_folder(folder: Path) -> Iterator[FolderServer]:
    """``folder`` served at ``server.url`` on a free port of 127.0.0.1 for the block."""
    server = FolderServer(folder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
