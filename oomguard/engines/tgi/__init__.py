"""Hugging Face text-generation-inference (TGI): its user-visible messages (messages.json), the launcher's startup
phases (signatures.py) and its fixes in TGI's flag spellings (fixes.py), for `oomguard diagnose`."""
