"""The data-source registry: every `data.source` value is claimed by one source or refused in one
line that names the known ones; each source checks its own part of the `data:` section."""

from __future__ import annotations

import pytest

from data import DataError
from data.sources.hub import Hub
from data.sources.local import LocalFiles
from data.sources.registry import SOURCES, build_catalog, source_of
from data.sources.tokens import TokenShards
from launch.config import ConfigError
from launch.plan import load_config
from tests.conftest import data_config
from tests.helpers import TINY


def test_an_unknown_source_is_one_line_naming_the_known_ones():
    with pytest.raises(DataError) as err:
        data_config(source="fineweb-edu")  # a bare name once went to the Hub, and failed there
    line = str(err.value)
    assert "\n" not in line and line.startswith("data.source='fineweb-edu' is not a known data source")
    for source in SOURCES:
        assert (source.listed_as or ", ".join(source.names)) in line
    assert "owner/name" in line and "set data.source to one of them" in line
    with pytest.raises(ConfigError, match="is not a known data source"):
        load_config(TINY, ["data.source=jsonl"])


def test_each_value_goes_to_its_source(tmp_path):
    assert isinstance(source_of(data_config(source="auto")), LocalFiles)
    assert isinstance(source_of(data_config(source="parquet")), LocalFiles)
    assert isinstance(source_of(data_config(source="HuggingFaceFW/fineweb-edu", data_files=[])), Hub)
    assert isinstance(source_of(data_config(source=str(tmp_path), data_files=[])), Hub)  # a local hub layout
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text("{}")
    assert isinstance(source_of(data_config(source="auto", data_files=[str(shards)])), TokenShards)
    assert isinstance(source_of(data_config(source="tokens", data_files=[str(shards)])), TokenShards)
    assert source_of(data_config()).reads_hub is False and Hub.reads_hub is True


def test_a_source_checks_its_own_config_on_construction(tmp_path):
    with pytest.raises(DataError, match="data.source=tokens needs data.data_files = \\[the directory"):
        data_config(source="tokens", data_files=[str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(DataError, match="has no text catalog"):  # token ids: nothing to tokenise or catalog
        build_catalog(data_config(source="tokens", data_files=[str(tmp_path)]))
