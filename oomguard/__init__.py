"""oomguard: predict, diagnose and prevent GPU out-of-memory failures of LLM inference servers."""

__version__ = "0.1.0"
