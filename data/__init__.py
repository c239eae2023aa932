"""The data path: tokenizers, the document stream (hub or local files through `datasets`),
packing into training windows with an elastic per-shard state, the fixed validation set, and the
`data:` config section."""

from data.data_config import DataConfig
from data.errors import DataError
from data.loader import PackedLoader, build_val_set, encode_documents
from data.stream import iter_documents, open_dataset
from data.tokenizer import TextTokenizer, load_tokenizer

__all__ = ["DataConfig", "DataError", "PackedLoader", "build_val_set", "encode_documents", "iter_documents",
           "open_dataset", "TextTokenizer", "load_tokenizer"]
