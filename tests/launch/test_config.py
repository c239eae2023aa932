"""Config loading: YAML + dotted overrides, typed, with one-line errors naming the key."""

from __future__ import annotations

import pytest

from launch.config import parse_overrides
from launch.errors import ConfigError
from launch.plan import load_config
from tests.conftest import ROOT

TINY = str(ROOT / "configs/tiny.yaml")


def test_yaml_and_overrides_resolve_to_typed_values():
    cfg = load_config(
        TINY,
        [
            "optim.name=adamw",
            "optim.lr=2e-3",
            "train.max_steps=7",
            "optim.betas=[0.8, 0.9]",
            "model.preset=125m",
            "data.seq_len=128",
        ],
    )
    assert cfg.optim.name == "adamw" and cfg.optim.lr == 2e-3 and cfg.train.max_steps == 7
    assert cfg.optim.betas == [0.8, 0.9] and cfg.model.preset == "125m"
    assert isinstance(cfg.optim.lr, float)


def test_ints_become_floats_but_not_the_reverse():
    assert load_config(TINY, ["optim.lr=1"]).optim.lr == 1.0
    with pytest.raises(ConfigError, match="'train.max_steps' must be int"):
        load_config(TINY, ["train.max_steps=1.5"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lrr=1", "unknown config key 'optim.lrr'"),
        ("trainer.max_steps=1", "unknown config key 'trainer'"),
        ("optim.lr=-1", "optim.lr must be a finite number > 0"),
        ("optim.lr=0", "optim.lr must be a finite number > 0"),
        ("optim.lr=inf", "must be a finite number"),
        ("optim.lr=.nan", "must be a finite number"),
        ("train.tokens_per_step=0", "train.tokens_per_step must be >= 1"),
        ("train.tokens_per_step=64", "at least one window"),
        ("run.keep_checkpoints=-1", "run.keep_checkpoints"),
        ("optim.lr=fast", "'optim.lr' must be float"),
        ("optim.muon.r_min=6", "optim.muon.r_min"),
        ("optim.weight_decay=-0.1", "optim.weight_decay must be >= 0"),
        ("train.tokens_per_step=1000", "multiple of data.seq_len"),
        ("data.val_tokens=100", "data.val_tokens"),
        ("parallel.backend=tpu", "parallel.backend must be one of"),
        ("train.dtype=fp8", "train.dtype"),
        ("optim", "must look like section.key=value"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(TINY, [override])
    assert "\n" not in str(err.value)


def test_a_quoted_number_is_told_to_drop_its_quotes_and_a_word_is_not():
    with pytest.raises(ConfigError) as quoted:
        load_config(TINY, ["train.ckpt_every='50'"])
    assert (
        str(quoted.value) == "config key 'train.ckpt_every' must be int, got str '50' (write the number without quotes)"
    )
    for word in ("train.ckpt_every=abc", "optim.lr=fast"):
        with pytest.raises(ConfigError) as err:
            load_config(TINY, [word])
        assert "quotes" not in str(err.value) and "got str" in str(err.value), word


@pytest.mark.parametrize(
    "override, key, hint",
    [
        ("optim.nmae=adamw", "optim.nmae", "did you mean 'optim.name'?"),
        ("train.max_step=3", "train.max_step", "did you mean 'train.max_steps'?"),
        ("trainer.max_steps=1", "trainer", "did you mean 'train'?"),  # a section
        ("parallel.backnd=ddp", "parallel.backnd", "did you mean 'parallel.backend'?"),
    ],
)
def test_an_unknown_key_names_the_closest_valid_one(override, key, hint):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, [override])
    message = str(err.value)
    assert message.startswith(f"unknown config key '{key}'") and hint in message and "\n" not in message, message


def test_an_unknown_key_like_none_gets_no_guess():
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["optim.zzzzzz=1"])
    assert "did you mean" not in str(err.value) and "name" in str(err.value)  # the valid keys, still listed


def test_missing_or_malformed_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layer: 2\noptim: [1, 2\ntrain:\n  max_steps: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(bad))
    # The file, where PyYAML found the problem (the `:` of `train:`) and what it was reading (the `[`).
    assert str(err.value) == (
        f"config file '{bad}' is not valid YAML at line 4, column 6: did not find expected ',' or ']' "
        "(while parsing a flow sequence at line 3, column 8)"
    )
    bad.write_text("train:\n  max_steps: 3\n log_every: 1\n")
    with pytest.raises(ConfigError, match=r"at line 3, column 2: did not find expected key"):
        load_config(str(bad))


def test_override_parsing_keeps_strings_and_nests():
    assert parse_overrides(["run.dir=/tmp/x", "a.b.c=true"]) == {"run": {"dir": "/tmp/x"}, "a": {"b": {"c": True}}}


def test_one_path_where_a_list_is_expected():
    cfg = load_config(TINY, ["data.data_files=assets/corpus/fineweb_edu_sample10BT_first150.jsonl"])
    assert cfg.data.data_files == ["assets/corpus/fineweb_edu_sample10BT_first150.jsonl"]


def test_a_smaller_step_than_the_logical_shards_fit_names_the_value_that_works():
    """tiny.yaml's 16 shards with a quick try's 4 windows per step: the line says which
    data.logical_shards (or tokens per step) works, and that value does."""
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["train.tokens_per_step=512"])
    line = str(err.value)
    assert "set data.logical_shards=4 " in line and "train.tokens_per_step to a multiple of 2048" in line, line
    load_config(TINY, ["train.tokens_per_step=512", "data.logical_shards=4"])
