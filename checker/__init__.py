"""batchcheck: prove or refute properties of LLM-serving batch schedulers before canary."""

__version__ = "0.4.0"
