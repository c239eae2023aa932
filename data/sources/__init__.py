"""The data sources, one file each, and their table (`data/sources/registry.py`, docs/data.md)."""
