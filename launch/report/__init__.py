"""The comparison report's old home: it is the `report` package now (python -m report)."""
