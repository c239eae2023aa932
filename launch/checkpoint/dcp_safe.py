"""Reading `torch.distributed.checkpoint` directories without running code from them.

DCP's `FileSystemReader.read_metadata` unpickles `.metadata` with plain `pickle.load`, and its
default planner loads non-tensor entries with `torch.load(weights_only=False)`: a crafted file can
run a command. Here the metadata goes through an unpickler that resolves only the classes DCP
metadata is made of (an allow-list), and non-tensor entries through `weights_only=True`. A file
that names anything else is refused with one line.
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Collection
from typing import IO, Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner itself uses
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem

_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}
ALLOWED: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint._extension": {"ExtensionRegistry", "StreamTransformExtension"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"} | _DTYPES,
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file names something a DCP metadata file never holds."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"DCP metadata refers to {module}.{name}, which DCP never writes: "
            "refusing to load it (the file was modified or is not a checkpoint)"
        )


def load_metadata(stream: IO[bytes] | io.IOBase) -> Metadata:
    """`.metadata` as DCP reads it, through the allow-list."""
    metadata = _MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"DCP metadata holds a {type(metadata).__name__}, not Metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_metadata(stream)
        storage = getattr(metadata, "storage_meta", None)
        if storage is None:
            storage = metadata.storage_meta = StorageMeta()
        storage.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    def __init__(self, optional_state: Collection[str] = ()) -> None:
        """`optional_state`: optimizer state keys (leaves of `optim.state.<param>.`) that a checkpoint may
        lack, having been written before they existed; those entries keep the values they were given."""
        super().__init__()
        self.optional_state = set(optional_state)

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        saved = self.metadata.state_dict_metadata
        for key in [k for k in self.state_dict if k not in saved and self._optional(k)]:
            del self.state_dict[key]
        return super().create_local_plan()

    def _optional(self, key: str) -> bool:
        return key.startswith("optim.state.") and key.rsplit(".", 1)[-1] in self.optional_state

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        # Non-tensor entries (optimizer hyperparameters, names) are plain Python values.
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def dcp_load(
    state: dict[str, Any], directory: str, *, no_dist: bool = False, optional_state: Collection[str] = ()
) -> None:
    """`torch.distributed.checkpoint.load` of `state` from `directory`, without unpickling code.
    `no_dist`: this process reads alone (no collective), whatever process group exists;
    `optional_state`: optimizer state keys an older checkpoint may lack (SafeLoadPlanner)."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "assuming a single process": intended where no group exists
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        planner = SafeLoadPlanner(optional_state)
        dcp.load(state, storage_reader=SafeFileSystemReader(directory), planner=planner, no_dist=no_dist)
