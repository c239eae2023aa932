"""A stand-in for the Hugging Face Hub's HTTP API, on 127.0.0.1, for tests.

`huggingface_hub` and `datasets` take the Hub's address from `HF_ENDPOINT`, so pointing it here
lets the real clients run unchanged against one dataset repository held in memory. The routes are
the ones the installed clients were seen to call (an unknown route is answered 404 and recorded in
`unexpected`, which the tests assert is empty):

  HEAD|GET /datasets/{repo}/resolve/{rev}/{path}   a file; an LFS file (parquet) redirects to
  GET      /cdn/{sha256}                           its bytes, with HTTP Range (206), as the Hub's CDN
  GET      /api/datasets/{repo}/revision/{rev}     the repository's info (sha, siblings, card data)
  GET      /api/datasets/{repo}/tree/{rev}[/{dir}] a folder's listing (recursive=true: all below)

Every request is recorded (`log`: route, file, row group, range, status, fault). A parquet read is
classed `footer` (it reaches the file's metadata) or `row_group` (it starts in a row group's column
chunk and ends before the metadata); everything under /api and the card are `api`. (`datasets`
also asks two hosts derived from the endpoint, the legacy script bucket and `datasets-server.<host>`:
they do not resolve here, and it carries on without them as it does on their 404.)

Faults are scheduled per class with `inject(route, *kinds, times=1, where=None)`: the next matching
requests of that class fail so: `429` (Retry-After: `retry_after_s`), `500`, `503`, `reset` (half
the body, then a TCP reset), `stall` (half the body, then silence for `stall_s`, longer than the
client's read timeout), `truncate` (the full Content-Length promised, half sent, then a clean
close) and `short` (a 206 whose Content-Length matches a body half the range it claims, as a
broken proxy sends).

Loops are bounded: an idle keep-alive connection is dropped after `idle_s`, a connection serves
at most 1,000 requests, a stall ends after `stall_s`, and the server stops by itself `lifetime_s`
after it started, should a test leak it.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import re
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlparse

FAULTS = ("429", "500", "503", "reset", "stall", "truncate", "short")
ROUTES = ("api", "footer", "row_group")


@dataclass(frozen=True)
class Served:
    """One request as the server saw and answered it."""

    method: str
    path: str
    route: str  # api | footer | row_group | other
    file: str | None = None  # repository path of the file read
    row_group: int | None = None  # the row group a row_group read starts in
    start: int | None = None  # byte range asked for (inclusive end)
    end: int | None = None
    status: int = 200
    fault: str | None = None


@dataclass
class _Scheduled:
    kind: str
    times: int
    where: Callable[[Served], bool] | None


@dataclass
class RepoFile:
    path: str
    data: bytes
    lfs: bool  # served through the CDN route, like the Hub's LFS/Xet files
    row_groups: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each row group's bytes
    footer_start: int = 0

    @property
    def oid(self) -> str:  # git blob id
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def entry(self) -> dict:
        out = {"type": "file", "oid": self.oid, "size": len(self.data), "path": self.path}
        if self.lfs:
            out["lfs"] = {"oid": self.sha256, "size": len(self.data), "pointerSize": 134}
        return out


def _parquet_layout(data: bytes) -> tuple[list[tuple[int, int]], int]:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    groups = []
    for i in range(meta.num_row_groups):
        cols = [meta.row_group(i).column(j) for j in range(meta.num_columns)]
        starts = [c.dictionary_page_offset or c.data_page_offset for c in cols]
        groups.append((min(starts), max(s + c.total_compressed_size for s, c in zip(starts, cols, strict=True))))
    footer_len = struct.unpack("<I", data[-8:-4])[0]
    return groups, len(data) - 8 - footer_len


class StandInHub:
    """One dataset repository `repo_id` at one commit, served on 127.0.0.1 until `stop()`."""

    def __init__(
        self,
        repo_id: str,
        files: dict[str, bytes],
        stall_s: float = 3.0,
        idle_s: float = 10.0,
        lifetime_s: float = 900.0,
        retry_after_s: int = 1,
    ) -> None:
        self.repo_id, self.stall_s, self.idle_s, self.retry_after_s = repo_id, stall_s, idle_s, retry_after_s
        self.delay_s = 0.0  # added before each row-group answer: a slow Hub (a kill lands mid-run)
        self.files: dict[str, RepoFile] = {}
        for path, data in sorted(files.items()):
            f = RepoFile(path, data, lfs=path.endswith(".parquet"))
            if f.lfs:
                f.row_groups, f.footer_start = _parquet_layout(data)
            self.files[path] = f
        self.sha = hashlib.sha1("".join(f.oid for f in self.files.values()).encode()).hexdigest()
        self.log: list[Served] = []
        self.unexpected: list[str] = []
        self.routes: Counter[str] = Counter()  # requests per route of the table above
        self._faults: dict[str, deque[_Scheduled]] = {r: deque() for r in ROUTES}
        self._lock = threading.Lock()
        self._generation = 0  # bumped by clear(): a request that arrived before it leaves no trace after it
        self._server = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._watchdog = threading.Timer(lifetime_s, self.stop)
        self._watchdog.daemon = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StandInHub:
        self._thread.start()
        self._watchdog.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._watchdog.cancel()
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    # ---------------------------------------------------------------- faults and records
    def inject(self, route: str, *kinds: str, times: int = 1, where: Callable[[Served], bool] | None = None) -> None:
        """The next `times` requests of class `route` (matching `where`) fail as each of `kinds`."""
        assert route in ROUTES and all(k in FAULTS for k in kinds), (route, kinds)
        assert route != "api" or "short" not in kinds, "a short body is a ranged read's fault"
        with self._lock:
            self._faults[route].extend(_Scheduled(k, times, where) for k in kinds)

    def clear(self) -> None:
        with self._lock:
            self.log.clear()
            self.unexpected.clear()
            self.routes.clear()
            self._generation += 1
            for queue in self._faults.values():
                queue.clear()

    def pending_faults(self) -> int:
        with self._lock:
            return sum(s.times for q in self._faults.values() for s in q)

    def reads(self, route: str = "row_group", clean: bool = True) -> list[Served]:
        """The recorded reads of class `route` (only those served without a fault when `clean`)."""
        with self._lock:
            return [s for s in self.log if s.route == route and (s.fault is None or not clean)]

    def _take_fault(self, served: Served) -> str | None:
        with self._lock:
            queue = self._faults.get(served.route, deque())
            for scheduled in list(queue):
                if served.method == "HEAD" and scheduled.kind in ("reset", "stall", "truncate", "short"):
                    continue  # no body to cut: left for the next GET
                if scheduled.where is None or scheduled.where(served):
                    scheduled.times -= 1
                    if scheduled.times <= 0:
                        queue.remove(scheduled)
                    return scheduled.kind
        return None

    def _record(self, served: Served, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self.log.append(served)

    # ---------------------------------------------------------------- the repository's API
    def info(self) -> dict:
        return {
            "_id": "0" * 24,
            "id": self.repo_id,
            "author": self.repo_id.split("/")[0],
            "sha": self.sha,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "cardData": {},
            "siblings": [{"rfilename": p} for p in self.files],
            "createdAt": "2026-01-01T00:00:00.000Z",
            "usedStorage": sum(len(f.data) for f in self.files.values()),
        }

    def tree(self, folder: str, recursive: bool) -> list[dict]:
        prefix = f"{folder}/" if folder else ""
        out, dirs = [], set()
        for path, f in self.files.items():
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :].split("/")
            for depth in range(1, len(rest)):
                if recursive or depth == 1:
                    dirs.add(prefix + "/".join(rest[:depth]))
            if recursive or len(rest) == 1:
                out.append(f.entry())
        tree_oid = hashlib.sha1(folder.encode()).hexdigest()
        return sorted([{"type": "directory", "oid": tree_oid, "path": d} for d in dirs] + out, key=lambda e: e["path"])

    def classify(self, method: str, path: str, rng: tuple[int, int] | None) -> Served:
        """Which class a request belongs to (before it is answered)."""
        m = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
        if m:
            f = next((f for f in self.files.values() if f.sha256 == m.group(1)), None)
            if f is not None and rng is not None:
                start, end = rng
                if end >= f.footer_start:  # pyarrow's footer read: the file's last 64 KiB, or all of it
                    return Served(method, path, "footer", f.path, None, start, end)
                group = next((i for i, (a, b) in enumerate(f.row_groups) if a <= start < b), None)
                return Served(method, path, "row_group" if group is not None else "other", f.path, group, start, end)
            return Served(method, path, "other", f.path if f else None)
        if path.startswith("/api/") or path.endswith("/README.md"):
            return Served(method, path, "api")
        return Served(method, path, "other")


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up on a fault (reset, stall) is expected; the tests read `hub.log`


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    if not header:
        return None
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
    if not m:
        return None
    a, b = m.groups()
    if a == "":  # suffix range: the last b bytes
        return max(0, size - int(b)), size - 1
    return int(a), min(int(b), size - 1) if b else size - 1


def _handler(hub: StandInHub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = hub.idle_s  # an idle keep-alive connection is dropped
        served_here = 0

        def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read `hub.log`
            pass

        def handle_one_request(self) -> None:
            self.served_here += 1
            if self.served_here > 1000:
                self.close_connection = True
                return
            super().handle_one_request()

        def do_HEAD(self) -> None:
            self._route("HEAD")

        def do_GET(self) -> None:
            self._route("GET")

        # ------------------------------------------------------------ routing
        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            path, query = unquote(url.path), parse_qs(url.query)
            repo = re.escape(hub.repo_id)
            cdn = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
            file_for_cdn = next((f for f in hub.files.values() if cdn and f.sha256 == cdn.group(1)), None)
            size = len(file_for_cdn.data) if file_for_cdn else 0
            rng = _parse_range(self.headers.get("Range"), size) if file_for_cdn else None
            served = hub.classify(method, path, rng)
            # The fault is chosen on arrival, before the delay: a killed client's request still in
            # its delay must not take a fault (or a log entry) scheduled after a clear() for the next run.
            self._generation = hub._generation
            fault = hub._take_fault(served)
            if served.route == "row_group":
                time.sleep(min(hub.delay_s, 5.0))
            if self._generation != hub._generation:
                self.close_connection = True
                return  # cleared while it waited: its client belongs to a run that has ended
            if fault in ("429", "500", "503"):
                headers = {"Retry-After": str(hub.retry_after_s)} if fault == "429" else {}
                return self._send(served, int(fault), b'{"error": "stand-in fault"}', fault=fault, headers=headers)
            if m := re.fullmatch(rf"/datasets/{repo}/resolve/([^/]+)/(.+)", path):
                hub.routes[f"{method} resolve"] += 1
                return self._resolve(served, method, m.group(2), fault)
            if file_for_cdn is not None and method == "GET":
                hub.routes["GET cdn"] += 1
                return self._bytes(served, file_for_cdn, rng, fault)
            if re.fullmatch(rf"/api/datasets/{repo}/revision/[^/]+", path):
                hub.routes["GET info"] += 1
                return self._json(served, hub.info(), fault)
            if m := re.fullmatch(rf"/api/datasets/{repo}/tree/([^/]+)(?:/(.*))?", path):
                folder = (m.group(2) or "").strip("/")
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                hub.routes["GET tree" + (" recursive" if recursive else "")] += 1
                return self._json(served, hub.tree(folder, recursive), fault)
            hub.unexpected.append(f"{method} {self.path}")
            return self._send(
                served, 404, b'{"error": "not served by the stand-in"}', headers={"X-Error-Code": "EntryNotFound"}
            )

        def _resolve(self, served: Served, method: str, rel: str, fault: str | None) -> None:
            f = hub.files.get(rel)
            common = {"X-Repo-Commit": hub.sha}
            if f is None:
                return self._send(served, 404, b"{}", headers={**common, "X-Error-Code": "EntryNotFound"})
            if f.lfs:  # like the Hub: the resolve URL redirects to the CDN that holds the bytes
                headers = {
                    **common,
                    "Location": f"{hub.url}/cdn/{f.sha256}",
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(len(f.data)),
                    "ETag": f'"{f.oid}"',
                }
                return self._send(served, 302, b"", headers=headers)
            return self._send(served, 200, f.data, fault=fault, headers={**common, "ETag": f'"{f.oid}"'})

        def _bytes(self, served: Served, f: RepoFile, rng: tuple[int, int] | None, fault: str | None) -> None:
            if rng is None:
                return self._send(served, 200, f.data, fault=fault, headers={"Accept-Ranges": "bytes"})
            start, end = rng
            if start >= len(f.data):
                return self._send(served, 416, b"", headers={"Content-Range": f"bytes */{len(f.data)}"})
            headers = {"Content-Range": f"bytes {start}-{end}/{len(f.data)}", "Accept-Ranges": "bytes"}
            body = f.data[start : end + 1]
            if fault == "short":
                body = body[: len(body) // 2]
            return self._send(served, 206, body, fault=fault, headers=headers)

        def _json(self, served: Served, obj: object, fault: str | None) -> None:
            self._send(served, 200, json.dumps(obj).encode(), fault=fault, headers={"Content-Type": "application/json"})

        # ------------------------------------------------------------ the answer, or a fault while answering
        def _send(
            self,
            served: Served,
            status: int,
            body: bytes,
            fault: str | None = None,
            headers: dict[str, str] | None = None,
        ) -> None:
            hub._record(Served(**{**served.__dict__, "status": status, "fault": fault}), self._generation)
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if fault in ("reset", "stall", "truncate"):
                self.close_connection = True
                try:
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    if fault == "stall":
                        time.sleep(hub.stall_s)  # longer than the client's read timeout; bounded
                    if fault == "reset":  # SO_LINGER 0: close() sends RST, not FIN
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    else:
                        self.connection.shutdown(socket.SHUT_WR)
                    self.connection.close()
                except OSError:  # the client gave up first (a stall outlasts its timeout)
                    pass
                return
            self.wfile.write(body)

    return Handler
