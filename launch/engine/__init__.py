"""Training engines: one class per backend behind one interface (`launch.engine.base.Engine`), and the
parallelism they apply from outside the model."""
