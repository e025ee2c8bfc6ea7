"""Checkpoints from the Hugging Face hub (the optional `hub` extra), cached on disk so they plan offline afterwards.

huggingface_hub makes every request, so HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, its proxies and its timeouts
(HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT) apply as they do to vLLM itself. What is fetched: config.json, the
separate quantization config some checkpoints keep (read where vLLM reads it), and the tensor dtypes and shapes from
the safetensors headers (`get_safetensors_metadata`), which give the exact weight bytes. The cache holds one JSON per
checkpoint in the catalog's own shape, under $OOMGUARD_HUB_CACHE (default ${OOMGUARD_CACHE:-~/.cache/oomguard}/hub).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

from oomguard.cache import cache_root
from oomguard.errors import UsageError

# safetensors dtype -> bytes per element (safetensors' Dtype enum)
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "U32": 4, "U64": 8, "F4": 0.5, "F6_E2M3": 0.75,
                "F6_E3M2": 0.75}
# quantization configs kept beside config.json; vLLM reads them when config.json has no quantization_config
# (vllm/model_executor/model_loader/weight_utils.py get_quant_config, each method's get_config_filenames)
_QUANT_FILES = ("hf_quant_config.json", "quantize_config.json", "quant_config.json")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class HubError(UsageError):
    """The hub answered, or failed to, in a way that leaves the checkpoint unknown; one line says why."""

    def __init__(self, message: str, *, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable   # True: the hub could not be asked (offline, timeout), not a "no" from it


def cache_dir() -> Path:
    return Path(os.environ.get("OOMGUARD_HUB_CACHE") or cache_root() / "hub").expanduser()


def is_repo_id(model_id: str) -> bool:
    return bool(_REPO_ID.match(model_id)) and ".." not in model_id


def _cache_file(model_id: str) -> Path:
    return cache_dir() / (model_id.replace("/", "--", 1) + ".json")


def cached(model_id: str) -> dict | None:
    """The cached entry for `model_id`, or None (never fetched, or the file is unreadable)."""
    if not is_repo_id(model_id):
        return None
    try:
        entry = json.loads(_cache_file(model_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("config"), dict) else None


def available() -> bool:
    """huggingface_hub is installed and not told to stay offline."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    from importlib.util import find_spec

    return find_spec("huggingface_hub") is not None


def fetch(model_id: str) -> dict:
    """Ask the hub for `model_id`, cache what it says and return the entry; HubError with one line otherwise."""
    from huggingface_hub import get_hf_file_metadata, get_safetensors_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.utils import EntryNotFoundError

    if not is_repo_id(model_id):
        raise HubError(f"{model_id!r} is not a Hugging Face repository id (OWNER/NAME)")
    with _hub_errors(model_id):
        # one request without retries first: an unreachable hub or an unknown repo answers at once, where
        # hf_hub_download would back off five times (about 25 s) before saying so
        get_hf_file_metadata(hf_hub_url(model_id, "config.json"))
        config = _read_json(hf_hub_download(model_id, "config.json"), model_id, "config.json")
        if not isinstance(config.get("quantization_config"), dict):
            for name in _QUANT_FILES:
                try:
                    quant = _read_json(hf_hub_download(model_id, name), model_id, name)
                except EntryNotFoundError:
                    continue
                config["quantization_config"] = _as_quantization_config(name, quant)
                break
        weights, weights_note = None, "no safetensors weights on the hub"
        try:
            weights = safetensors_bytes(get_safetensors_metadata(model_id))
            weights_note = "exact, from the safetensors headers"
        except Exception as exc:   # noqa: BLE001 - a repo without safetensors still plans from its config
            if _is_connection_error(exc):
                raise
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    entry = {"id": model_id, "source_url": f"{endpoint}/{model_id}", "config": config,
             "safetensors_total_bytes": weights, "weights_note": weights_note}
    _write_cache(model_id, entry)
    return entry


def safetensors_bytes(meta) -> int:
    """Exact tensor bytes of a checkpoint from huggingface_hub's SafetensorsRepoMetadata."""
    total = (meta.metadata or {}).get("total_size")
    if isinstance(total, int) and total > 0:
        return total
    return int(sum(math.prod(t.shape) * _DTYPE_BYTES.get(t.dtype, 2)
                   for f in meta.files_metadata.values() for t in f.tensors.values()))


def _as_quantization_config(name: str, quant: dict) -> dict:
    """A separate quantization file in the shape config.json's quantization_config has (what vLLM builds from it)."""
    if name == "hf_quant_config.json":   # NVIDIA ModelOpt: {"quantization": {"quant_algo": "FP8", ...}}
        inner = quant.get("quantization") if isinstance(quant.get("quantization"), dict) else quant
        return {"quant_method": "modelopt", "quant_algo": inner.get("quant_algo", ""),
                "ignore": inner.get("exclude_modules") or []}
    if "quant_method" in quant:
        return quant
    return {**quant, "quant_method": "awq" if "w_bit" in quant else "gptq"}   # AutoAWQ vs AutoGPTQ file shapes


def _read_json(path: str, model_id: str, name: str) -> dict:
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HubError(f"{model_id}'s {name} from the hub is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise HubError(f"{model_id}'s {name} from the hub is not a JSON object")
    return value


def _write_cache(model_id: str, entry: dict) -> None:
    """Atomically, so a concurrent plan never reads half a file; a cache that cannot be written only costs a refetch."""
    target = _cache_file(model_id)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=target.parent, delete=False,
                                         suffix=".tmp") as f:
            json.dump(entry, f)
        os.replace(f.name, target)
    except OSError:
        pass


def _is_connection_error(exc: BaseException) -> bool:
    from huggingface_hub.utils import LocalEntryNotFoundError, OfflineModeIsEnabled

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (LocalEntryNotFoundError, OfflineModeIsEnabled, TimeoutError, ConnectionError)) or \
                type(seen).__name__.endswith(("Timeout", "TimeoutException", "ConnectError", "NetworkError")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _hub_errors:
    """Turns huggingface_hub's exceptions into one HubError line each."""

    def __init__(self, model_id: str):
        self.model_id = model_id

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, HubError):
            return False
        from huggingface_hub.utils import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                           RepositoryNotFoundError, RevisionNotFoundError)

        m = self.model_id
        if _is_connection_error(exc):
            raise HubError(f"the Hugging Face hub could not be reached for {m} ({_reason(exc)})",
                           unreachable=True) from None
        if isinstance(exc, GatedRepoError):
            raise HubError(f"{m} is gated on the Hugging Face hub: accept its licence on its page and log in "
                           "(`hf auth login`, or HF_TOKEN), or pass its config.json with --model-config PATH") from None
        if isinstance(exc, RepositoryNotFoundError):
            raise HubError(f"no repository {m} on the Hugging Face hub (check the spelling; a private one needs "
                           "HF_TOKEN)") from None
        if isinstance(exc, RevisionNotFoundError):
            raise HubError(f"{m}: the revision asked for does not exist on the hub") from None
        if isinstance(exc, EntryNotFoundError):
            raise HubError(f"{m} has no config.json on the hub (a GGUF-only or adapter repository? plan the .gguf "
                           "file itself, or its base model)") from None
        if isinstance(exc, HfHubHTTPError):
            raise HubError(f"the Hugging Face hub refused {m}: {_reason(exc)}") from None
        if isinstance(exc, Exception):
            raise HubError(f"the Hugging Face hub lookup of {m} failed: {_reason(exc)}", unreachable=True) from None
        return False


def _reason(exc: BaseException) -> str:
    while exc.__cause__ is not None and not str(exc).strip():
        exc = exc.__cause__
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
