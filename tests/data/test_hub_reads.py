"""Reading a dataset from the Hub, against the stand-in Hub (`tests/hub_server.py`, 127.0.0.1): the
retry policy, the project's `RetryingClient` under each kind of fault, and the real `datasets` /
`huggingface_hub` clients reading the repository as the project's data path does (a subprocess,
since they read `HF_ENDPOINT` when imported)."""

from __future__ import annotations

import json
import logging
import random
import time

import httpx2
import pytest

from data.hub_http import HubReadError, RetryingClient, RetryPolicy, retry_count, server_asked_wait_s
from tests.data.hub_repo import REPO, SUBSET, fineweb_edu_files, hub_env, local_copy, run_python
from tests.hub_server import FAULTS, StandInHub


@pytest.fixture(scope="module")
def hub():
    with StandInHub(REPO, fineweb_edu_files(), stall_s=2.0) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh(hub):
    hub.clear()
    hub.retry_after_s = 1
    yield
    assert hub.unexpected == [], "the clients called routes the stand-in does not serve"


def client(retries: int = 3, timeout_s: float = 0.5) -> RetryingClient:
    return RetryingClient(RetryPolicy(retries, 0.01, 0.05, timeout_s), follow_redirects=True)


def resolve_url(hub: StandInHub, path: str) -> str:
    return f"{hub.url}/datasets/{REPO}/resolve/main/{path}"


def row_group_range(hub: StandInHub, path: str, group: int) -> str:
    start, end = hub.files[path].row_groups[group]
    return f"bytes={start}-{end - 1}"


FILE = "sample/10BT/001_00000.parquet"


def test_the_wait_doubles_to_its_cap_never_precedes_retry_after_and_differs_between_ranks():
    policy, rng = RetryPolicy(retries=10, first_wait_s=1.0, max_wait_s=8.0), random.Random(0)
    for retry in range(1, 9):
        backoff = min(8.0, 2.0 ** (retry - 1))
        assert backoff <= policy.wait_s(retry, None, rng) <= 1.5 * backoff
    assert 30 <= policy.wait_s(1, 30.0, rng) <= 45  # the server's ask wins over a shorter backoff
    first = [policy.wait_s(1, None, random.Random()) for _ in range(64)]  # 64 ranks failing together
    assert len(set(first)) == 64 and max(first) - min(first) > 0.3
    assert server_asked_wait_s(httpx2.Headers({"Retry-After": "7"})) == 7
    later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 20))
    assert 15 < server_asked_wait_s(httpx2.Headers({"Retry-After": later})) <= 20  # type: ignore[operator]
    assert server_asked_wait_s(httpx2.Headers({"RateLimit": '"api";r=0;t=55'})) == 55  # the Hub's own header
    assert server_asked_wait_s(httpx2.Headers({"RateLimit": '"api";r=3;t=55'})) is None


def test_each_fault_kind_is_retried_on_its_own_read_with_one_log_line(hub, caplog):
    caplog.set_level(logging.WARNING, logger="orscale.data")
    clean = hub.files[FILE].data
    start, end = hub.files[FILE].row_groups[2]
    with client() as c:
        for kind in FAULTS:
            hub.inject("row_group", kind)
            t0 = time.perf_counter()
            before = retry_count()
            r = c.get(resolve_url(hub, FILE), headers={"Range": row_group_range(hub, FILE, 2)})
            elapsed = time.perf_counter() - t0
            assert r.status_code == 206 and r.content == clean[start:end], kind
            assert retry_count() == before + 1, kind
            if kind == "429":
                assert elapsed >= 1.0, "Retry-After: 1 was not honoured"
            if kind == "stall":
                assert elapsed < hub.stall_s, "the stall was waited out instead of timed out"
        hub.inject("api", "reset", "503")
        info = c.get(f"{hub.url}/api/datasets/{REPO}/revision/main").json()
    assert info["sha"] == hub.sha
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data: hub ")]
    assert len(lines) == len(FAULTS) + 2 and all("retry 1/3" in line or "retry 2/3" in line for line in lines)
    assert [s.fault for s in hub.reads("row_group", clean=False)] == [f for k in FAULTS for f in (k, None)]


def test_after_its_budget_a_request_fails_naming_itself_and_its_last_status(hub):
    with client(retries=2) as c:
        hub.inject("row_group", "503", times=100)
        with pytest.raises(HubReadError) as err:
            c.get(resolve_url(hub, FILE), headers={"Range": row_group_range(hub, FILE, 3)})
        assert err.value.status == "HTTP 503" and err.value.attempts == 3 and FILE in err.value.url
        assert len(hub.reads("row_group", clean=False)) == 3  # the first try and 2 retries, no more
        hub.clear()
        hub.inject("row_group", "stall", times=100)
        t0 = time.perf_counter()
        with pytest.raises(HubReadError, match=r"no answer for 0.5 s"):
            c.get(resolve_url(hub, FILE), headers={"Range": row_group_range(hub, FILE, 3)})
        assert time.perf_counter() - t0 < 3 * 0.5 + 1.0  # three bounded attempts, never the stall's length
        hub.clear()
        r = c.get(resolve_url(hub, "sample/10BT/no_such_file.parquet"))
        assert r.status_code == 404 and len(hub.log) == 1  # not transient: no retry


def read_through_the_real_clients(hub: StandInHub, tmp_path, *reads: dict) -> dict:
    """Each of `reads` (`data.hub` keys over the stand-in's sample-10BT) in one worker process."""
    hub_keys = {"subset": SUBSET, "retry_wait_s": 0.01, "retry_max_wait_s": 0.05, "timeout_s": 0.5}
    spec = {
        "reads": [{"source": REPO, "hub": {**hub_keys, **fields}} for fields in reads],
        "local": local_copy({path: f.data for path, f in hub.files.items()}, tmp_path / "local"),
    }
    proc = run_python(["tests/data/hub_worker.py", json.dumps(spec)], hub_env(hub, tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(proc.stdout.splitlines()[-1]), "stderr": proc.stderr}


@pytest.mark.slow
def test_the_real_clients_read_the_hub_dataset_as_the_local_files_through_every_fault_kind(hub, tmp_path):
    """`datasets` resolves the config and `huggingface_hub` reads each row group with one ranged
    request, through each kind of fault on every read path (the card, the repository's info and
    tree; footers; row groups): the documents equal the same parquet files read locally, in the
    same order, and each fault costs one retry and one log line. A resolution that fails past its
    budget is one line naming the request and its last status."""
    hub.retry_after_s = 0  # honouring it is timed above; here it would only add seconds
    hub.inject("api", *[k for k in FAULTS if k != "short"])
    hub.inject("footer", *FAULTS)
    hub.inject("row_group", *FAULTS)
    outage = "stand-in-outage"  # a revision whose every request fails: the second read
    hub.inject("api", "500", times=100, where=lambda s: outage in s.path)
    out = read_through_the_real_clients(hub, tmp_path, {}, {"revision": outage, "retries": 1})
    injected = 3 * len(FAULTS) - 1
    assert out["reads"][0] == {"documents": 36, "equal": True}
    assert hub.pending_faults() == 100 - 2  # every transient fault was met; the outage's first request twice
    assert out["retries"] == injected + 1
    assert sum(line.startswith("data: hub ") for line in out["stderr"].splitlines()) == injected + 1
    # Each row group was read whole once (plus its faulted attempts), each footer once: nothing twice.
    groups = [(s.file, s.row_group) for s in hub.reads("row_group")]
    assert sorted(groups) == [(f"sample/10BT/{k:03d}_00000.parquet", g) for k in range(3) for g in range(6)]
    assert sorted(s.file for s in hub.reads("footer")) == [f"sample/10BT/{k:03d}_00000.parquet" for k in range(3)]
    assert not any("CC-MAIN" in (s.file or "") for s in hub.log)  # another config's file is never opened
    # The stand-in's routes are exactly those the clients called (an unknown one fails every test here).
    assert set(hub.routes) == {"HEAD resolve", "GET resolve", "GET cdn", "GET info", "GET tree", "GET tree recursive"}
    error = out["reads"][1]["error"]
    assert "\n" not in error and "could not be resolved" in error and "HTTP 500 after 2 attempts" in error
