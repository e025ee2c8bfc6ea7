"""What the tests and benchmarks run against, kept out of the shipped package (pyproject finds `oomguard*` only).

- `testsupport.upstream`: the fake OpenAI-compatible engine (raw asyncio; in-process or `python -m`)
- `testsupport.llamacpp`: a real llama-server built from the llama-cpp-python sdist, its process wrapper, and
  the tiny random-weight GGUF it serves
- `testsupport.hub`: a local stand-in for the Hugging Face hub's file endpoints

Imported from the repository root: pytest puts it on the path (pyproject `pythonpath`), `python -m` from the root
does, and the benchmarks add the root themselves.
"""
