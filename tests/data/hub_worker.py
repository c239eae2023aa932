"""The reading side of the stand-in-Hub tests, run as its own process with `HF_ENDPOINT` pointing at
the stand-in (`huggingface_hub` and `datasets` read their endpoint when imported): every document
of the hub dataset through the project's data path (`datasets` resolution, `hf://` row groups), the
same parquet files read locally, and one JSON line saying how each read compares (or its error).

    python tests/data/hub_worker.py '{"reads": [{data: section}, ...], "local": "DIR/*.parquet"}'
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data import DataConfig, DataError, iter_documents  # noqa: E402
from data.hub_http import retry_count  # noqa: E402
from data.sources.registry import read_data_section  # noqa: E402


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # the retry lines, on stderr
    spec = json.loads(sys.argv[1])
    local = [t for _, t in iter_documents(DataConfig(source="parquet", data_files=[spec["local"]]))]
    reads: list[dict] = []
    for fields in spec["reads"]:
        try:
            hub = [t for _, t in iter_documents(read_data_section(fields))]
            reads.append({"documents": len(hub), "equal": hub == local})
        except DataError as err:
            reads.append({"error": str(err)})
    print(json.dumps({"reads": reads, "retries": retry_count()}))


if __name__ == "__main__":
    main()
