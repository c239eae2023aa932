"""Keys of the earlier config format (every family's, schedule's and source's settings flat in their
section, records/config_keys.py) read where they live now, one line each; a run directory written
in that format reads as this one records it."""

from __future__ import annotations

import tarfile

import pytest
import yaml

from launch.config import read_config, recorded
from launch.errors import ConfigError
from launch.nested import flatten
from launch.plan import load_config
from orscale.cbp_spec import CBPOptions
from orscale.lion import LionOptions
from orscale.muon_spec import MuonOptions
from orscale.schedule import WSDOptions
from records.config_keys import MOVED
from tests.helpers import ROOT, SMALL, TINY

LADDER = ROOT / "docs/results/cpu_ladder/run_logs.tar.xz"


def test_a_key_of_the_earlier_format_is_read_where_it_lives_now_and_said_once():
    cfg = load_config(TINY, [*SMALL, "optim.name=cbp", "optim.cbp_zeta=0.01", "optim.betas=[0.9,0.999]"])
    assert cfg.optim.own(CBPOptions).zeta == 0.01
    assert cfg.optim.own(CBPOptions).betas == [0.9, 0.999] and cfg.optim.betas == [0.9, 0.999]  # as the one key was
    assert [n for n in cfg.notes if n.startswith("config key")] == [
        "config key 'optim.cbp_zeta' is now 'optim.cbp.zeta' (read as that; write it so)",
        "config key 'optim.betas' also set 'optim.cbp.betas' (its own key now; write that)",
    ]
    wsd = load_config(TINY, [*SMALL, "optim.schedule=wsd", "optim.decay_steps=7", "optim.ns_dtype=fp32"])
    assert wsd.optim.own(WSDOptions).decay_steps == 7 and wsd.optim.own(MuonOptions).ns_dtype == "fp32"
    # a new key wins over the old one it replaces
    both = read_config(TINY, ["optim.cbp_zeta=0.5", "optim.cbp.zeta=0.25"])
    assert both.optim.own(CBPOptions).zeta == 0.25


def test_an_optimizer_with_options_of_its_own_keeps_them_to_itself():
    """Lion's betas are its own (the paper's 0.9/0.99 by default), AdamW's stay AdamW's."""
    cfg = load_config(TINY, [*SMALL, "optim.name=lion", "optim.lion.betas=[0.95,0.98]"])
    assert cfg.optim.own(LionOptions).betas == [0.95, 0.98] and cfg.optim.betas == [0.9, 0.95]
    assert load_config(TINY, [*SMALL, "optim.name=lion"]).optim.own(LionOptions).betas == [0.9, 0.99]
    with pytest.raises(ConfigError, match=r"^optim\.lion\.betas must be two numbers in \[0, 1\), got \[1\.5, 0\.9\]$"):
        load_config(TINY, [*SMALL, "optim.name=lion", "optim.lion.betas=[1.5,0.9]"])
    with pytest.raises(
        ConfigError, match=r"^unknown config key 'optim\.lion\.beta'; did you mean 'optim\.lion\.betas'"
    ):
        load_config(TINY, [*SMALL, "optim.name=lion", "optim.lion.beta=[0.9,0.99]"])


def test_a_run_directory_of_the_earlier_format_reads_as_this_one_records_it():
    """A config.yaml of the committed CPU ladder (the earlier format): every setting keeps its value at
    the key that holds it now, only the run's own components' sub-sections are kept, and reading it
    again changes nothing."""
    with tarfile.open(LADDER) as archive:
        name = next(n for n in archive.getnames() if n.endswith("orscale_lm/lr0.001-alr0.064-seed0/config.yaml"))
        old = yaml.safe_load(archive.extractfile(name).read())  # type: ignore[union-attr]
    now = recorded(old)
    flat_old, flat_now = flatten(old), flatten(now)
    sections = {k.rsplit(".", 1)[0] for k in flat_now}
    for key, value in flat_old.items():
        kept = [k for k in MOVED.get(key, (key,)) if k.rsplit(".", 1)[0] in sections]  # not another component's
        assert all(flat_now[k] == value for k in kept) and (kept or key in MOVED), key
    assert set(now["optim"]) >= {"muon"} and not {"cbp", "lamb", "lars", "lion", "wsd"} & set(now["optim"])
    assert now["optim"]["muon"]["ns_dtype"] == "fp32" and now["data"]["val_batch_size"] == 32
    assert recorded(now) == now


@pytest.mark.parametrize("path", sorted(str(p) for p in (ROOT / "configs").glob("*.yaml")))
def test_every_shipped_config_writes_its_keys_where_they_live(path: str) -> None:
    """A config of this repository reads without a note of a moved key (the paper's configs set the
    Hub's subset in data.hub)."""
    assert read_config(path).notes == ()
