"""Ollama: the table of its user-visible messages (messages.json) for `oomguard diagnose`."""
