"""Ollama's fixes for the failures its own messages name: environment variables and model options
(envconfig/config.go, api/types.go), not server flags."""

from __future__ import annotations

from oomguard.failures import FailureClass, Fix, Hits


def build(cls: FailureClass, n: dict, facts: dict, hits: Hits | None, why: str = "") -> tuple[str, list[Fix]]:
    cause = hits.best.describe(n) if hits and hits.best else f"Ollama failed ({cls.words})."
    fixes = {
        FailureClass.OOM_WEIGHTS_LOAD: [
            Fix("a smaller quantization (a :q4_K_M tag) or a smaller model needs less memory",
                action="pull a smaller tag of the model"),
            Fix("one sequence at a time keeps one KV cache", "OLLAMA_NUM_PARALLEL", 1),
            Fix("a shorter context shrinks the KV cache", action="lower num_ctx (/set parameter num_ctx 4096)")],
        FailureClass.OOM_RUNTIME: [
            Fix("one model at a time leaves its memory to it", "OLLAMA_MAX_LOADED_MODELS", 1),
            Fix("a shorter context shrinks the KV cache", action="lower num_ctx")],
        FailureClass.KV_CACHE_TOO_SMALL: [
            Fix("the KV cache is num_ctx x parallel sequences", action="raise num_ctx or lower OLLAMA_NUM_PARALLEL")],
        FailureClass.CONTEXT_TOO_LONG: [
            Fix("the prompt must fit num_ctx", action="raise num_ctx (within the model's context) or shorten it")],
        FailureClass.MODEL_ACCESS: [
            Fix("the model must be in the local store under that name", action="ollama pull MODEL (check the tag "
                                                                               "with ollama list)")],
        FailureClass.ENGINE_BUG: [
            Fix("a newer Ollama knows newer models and carries the runner's fixes",
                action="upgrade Ollama (curl -fsSL https://ollama.com/install.sh | sh, or the desktop app's update)"),
            Fix("the server log names the cause", action="read `journalctl -u ollama` or ~/.ollama/logs/server.log")],
        FailureClass.CONNECTION: [
            Fix("the client must reach the server", action="start `ollama serve`; from a container use "
                                                           "host.docker.internal or OLLAMA_HOST=0.0.0.0")],
    }.get(cls, [Fix("the server log names the cause", action="read `journalctl -u ollama` or ~/.ollama/logs/server.log")])
    return cause, fixes
