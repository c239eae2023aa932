"""The data path: the `data:` config section, its sources, the corpus read by piece, and the loader
that packs each rank's training windows and the fixed validation set (docs/data.md)."""

from data.data_config import DataConfig
from data.data_errors import DataError
from data.documents import Documents, TextDocuments, encode_documents
from data.loader import PackedLoader, build_val_set
from data.sources.registry import build_catalog, iter_documents, open_documents, read_texts
from data.tokenizer import TextTokenizer, load_tokenizer

__all__ = [
    "DataConfig",
    "DataError",
    "Documents",
    "PackedLoader",
    "TextDocuments",
    "TextTokenizer",
    "build_catalog",
    "build_val_set",
    "encode_documents",
    "iter_documents",
    "load_tokenizer",
    "open_documents",
    "read_texts",
]
