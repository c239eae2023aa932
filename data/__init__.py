from data.errors import DataError
from data.loader import PackedLoader, build_val_set, encode_documents
from data.stream import iter_documents, open_dataset
from data.tokenizer import TextTokenizer, load_tokenizer

__all__ = ["DataError", "PackedLoader", "build_val_set", "encode_documents", "iter_documents",
           "open_dataset", "TextTokenizer", "load_tokenizer"]
