"""A hostile (or broken) Hugging Face hub on 127.0.0.1: a real HTTP server answering
HEAD and GET of /OWNER/REPO/resolve/main/FILE with whatever headers and body a test sets,
optionally cutting or stalling the body, and counting the GETs."""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubFile:
    """What the hub serves for one file. etag/commit default to the honest values; body_cut
    sends only that many bytes of each GET, then closes (cut) or hangs (stall)."""

    body: bytes
    etag: str | None = None
    commit: str = COMMIT
    served: bytes | None = None  # the bytes actually sent, when they differ from body
    cut: int | None = None
    stall: bool = False
    gets: list[str] = field(default_factory=list)

    def headers(self) -> dict[str, str]:
        etag = self.etag if self.etag is not None else hashlib.sha256(self.body).hexdigest()
        return {"X-Repo-Commit": self.commit, "X-Linked-Etag": f'"{etag}"', "ETag": f'"{etag}"',
                "X-Linked-Size": str(len(self.body)), "Content-Length": str(len(self.body))}


class FakeHub:
    """Serve files under http://127.0.0.1:PORT until close()."""

    def __init__(self) -> None:
        self.files: dict[str, HubFile] = {}
        self._stop = threading.Event()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                f = hub.files.get(self.path.split("?")[0])
                if f is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                for k, v in f.headers().items():
                    self.send_header(k, v)
                self.end_headers()

            def do_GET(self) -> None:
                f = hub.files.get(self.path.split("?")[0])
                if f is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                f.gets.append(self.headers.get("Range") or "")
                data = f.served if f.served is not None else f.body
                start = 0
                m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if m:
                    start = int(m.group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                part = data[start:]
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                if f.cut is not None:
                    self.wfile.write(part[: f.cut])
                    self.wfile.flush()
                    if f.stall:
                        hub._stop.wait(30)
                    self.close_connection = True
                    return
                self.wfile.write(part)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def add(self, repo_id: str, filename: str, f: HubFile) -> HubFile:
        self.files[f"/{repo_id}/resolve/main/{filename}"] = f
        return f

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
