"""The dataset repository the stand-in Hub (`tests/hub_server.py`) serves: laid out like
HuggingFaceFW/fineweb-edu (its card's configs, `sample/10BT/*.parquet`, a `data/<dump>/` folder of
another config), holding real FineWeb-Edu text from `assets/corpus`. FineWeb-Edu's other columns
did not survive into the bundled sample; they are filled with values that say they are stand-ins.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import CORPUS
from tests.helpers import ROOT, env
from tests.hub_server import StandInHub

REPO = "HuggingFaceFW/fineweb-edu"
SUBSET = "sample-10BT"
CARD = """---
license: odc-by
language:
- en
configs:
- config_name: default
  data_files:
  - split: train
    path: data/*/*
- config_name: sample-10BT
  data_files:
  - split: train
    path: sample/10BT/*
- config_name: CC-MAIN-2024-10
  data_files:
  - split: train
    path: data/CC-MAIN-2024-10/*
---
# FineWeb-Edu (stand-in)

Real FineWeb-Edu text (ODC-By 1.0, by Hugging Face) in the repository's layout, for tests.
"""


def fineweb_edu_texts(n: int) -> list[str]:
    with open(CORPUS[0]) as fh:
        return [json.loads(line)["text"] for _, line in zip(range(n), fh, strict=False)]


def _parquet(texts: list[str], first_id: int, rows_per_group: int) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(texts)
    table = pa.table(
        {
            "text": texts,
            "id": [f"<stand-in-{first_id + i}>" for i in range(n)],
            "dump": ["CC-MAIN-stand-in"] * n,
            "url": [f"https://stand-in.invalid/{first_id + i}" for i in range(n)],
            "file_path": ["stand-in"] * n,
            "language": ["en"] * n,
            "language_score": [0.0] * n,
            "token_count": pa.array([0] * n, pa.int64()),
            "score": [0.0] * n,
            "int_score": pa.array([0] * n, pa.int64()),
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=rows_per_group)
    return out.getvalue()


def fineweb_edu_files(files: int = 3, rows: int = 12, rows_per_group: int = 2) -> dict[str, bytes]:
    """The repository's files: the card, `files` parquet files of `rows` documents each under
    sample/10BT/, and one file of another config that sample-10BT must not read."""
    texts = fineweb_edu_texts(files * rows)
    out = {"README.md": CARD.encode(), ".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"}
    for k in range(files):
        out[f"sample/10BT/{k:03d}_00000.parquet"] = _parquet(texts[k * rows : (k + 1) * rows], k * rows, rows_per_group)
    out["data/CC-MAIN-2024-10/000_00000.parquet"] = _parquet(["not in sample-10BT"] * 4, 10_000, rows_per_group)
    return out


def local_copy(files: dict[str, bytes], root: Path) -> str:
    """The sample-10BT parquet files written under `root`; returns their glob for data.data_files."""
    for path, data in files.items():
        if path.startswith("sample/10BT/"):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
    return str(root / "sample/10BT/*.parquet")


def hub_env(hub: StandInHub, home: Path) -> dict[str, str]:
    """A test subprocess's environment that reaches the stand-in (and nothing else) as the Hub."""
    return {
        **env(),
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(home),  # a fresh cache: nothing is found there instead of asked for
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def hub_overrides(retries: int = 4, timeout_s: float = 0.5) -> list[str]:
    """data.* overrides for training from the stand-in with test-sized waits and timeouts."""
    return [
        f"data.source={REPO}",
        f"data.hub.subset={SUBSET}",
        f"data.hub.retries={retries}",
        "data.hub.retry_wait_s=0.01",
        "data.hub.retry_max_wait_s=0.05",
        f"data.hub.timeout_s={timeout_s}",
    ]


def run_python(args: list[str], environ: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout
    )
