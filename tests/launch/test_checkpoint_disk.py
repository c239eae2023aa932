"""The checkpointer's collective agreement reads the temporary directory only on a failure: on
several ranks, rank 0's publish renames `.tmp_step_N/` away while the others may still be in the
same stage (a 2-rank FSDP2 run used to die there one save in ~20 with FileNotFoundError)."""

from __future__ import annotations

import errno

import pytest
import torch

from launch.checkpoint import checkpointer as ck
from launch.checkpoint import disk
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


def test_a_failed_first_save_says_it_needs_more_than_it_wrote_and_what_is_free(tmp_path, monkeypatch):
    """No earlier checkpoint to size it by: the line says the save needs more than it wrote, and
    the free space counts the temporary directory it removes (issue 32: "needs ~0.06 GiB" was
    what the failed save had written of a 0.078 GiB checkpoint)."""
    tmp = tmp_path / ".tmp_step_00000003"
    tmp.mkdir()
    (tmp / "rank0.pt").write_bytes(b"x" * 3 * 2**20)
    monkeypatch.setattr(disk, "free_bytes", lambda path: 2**20)
    full = OSError(28, "No space left on device", str(tmp / "rank0.pt"))
    with pytest.raises(ck.SaveError) as err:
        ck.Checkpointer(tmp_path, ENV, [], {})._agree(full, 3, 0, None, tmp)
    assert str(err.value) == (
        f"checkpoint step 3 not written: no space left on {disk.mount_point(tmp_path)} (needs more than the "
        "3.0 MiB it wrote before failing; 4.0 MiB free); no earlier checkpoint"
    )
    assert not tmp.exists()  # removed by rank 0 on the failure


def test_a_failed_save_is_sized_by_the_checkpoint_before_it(tmp_path, monkeypatch):
    latest = tmp_path / "step_00000002"
    latest.mkdir()
    (latest / "model.safetensors").write_bytes(b"x" * 5 * 2**20)
    monkeypatch.setattr(disk, "free_bytes", lambda path: 3 * 2**30)
    full = OSError(28, "No space left on device")
    line = disk.describe_failure(full, tmp_path, disk.dir_bytes(latest), 2**20, latest)
    assert line == (
        f"no space left on {disk.mount_point(tmp_path)} (needs ~5.0 MiB, the size of step 2; 3.00 GiB free); "
        f"step 2 ({latest}) is the latest intact"
    )


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


@pytest.mark.parametrize(
    "code, what", [(errno.EROFS, "is on a read-only file system"), (errno.EACCES, "is not writable")]
)
def test_a_checkpoint_directory_it_cannot_write_is_named_with_the_fix(tmp_path, code, what):
    """A read-only file system or no permission: the line names the checkpoints directory (not the
    mount point it is on) and what to do."""
    root = tmp_path / "checkpoints"
    err = OSError(code, "refused", str(root / ".tmp_step_00000002"))
    line = disk.describe_failure(err, root, 0, 0, None)
    assert line == f"{root} {what}" + (" (permission denied)" if code == errno.EACCES else "") + (
        "; make it writable, or give the run a run.dir where it can write; no earlier checkpoint"
    )
