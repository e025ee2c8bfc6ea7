"""What marks a log as Ollama's even where none of its own messages (messages.json) is in it: the paths of the
llama.cpp it vendors, which ggml's CUDA error lines print ("CUDA error 2 at /go/src/github.com/jmorganca/ollama/llm/
llama.cpp/ggml-cuda.cu:8001: out of memory"; Windows builds "C:\\a\\ollama\\ollama\\llm\\..."), and its server's
start line (server/routes.go Serve)."""

from __future__ import annotations

ENGINE_MARKERS: tuple[str, ...] = (
    "github.com/ollama/ollama/",
    "github.com/jmorganca/ollama/",
    "\\ollama\\ollama\\",
    "/ollama/ml/backend/",
    "msg=\"listening on",
)

# The runner's placement and the host's memory, as the server logs them before it starts a runner
# (llm/server.go NewLlamaServer "offload", "system memory"; one key per pattern, since journald wraps the long line)
import re as _re  # noqa: E402

_SIZE = r"(?P<v>[\d.]+ ?[KMGT]?i?B)"
_SIZES = r'="\[(?P<v>[^\]]{0,200})\]'   # one size per GPU
FACTS: tuple[tuple[str, str, _re.Pattern], ...] = tuple((name, needle, _re.compile(rx, _re.I)) for name, needle, rx in (
    ("ollama_layers_model", "layers.model=", r"layers\.model=(?P<v>\d+)"),
    ("ollama_layers_offload", "layers.offload=", r"layers\.offload=(?P<v>\d+)"),
    ("ollama_vram_available", "memory.available=", r"memory\.available" + _SIZES),
    ("ollama_required_full", "memory.required.full=", r'memory\.required\.full="' + _SIZE),
    ("ollama_required_allocations", "memory.required.allocations=", r"memory\.required\.allocations" + _SIZES),
    ("ollama_ram_free", 'msg="system memory"', r'msg="system memory" total="[^"]*" free="' + _SIZE),
    ("ollama_swap_free", "free_swap=", r'free_swap="' + _SIZE),
))
