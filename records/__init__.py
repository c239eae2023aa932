"""Run records (a run directory, a sweep's plan), read back by one set of rules: the layer below the
launcher and the report, importing neither."""
