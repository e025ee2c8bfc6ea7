"""A real llama-server for tests: `build` (from the llama-cpp-python sdist, cached), `server` (the process),
`tinymodel` (a tiny random-weight llama GGUF it can load)."""
