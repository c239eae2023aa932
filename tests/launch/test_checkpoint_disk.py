"""The checkpointer's collective agreement reads the temporary directory only on a failure: on
several ranks, rank 0's publish renames `.tmp_step_N/` away while the others may still be in the
same stage (a 2-rank FSDP2 run used to die there one save in ~20 with FileNotFoundError)."""

from __future__ import annotations

import pytest
import torch

from launch.checkpoint import checkpointer as ck
from launch.checkpoint.disk import dir_bytes
from launch.runtime.process_group import DistEnv

ENV = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="none")


def test_a_save_that_does_not_fail_never_walks_the_temporary_directory(tmp_path, monkeypatch):
    walked = []
    monkeypatch.setattr(ck, "dir_bytes", lambda path: walked.append(path.name) or 0)
    saver = ck.Checkpointer(tmp_path, ENV, [], {})
    saver.save(1, {})
    saver.save(2, {})  # the second also sizes the first, for its free-space warning
    assert walked == ["step_00000001"], walked  # never `.tmp_step_*`: another rank may be renaming it


def test_a_failed_stage_still_sizes_what_it_wrote(tmp_path):
    tmp = tmp_path / ".tmp_step_00000003"
    tmp.mkdir()
    (tmp / "rank0.pt").write_bytes(b"x" * 4096)
    full = OSError(28, "No space left on device", str(tmp / "rank0.pt"))
    with pytest.raises(ck.SaveError, match="not written: no space left on"):
        ck.Checkpointer(tmp_path, ENV, [], {})._agree(full, 3, 0, None, tmp)
    assert not tmp.exists()  # removed by rank 0 on the failure


def test_dir_bytes_skips_a_file_that_vanishes_while_it_counts(tmp_path, monkeypatch):
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"x" * 20)
    real_stat = type(tmp_path).stat

    def stat(self, *args, **kwargs):
        if self.name == "b":
            raise FileNotFoundError(str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(type(tmp_path), "stat", stat)
    assert dir_bytes(tmp_path) == 10
    assert dir_bytes(tmp_path / "missing") == 0
