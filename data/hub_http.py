"""Hub reads that survive the Hub's bad moments: every HTTP request `huggingface_hub` makes for the
hub path (the dataset's resolution by `datasets`, each parquet footer, each row group's ranged
read) goes through `RetryingClient`, installed with `huggingface_hub.set_client_factory`.

Per request, a transient failure — HTTP 408/429/500/502/503/504, a connection refused or reset, a
body cut short, a stall longer than `data.hub.timeout_s` — is retried up to `data.hub.retries`
times after bounded exponential backoff (`data.hub.retry_wait_s`, doubling up to
`data.hub.retry_max_wait_s`), never sooner than the server's `Retry-After` (or the Hub's
`RateLimit` reset), and 0-50% later at random so that ranks which failed together do not retry
together. Each retry is one log line and counted (`retry_count()`, `data_retries` in
metrics.jsonl). After the budget, `HubReadError` names the URL and the last status.

Why not `huggingface_hub`'s own `http_backoff` alone: it guards file reads but not API calls such
as `dataset_info` (no retry, and no timeout unless the caller gives one); it waits a fixed 1, 2, 4,
8, 8 s without jitter (every rank of every node retries at once) and gives up after ~23 s; it logs
two lines per retry; a 206 body shorter than its range passes. It still runs above this client, but
only ever sees a success, a non-transient error, or `HubReadError`, which it does not retry.
"""

from __future__ import annotations

import email.utils
import logging
import random
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx2

log = logging.getLogger("orscale.data")

RETRY_STATUS = (408, 429, 500, 502, 503, 504)
TRANSIENT_ERRORS = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 10  # attempts after the first, per request
    first_wait_s: float = 1.0
    max_wait_s: float = 60.0
    timeout_s: float = 60.0  # connect and read (no byte for this long) timeout of each attempt

    def wait_s(self, retry: int, server_asked_s: float | None, rng: random.Random) -> float:
        """The wait before retry `retry` (1-based): the backoff or the server's ask, whichever is
        longer, stretched by a random 0-50% (never shorter than either)."""
        backoff = min(self.max_wait_s, self.first_wait_s * 2 ** (retry - 1))
        return max(backoff, server_asked_s or 0.0) * rng.uniform(1.0, 1.5)


class HubReadError(Exception):
    """A Hub request that failed `attempts` times; `status` is the last HTTP status or error."""

    def __init__(self, method: str, url: str, status: str, attempts: int) -> None:
        self.method, self.url, self.status, self.attempts = method, url, status, attempts
        super().__init__(f"{method} {url}: {status} after {attempts} attempts")


def server_asked_wait_s(headers: httpx2.Headers) -> float | None:
    """Seconds the server asked to wait: `Retry-After` (seconds or an HTTP date), else the Hub's
    `RateLimit` reset when no requests remain (the IETF draft the Hub sends)."""
    from huggingface_hub.utils import parse_ratelimit_headers

    value = headers.get("retry-after")
    if value:
        if value.strip().isdigit():
            return float(value)
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            pass
    limit = parse_ratelimit_headers(headers)
    return float(limit.reset_in_seconds) if limit is not None and limit.remaining == 0 else None


def _short_body(response: httpx2.Response) -> bool:
    """A 206 shorter than the range it claims (what a broken proxy can send with a consistent
    Content-Length): pyarrow would read garbage, so it is retried like a cut connection."""
    m = re.fullmatch(r"bytes (\d+)-(\d+)/\S+", response.headers.get("content-range", ""))
    return (
        response.status_code == 206 and m is not None and len(response.content) != int(m.group(2)) - int(m.group(1)) + 1
    )


class RetryingClient(httpx2.Client):
    """An `httpx2.Client` whose `send` applies the retry policy and bounded timeouts to every
    request, redirects included (a retry resolves the CDN redirect again). Bodies are read inside
    the retry, so a cut or stalled body is retried too; the hub path reads only ranges and small
    API answers. Proxies from the environment still apply (they are the client's own mounts)."""

    def __init__(self, policy: RetryPolicy, **kwargs: Any) -> None:
        super().__init__(timeout=policy.timeout_s, **kwargs)
        self.policy, self.rng = policy, random.Random()

    def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        kwargs.pop("stream", None)  # read here either way: a caller that streams gets the read body
        request.extensions = {**request.extensions, "timeout": httpx2.Timeout(self.policy.timeout_s).as_dict()}
        url = str(request.url.copy_with(query=None))  # no signed query strings in the log
        for attempt in range(1, self.policy.retries + 2):
            asked: float | None = None
            try:
                response = super().send(request, stream=False, **kwargs)
                if response.status_code not in RETRY_STATUS and not _short_body(response):
                    return response
                if response.status_code in RETRY_STATUS:
                    status, asked = f"HTTP {response.status_code}", server_asked_wait_s(response.headers)
                else:
                    status = f"a short body ({len(response.content)} bytes for {response.headers['content-range']})"
                response.close()
            except TRANSIENT_ERRORS as err:
                if _unknown_host(err):
                    raise
                status = _describe(err, self.policy.timeout_s)
            if attempt > self.policy.retries:
                raise HubReadError(request.method, url, status, attempt)
            wait = self.policy.wait_s(attempt, asked, self.rng)
            _count_retry()
            log.warning(
                "data: hub %s %s: %s; retry %d/%d in %.1f s",
                request.method,
                url,
                status,
                attempt,
                self.policy.retries,
                wait,
            )
            time.sleep(wait)
        raise AssertionError("unreachable")


def _unknown_host(err: BaseException) -> bool:
    """DNS answered that the host does not exist (not "try again"): retrying cannot help, and
    `datasets` probes such hosts on purpose (a legacy script bucket, the datasets server)."""
    for _ in range(8):  # the chain httpx2 -> httpcore -> socket is three deep
        if isinstance(err, socket.gaierror) and err.errno == socket.EAI_NONAME:
            return True
        if err is None:
            return False
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return False


def _describe(err: Exception, timeout_s: float) -> str:
    if isinstance(err, httpx2.TimeoutException):
        return f"no answer for {timeout_s:g} s ({type(err).__name__})"
    return f"{type(err).__name__} ({err})" if str(err) else type(err).__name__


_lock = threading.Lock()
_retries = 0
_installed: RetryPolicy | None = None


def _count_retry() -> None:
    global _retries
    with _lock:
        _retries += 1


def retry_count() -> int:
    """Hub requests this process has retried so far (every thread)."""
    with _lock:
        return _retries


def install(policy: RetryPolicy) -> None:
    """Make `huggingface_hub` (and so `datasets` and `hf://` files) send every request through a
    `RetryingClient(policy)`; a no-op when that policy is already in place."""
    global _installed
    import huggingface_hub
    from huggingface_hub.utils._http import hf_request_event_hook  # the default client's hook (headers, telemetry)

    with _lock:
        if _installed == policy:
            return
        _installed = policy

    def client() -> httpx2.Client:
        return RetryingClient(policy, event_hooks={"request": [hf_request_event_hook]}, follow_redirects=True)

    huggingface_hub.set_client_factory(client)
