"""vLLM's fixes for each failure class, computed from the numbers a log shows and vLLM's own rules.

Each builder takes the numbers read from the messages (`n`), the startup facts of the log, and the messages that
matched (`hits`), and returns the cause in one sentence and the ordered fixes, in vLLM's flag spellings.
diagnose/rules.py ranks the findings; llama.cpp's fixes live in engines/llamacpp/fixes.py.
"""

from __future__ import annotations

import json
import math

from oomguard.failures import FailureClass, Fix, Hits

DEFAULT_UTILIZATION = 0.9   # vLLM's default when the log does not say its version (0.92 from 0.20)
SAFETY_GIB = 0.5            # kept free below another process's memory when sizing gpu_memory_utilization

def size(gib: float) -> str:
    """GiB as a person reads it: '1.24 GiB', '4 MiB'."""
    return f"{gib:.2f} GiB" if gib >= 0.1 else f"{gib * 1024:.0f} MiB"


def floor2(x: float) -> float:
    return math.floor(x * 100 + 1e-9) / 100


def first_number(*values):
    for value in values:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def version_of(facts: dict) -> tuple[int, int, int] | None:
    text = facts.get("vllm_version")
    if not text:
        return None
    try:
        from oomguard.engines.vllm.versions import parse_version
        return parse_version(text)
    except Exception:
        return None


def default_utilization(facts: dict) -> float:
    version = version_of(facts)
    if version is None:
        return DEFAULT_UTILIZATION
    from oomguard.engines.vllm.releases import release
    return release(version).gpu_memory_utilization


def tp_candidates(divide: int, gpus: int | None, current: int | None = None) -> list[int]:
    """TP sizes that divide `divide` and fit the GPU count: powers of two first, largest first."""
    limit = gpus or current or 8
    sizes = [d for d in range(1, min(divide, limit) + 1) if divide % d == 0]
    if current:
        sizes = [d for d in sizes if d != current] or sizes
    return sorted(sizes, key=lambda d: (d & (d - 1) != 0, -d))


def utilization_for(free_gib: float, total_gib: float) -> float | None:
    """The largest gpu_memory_utilization (2 decimals) whose budget fits in the free memory, with a margin."""
    if not total_gib or free_gib is None:
        return None
    value = floor2((free_gib - min(SAFETY_GIB, 0.1 * free_gib)) / total_gib)
    return value if value >= 0.01 else None


def kv_too_small(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    max_len = first_number(n.get("max_model_len"), facts.get("max_model_len"))
    est = first_number(n.get("estimated_max_model_len"))
    needed, avail = first_number(n.get("needed_gib")), first_number(n.get("available_gib"))
    kv_tokens = first_number(n.get("kv_tokens"))
    fixes: list[Fix] = []
    if est:
        fixes.append(Fix("vLLM's own estimate of the longest context the KV cache holds", "--max-model-len", int(est)))
    elif kv_tokens:
        fixes.append(Fix(f"the KV cache stores {kv_tokens:,} tokens; one request of max_model_len must fit in it",
                         "--max-model-len", int(kv_tokens)))
    elif max_len and needed and avail and avail > 0:
        # the GiB figures are printed rounded to 0.01: take the pessimistic end of each
        value = int(max_len * (avail - 0.005) / (needed + 0.005)) // 16 * 16
        if value > 0:
            fixes.append(Fix(f"{avail} of the {needed} GiB one request needs is available: scaled down from "
                             f"{max_len:,} (vLLM did not print its estimate)", "--max-model-len", value))
    total = first_number(facts.get("total_gpu_memory_gib"))
    util = first_number(facts.get("gpu_memory_utilization")) or default_utilization(facts)
    if needed and avail is not None and total:
        raise_to = math.ceil((util + (needed - avail) / total) * 100) / 100 + 0.01
        if raise_to <= 0.95:
            fixes.append(Fix(f"gives the KV cache the missing {needed - avail:.2f} GiB (of a {total} GiB GPU) if that "
                             "memory is free", "--gpu-memory-utilization", round(raise_to, 2)))
    if str(facts.get("kv_cache_dtype", "auto")) in ("auto", "None"):
        fixes.append(Fix("an fp8 KV cache stores twice the tokens in the same memory (small accuracy cost)",
                         "--kv-cache-dtype", "fp8"))
    fixes.append(Fix("more GPUs split the KV cache (and the weights) between them",
                     action="raise --tensor-parallel-size if more GPUs are available"))
    summary = "The KV cache cannot hold one request of max_model_len"
    if max_len:
        summary += f" ({max_len:,} tokens"
        summary += f", {needed} GiB needed vs {avail} GiB available per GPU)" if needed and avail is not None else ")"
    elif kv_tokens:
        summary += f" (it holds {kv_tokens:,} tokens)"
    return summary + ".", fixes


def no_cache_blocks(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    blocks, seqs = first_number(n.get("mamba_blocks")), first_number(n.get("max_num_seqs"))
    if blocks is not None and seqs:
        return mamba_blocks_short(int(blocks), int(seqs), facts)
    util = first_number(facts.get("gpu_memory_utilization"))
    total = first_number(facts.get("total_gpu_memory_gib"))
    weights = first_number(facts.get("weights_gib"))
    fixes: list[Fix] = []
    if weights and total and weights >= 0.85 * total:
        fixes.append(Fix(f"the weights ({weights} GiB) alone nearly fill the {total} GiB GPU: split them",
                         "--tensor-parallel-size", 2))
    target = None
    if weights and total:
        other = first_number(facts.get("activation_peak_gib"), 0) + first_number(facts.get("non_torch_gib"), 0)
        target = math.ceil((weights + other + 1.0) / total * 100) / 100
        if target > 0.95:
            target = None
    if target is None and (util is None or util < 0.9):
        target = default_utilization(facts) if util is None or util < default_utilization(facts) else None
    if target and (util is None or target > util):
        fixes.append(Fix("leaves room for at least a small KV cache after weights and activations",
                         "--gpu-memory-utilization", target))
    batched = first_number(facts.get("max_num_batched_tokens"))
    fixes.append(Fix("a smaller prefill batch lowers the activation peak vLLM reserves",
                     "--max-num-batched-tokens", max(512, int(batched // 2)) if batched else 2048))
    fixes.append(Fix("a quantized checkpoint (AWQ/GPTQ/FP8) or a smaller model frees memory for the KV cache",
                     action="use a quantized checkpoint or more GPUs (--tensor-parallel-size)"))
    summary = "Nothing was left for the KV cache after weights, activations and non-torch memory"
    if util:
        summary += f" (gpu_memory_utilization {util})"
    return summary + ".", fixes


def mamba_blocks_short(blocks: int, seqs: int, facts: dict) -> tuple[str, list[Fix]]:
    """A hybrid model's cache holds fewer Mamba state blocks than --max-num-seqs (config/compilation.py
    resolve_cudagraph_mode_and_sizes): every running sequence holds one."""
    fixes = [Fix(f"every running sequence of a hybrid model holds one Mamba state block, and the cache has {blocks:,}",
                 "--max-num-seqs", max(1, blocks))]
    util, default = first_number(facts.get("gpu_memory_utilization")), default_utilization(facts)
    if util is not None and util < default:   # raised only from a value the log shows, to the release's default
        fixes.append(Fix(f"a larger cache holds more state blocks (to keep {seqs:,} sequences)",
                         "--gpu-memory-utilization", default))
    fixes.append(Fix("a shorter context leaves more of the cache for state blocks",
                     action="lower --max-model-len to what requests need"))
    return (f"The KV cache holds {blocks:,} Mamba state blocks, fewer than max_num_seqs ({seqs:,}): each running "
            "sequence of a hybrid model needs one."), fixes


def gpu_in_use(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    free, total = first_number(n.get("free_gib")), first_number(n.get("total_gib"), facts.get("total_gpu_memory_gib"))
    other = first_number(n.get("other_total_gib"))
    requested = first_number(n.get("requested_gib"))
    if free is None and other is not None and total:
        free = total - other
    fixes: list[Fix] = []
    util = utilization_for(free, total) if free is not None and total else None
    if util:
        held = total - free
        fixes.append(Fix(f"fits in the {free:.2f} GiB free of {total:.2f} GiB ({held:.2f} GiB is held by another "
                         f"process), with {SAFETY_GIB} GiB to spare", "--gpu-memory-utilization", util))
    elif "initial_gib" in n:
        fixes.append(Fix("vLLM measures memory by difference; another process changing its usage breaks that",
                         action="run vLLM on a GPU (or container) no other process uses while it starts"))
    fixes.append(Fix("see who holds the memory, then stop it or move vLLM to another GPU",
                     action="nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"))
    fixes.append(Fix("an old vLLM or notebook process often still holds the GPU",
                     action="stop leftover processes (a previous vLLM, a Jupyter kernel) or pick a free GPU with "
                            "CUDA_VISIBLE_DEVICES"))
    if util is not None and util < 0.25 and len(fixes) > 1:
        fixes.insert(0, fixes.pop(1))  # so little is free that freeing the GPU comes before shrinking vLLM
    if free is not None and total:
        summary = f"Another process holds {total - free:.2f} of {total:.2f} GiB on this GPU"
        if requested:
            summary += f", so the {requested} GiB that gpu_memory_utilization asks for is not free"
    elif other:
        summary = f"Other processes hold {other:.2f} GiB of this GPU"
    else:
        summary = "GPU memory held by another process changed or blocked vLLM's startup"
    return summary + ".", fixes


def oom_weights(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    fixes: list[Fix] = []
    if str(facts.get("dtype", "")).lower() in ("float32", "float"):
        fixes.append(Fix("the model runs in float32 (4 bytes a parameter); half precision halves the weights",
                         "--dtype", "half" if cc_below_8(facts) else "bfloat16"))
    gpus = first_number(facts.get("gpu_count"))
    tp = first_number(facts.get("tensor_parallel_size")) or 1
    planned, total = n.get("planned_weights_gib"), first_number(n.get("total_gib"), facts.get("total_gpu_memory_gib"))
    if planned and total:
        # the planner's weights per GPU at the current size: the smallest power of two that leaves a fifth of each
        # GPU for activations and the KV cache
        need = int(tp)
        while planned * tp / need > 0.8 * total and need < 64:
            need *= 2
        fixes.append(Fix(f"{planned * tp:.0f} GiB of weights over {need} GPUs is {planned * tp / need:.1f} GiB each, "
                         f"which leaves room on a {total:.0f} GiB GPU", "--tensor-parallel-size", need))
    elif gpus and gpus > tp:
        fixes.append(Fix(f"splits the weights over the {int(gpus)} GPUs", "--tensor-parallel-size",
                         1 << (int(gpus).bit_length() - 1)))
    else:
        fixes.append(Fix("splits the weights over twice as many GPUs (if you have them)", "--tensor-parallel-size",
                         int(tp) * 2))
    weights = first_number(facts.get("weights_gib"), planned)
    tried, free = first_number(n.get("tried_gib")), first_number(n.get("free_gib"))
    if weights and total:
        offload = math.ceil(weights - 0.8 * total) if weights > 0.8 * total else None
    elif tried is not None and free is not None:
        offload = max(1, math.ceil(tried - free + 1))
    else:
        offload = None
    fixes.append(Fix("a 4-bit (AWQ/GPTQ) or FP8 checkpoint needs a quarter / half of the memory",
                     action="use a quantized checkpoint (AWQ/GPTQ 4-bit, or FP8 on compute capability >= 8.9)"))
    if offload:
        fixes.append(Fix("keeps that many GiB of weights in CPU memory (slower, but it starts)", "--cpu-offload-gb",
                         offload))
    summary = "The model's weights do not fit in GPU memory"
    if total:
        summary += f" ({total:.2f} GiB GPU"
        summary += f", {size(free)} free when {size(tried)} more was needed)" if free is not None and tried else ")"
    return summary + ".", fixes


def cc_below_8(facts: dict) -> bool:
    try:
        return float(facts.get("compute_capability", 9)) < 8.0
    except (TypeError, ValueError):
        return False


def oom_profile(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    fixes: list[Fix] = []
    dummy = first_number(n.get("dummy_requests"))
    seqs = first_number(facts.get("max_num_seqs"))
    graph = "graph" in why or "captur" in why
    if dummy:
        value = max(1, 1 << (int(dummy // 2).bit_length() - 1)) if dummy >= 2 else 1
        fixes.append(Fix(f"vLLM warms the sampler up with max_num_seqs ({int(dummy)}) requests at once",
                         "--max-num-seqs", value))
    if graph:
        fixes.append(Fix("skips CUDA graph capture (and its memory); decoding gets slower", "--enforce-eager", True))
    batched = first_number(facts.get("max_num_batched_tokens"))
    fixes.append(Fix("the profile run's activation peak grows with the tokens of one step",
                     "--max-num-batched-tokens", max(512, int(batched // 2)) if batched else 2048))
    if not dummy:
        fixes.append(Fix("fewer sequences per step shrink the warm-up batches and the captured graphs",
                         "--max-num-seqs", max(1, int(seqs // 2)) if seqs else 128))
    if not graph:
        fixes.append(Fix("CUDA graph capture needs memory outside the KV budget in older vLLM", "--enforce-eager",
                         True))
    util = first_number(facts.get("gpu_memory_utilization"))
    if util and util > 0.9:
        fixes.append(Fix("leaves room for memory vLLM does not budget (graphs, NCCL, the sampler)",
                         "--gpu-memory-utilization", 0.9))
    if fragmented(n):
        fixes.insert(0, Fix(f"{n['reserved_unallocated_gib']:.2f} GiB is reserved by PyTorch but unallocated "
                            "(fragmentation)", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"))
    summary = "vLLM ran out of memory during startup " + ("CUDA graph capture" if graph else "profiling/warm-up")
    if why:
        summary += f" ({why})"
    return summary + ".", fixes


def fragmented(n: dict) -> bool:
    """PyTorch holds enough cached-but-unused memory that, with what is free, the failed request would have fit."""
    unalloc = n.get("reserved_unallocated_gib")
    return bool(unalloc and unalloc >= 0.5 and unalloc + (n.get("free_gib") or 0.0) >= (n.get("tried_gib") or 0.0))


def oom_runtime(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    fixes: list[Fix] = []
    if fragmented(n):
        fixes.append(Fix(f"{n['reserved_unallocated_gib']:.2f} GiB is reserved by PyTorch but unallocated "
                         "(fragmentation)", "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"))
    util = first_number(facts.get("gpu_memory_utilization")) or default_utilization(facts)
    total = first_number(n.get("total_gib"), facts.get("total_gpu_memory_gib"))
    tried, free = first_number(n.get("tried_gib")), \
        first_number(n.get("free_gib"), 0.0)
    if total and tried:
        lower = floor2(util - (tried - free) / total - 0.02)
        if 0.3 <= lower < util:
            fixes.append(Fix(f"leaves the {size(tried)} the failed allocation needed outside vLLM's budget",
                             "--gpu-memory-utilization", lower))
    else:
        fixes.append(Fix("leaves headroom outside vLLM's budget for runtime allocations", "--gpu-memory-utilization",
                         round(util - 0.05, 2)))
    seqs = first_number(facts.get("max_num_seqs"))
    fixes.append(Fix("fewer requests per step lower the activation and logits peak", "--max-num-seqs",
                     max(1, int(seqs // 2)) if seqs else 128))
    batched = first_number(facts.get("max_num_batched_tokens"))
    fixes.append(Fix("smaller prefill chunks lower the per-step peak (long prompts)", "--max-num-batched-tokens",
                     max(512, int(batched // 2)) if batched else 2048))
    if not fragmented(n):
        fixes.append(Fix("avoids fragmentation of PyTorch's cache", "PYTORCH_CUDA_ALLOC_CONF",
                         "expandable_segments:True"))
    summary = "The server ran out of GPU memory while serving"
    if tried and total:
        summary += f" (it needed {size(tried)} more on a {total:.2f} GiB GPU)"
    return summary + (f"; {why}" if why and "serving" not in why else "") + ".", fixes


def tensor_parallel(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    heads = first_number(n.get("num_attention_heads"), n.get("numerator"))
    tp = first_number(n.get("tensor_parallel_size"), n.get("denominator"), facts.get("tensor_parallel_size"))
    seen = {int(x["num_attention_heads"]) for x in (hits.all_numbers if hits else ())
            if isinstance(x.get("num_attention_heads"), int)}
    if len(seen) > 1:  # several attempts (or models) in one log: a size that divides every one of them
        heads = math.gcd(*seen)
    gpus = first_number(facts.get("gpu_count"))
    fixes: list[Fix] = []
    ids = _signature_ids(hits)
    if heads:
        shown = "/".join(map(str, sorted(seen))) if len(seen) > 1 else str(int(heads))
        sizes = tp_candidates(int(heads), int(gpus) if gpus else None, int(tp) if tp else None)
        if sizes:
            others = ", ".join(map(str, sizes[1:5]))
            fixes.append(Fix(f"divides the {shown} heads" + (f" and fits the {int(gpus)} GPUs" if gpus else "")
                             + (f" (also valid: {others})" if others else ""), "--tensor-parallel-size", sizes[0]))
        fixes.append(Fix("or keep the layout and split layers instead of heads",
                         action="use --pipeline-parallel-size for the GPUs that TP cannot use"))
        shown = "/".join(map(str, sorted(seen))) if len(seen) > 1 else str(int(heads))
        summary = f"tensor_parallel_size {int(tp) if tp else '?'} does not divide the model's {shown} " \
                  "attention heads" if "numerator" not in n else \
                  f"A model dimension ({int(heads)}) is not divisible by tensor_parallel_size {int(tp) if tp else '?'}"
        return summary + ".", fixes
    if ids & {"ray.pending_placement_groups", "ray.autoscaler_no_node_type", "ray.pg_cannot_fit"}:
        # Ray's own scheduler: the GPUs it counts are the joined nodes', not this machine's
        fixes.append(Fix("Ray places the workers only on GPUs of nodes that joined the cluster",
                         action="run `ray status` on the head node; start the missing workers (ray start "
                                "--address=HEAD:6379) or lower --tensor-parallel-size x --pipeline-parallel-size to "
                                "the GPUs it lists (per node for tensor parallelism)"))
        return _cause(hits, n, "Ray cannot place the engine's workers on the cluster's GPUs."), fixes
    if ids & {"vllm.ray_not_enough_gpus", "vllm.pg_required_gpus", "vllm.pg_timeout", "vllm.ray_required"}:
        if gpus:
            fixes.append(Fix(f"the machine has {int(gpus)} GPUs", "--tensor-parallel-size",
                             1 << (int(gpus).bit_length() - 1)))
        fixes.append(Fix("TP x PP must not exceed the GPUs vLLM can see",
                         action="check nvidia-smi -L and CUDA_VISIBLE_DEVICES; set --tensor-parallel-size to that "
                                "count"))
        return "tensor_parallel_size x pipeline_parallel_size asks for more GPUs than vLLM can see.", fixes
    if "vllm.tp_gt_experts" in ids and n.get("num_experts"):
        fixes.append(Fix("expert parallelism splits experts instead", "--enable-expert-parallel", True))
    fixes.append(Fix("a smaller power of two usually divides every dimension", "--tensor-parallel-size",
                     max(1, int(tp) // 2) if tp and tp > 1 else 2))
    return _cause(hits, n, "The tensor-parallel layout does not fit the model or the GPUs."), fixes


def context(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    max_len = first_number(n.get("max_model_len"), facts.get("max_model_len"), facts.get("n_ctx"))
    prompt = first_number(n.get("prompt_tokens"), n.get("prompt_tokens_b"), n.get("prompt_tokens_c"),
                          n.get("prompt_tokens_d"))
    completion = first_number(n.get("completion_tokens"), n.get("completion_tokens_b"), n.get("completion_tokens_c"))
    requested = first_number(n.get("requested_tokens"))
    if requested and prompt is None and completion is None:
        prompt = None
    derived = first_number(n.get("derived_max_model_len"))
    fixes: list[Fix] = []
    if derived:
        fixes.append(Fix("the model's own context limit (max_position_embeddings)", "--max-model-len", int(derived)))
        fixes.append(Fix("only if the model really handles longer contexts (RoPE scaling)",
                         "VLLM_ALLOW_LONG_MAX_MODEL_LEN", 1))
        return f"--max-model-len {max_len} is above the model's limit of {derived} tokens.", fixes
    if max_len and prompt is not None and prompt < max_len:
        fixes.append(Fix(f"prompt ({prompt:,}) + max_tokens must fit in max_model_len {max_len:,}: set it in the "
                         "request", "max_tokens", int(max_len - prompt)))
    need = (prompt or 0) + (completion or 0) or requested
    if need and max_len and need > max_len:
        fixes.append(Fix(f"the request needs {need:,} tokens; only if the model and the KV cache allow it",
                         "--max-model-len", int(math.ceil(need / 1024) * 1024)))
    fixes.append(Fix("keep requests inside the context", action="truncate or summarise the prompt/history before "
                                                                  "sending, and cap max_tokens"))
    if hits and any(s.startswith("llamacpp.") for s in hits.signatures):
        fixes.insert(0, Fix("llama-server splits -c over --parallel slots; each slot gets -c / --parallel tokens",
                            action="raise -c (--ctx-size) or lower --parallel"))
    if "http.openai_400" in _signature_ids(hits) and prompt is None and need is None:   # a status line, no numbers
        fixes.insert(0, Fix("the server put its reason in the response body", action="read the 400 response's JSON "
                                                                                     "(its message names the check)"))
        return _cause(hits, n, ""), fixes
    summary = "The request is longer than the context the server allows"
    if max_len:
        summary += f" (max_model_len {max_len:,}"
        summary += f"; prompt {prompt:,}" if prompt is not None else ""
        summary += f" + {completion:,} completion" if completion else ""
        summary += f"; {requested:,} requested" if requested and not completion else ""
        summary += ")"
    return summary + ".", fixes


def chat_template(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    ids = _signature_ids(hits)
    fixes: list[Fix] = []
    if ids & {"tok.enum", "tok.class"}:
        fixes.append(Fix("tokenizer.json / tokenizer_config.json need a newer tokenizers/transformers",
                         action="pip install -U transformers tokenizers"))
    if "vllm.tool_choice" in ids:
        fixes.append(Fix("tool calls need both flags", "--enable-auto-tool-choice", True))
        fixes.append(Fix("the parser that matches the model family (e.g. hermes, llama3_json, mistral)",
                         "--tool-call-parser", "hermes"))
    if "vllm.mistral_tokenizer" in ids:
        fixes.append(Fix("Mistral-format checkpoints ship their tokenizer in mistral_common format",
                         "--tokenizer-mode", "mistral"))
    if ids & {"tpl.roles", "tpl.system_role"}:
        fixes.append(Fix("this template only takes alternating user/assistant turns",
                         action="merge the system prompt into the first user turn and alternate roles, or pass a "
                                "template that accepts them with --chat-template"))
    fixes.append(Fix("a base model or a fine-tune without a template needs one", "--chat-template",
                     "./template.jinja"))
    fixes.append(Fix("a fine-tune that lost its tokenizer files can use the base model's", "--tokenizer",
                     "<base model id>"))
    return _cause(hits, n, "The tokenizer or chat template failed."), fixes


def connection(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    ids = _signature_ids(hits)
    fixes: list[Fix] = []
    if "http.wrong_path" in ids:
        fixes.append(Fix("vLLM's OpenAI routes live under /v1", action="set base_url to http://HOST:PORT/v1"))
    if "http.proxy_env" in ids or "http.bad_gateway" in ids or "http.502" in ids:
        fixes.append(Fix("an HTTP proxy variable routes local requests through the proxy", "NO_PROXY",
                         "localhost,127.0.0.1"))
    if "http.addr_in_use" in ids:
        fixes.append(Fix("another process has the port", "--port", 8001))
    if "openai.api_key" in ids:
        fixes.append(Fix("the OpenAI client insists on a key; any string works unless --api-key is set",
                         action='OpenAI(base_url="http://HOST:PORT/v1", api_key="EMPTY")'))
    if ids & {"http.server_401", "openai.auth"}:   # the server answered: reaching it is not the problem
        fixes.append(Fix("the server checks a key (--api-key or VLLM_API_KEY set where it runs)",
                         action='send it: OpenAI(base_url="http://HOST:PORT/v1", api_key="<the server\'s key>") or '
                                '-H "Authorization: Bearer <key>"'))
        fixes.append(Fix("a key exported in a shell profile is easy to miss", action="run `env | grep VLLM_API_KEY` "
                                                                                     "where the server starts, and "
                                                                                     "unset it if unintended"))
        return _cause(hits, n, "The server refused the request's API key."), fixes
    if "node.econnrefused" in ids:
        fixes.append(Fix("a server bound to 127.0.0.1 is unreachable from a container or another host",
                         action="bind it to 0.0.0.0 (vllm serve --host 0.0.0.0; OLLAMA_HOST=0.0.0.0)"))
    fixes.append(Fix("the port opens only after weights load, memory is profiled and graphs are captured",
                     action="wait until `curl -sf http://HOST:PORT/health` returns 200 before sending requests"))
    fixes.append(Fix("a crashed engine also shows up as refused or dropped connections",
                     action="read the server log for the first ERROR (run oomguard diagnose on it)"))
    if ids & {"httpx.read_timeout", "openai.timeout", "http.504"}:
        fixes.append(Fix("long generations outlast default client timeouts", action="raise the client timeout "
                                                                                     "(e.g. OpenAI(timeout=600))"))
    return _cause(hits, n, "The client could not reach the server."), fixes


def dtype(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    ids = _signature_ids(hits)
    fixes: list[Fix] = []
    if ids & {"vllm.bf16_cc", "bf16.generic", "vllm.fa_ampere", "triton.arch"} or cc_below_8(facts) or \
            ("compute_capability" in n and below_8(n["compute_capability"])):
        fixes.insert(0, Fix("compute capability below 8.0 has no bfloat16; float16 works", "--dtype", "half"))
    if ids & {"cuda.no_kernel", "torch.sm_incompatible"}:
        fixes.append(Fix("the installed wheels were not built for this GPU's architecture",
                         action="install a vLLM/PyTorch build that supports this GPU (check `python -c \"import "
                                "torch; print(torch.cuda.get_arch_list())\"`)"))
    if not fixes:
        fixes.append(Fix("float16 runs on every CUDA GPU vLLM supports", "--dtype", "half"))
    return _cause(hits, n, "The GPU does not support this data type."), fixes


def below_8(value) -> bool:
    try:
        v = float(value)
        return v < 8.0 if v < 20 else v < 80
    except (TypeError, ValueError):
        return False


def quantization(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    ids = _signature_ids(hits)
    fixes: list[Fix] = []
    if "vllm.quant_capability" in ids:   # the kernels, not the dtype: another checkpoint is the fix
        need = n.get("required_capability")
        fixes.append(Fix(f"this GPU (capability {n.get('compute_capability', '?')}) has no kernels for the method"
                         + (f" (it needs {need})" if need else ""),
                         action="use a checkpoint whose method runs here (GPTQ/AWQ from 7.5, FP8 with Marlin from "
                                "8.0), the unquantized model, or a newer GPU"))
    if "vllm.quant_mismatch" in ids and n.get("model_quantization"):
        fixes.append(Fix("the checkpoint's own method; or drop --quantization and let vLLM read it",
                         "--quantization", str(n["model_quantization"]).strip()))
    if "vllm.quant_dtype" in ids:
        supported = str(n.get("supported", ""))
        value = "half" if "float16" in supported and "bfloat16" not in supported.replace("float16", "", 1) else \
            ("bfloat16" if "bfloat16" in supported else "half")
        fixes.append(Fix(f"the {n.get('quantization', '')} kernels take {supported}", "--dtype", value))
    if "vllm.bnb_load_format" in ids:
        fixes.append(Fix("bitsandbytes needs both", "--quantization", "bitsandbytes"))
        fixes.append(Fix("bitsandbytes needs both", "--load-format", "bitsandbytes"))
    if "vllm.quant_config_missing" in ids or "vllm.quant_unknown" in ids or not fixes:
        fixes.append(Fix("vLLM reads the method from the checkpoint's quantization_config",
                         action="drop --quantization (or match it to the checkpoint's quantization_config)"))
    fixes.append(Fix("a checkpoint made for vLLM avoids loader mismatches",
                     action="use a checkpoint quantized with a method vLLM supports (AWQ, GPTQ, FP8, "
                            "compressed-tensors)"))
    return _cause(hits, n, "The quantization settings do not match the checkpoint."), fixes


_SHARED_MEMORY_IDS = {"nccl.shm", "nccl.shm_dev", "bus.error", "ray.small_shm"}
# the ranks' rendezvous and process groups over the network: which interface, which address, which port
_NETWORK_IDS = {"torch.socket_listen", "nccl.socket", "gloo.loopback", "gloo.full_mesh", "c10d.client_timeout",
                "c10d.client_connect", "c10d.server_bind"}


def nccl(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    ids = _signature_ids(hits)
    fixes: list[Fix] = []
    shared_memory, network = ids & _SHARED_MEMORY_IDS, ids & _NETWORK_IDS
    if shared_memory:
        fixes.append(Fix("NCCL needs shared memory between the GPU processes; Docker's default /dev/shm is 64 MB",
                         action="run the container with --ipc=host or --shm-size=16g"))
    if network:
        fixes.append(Fix("the ranks bind to the interface the host name resolves to, loopback included",
                         "GLOO_SOCKET_IFNAME", "<the interface that reaches the other nodes, e.g. eth0>"))
        fixes.append(Fix("NCCL picks its own interface the same way", "NCCL_SOCKET_IFNAME",
                         "<the same interface>"))
        fixes.append(Fix("the other ranks must reach the master's address and port", action="check that the "
                         "address is routable from every node and the port open (firewall, security group)"))
    if not (shared_memory or network):   # the transport between the GPUs themselves
        fixes.append(Fix("peer-to-peer transfers fail or hang on many PCIe/consumer/virtualised setups",
                         "NCCL_P2P_DISABLE", 1))
        fixes.append(Fix("vLLM's custom all-reduce also uses P2P; NCCL's own is the safe fallback",
                         "--disable-custom-all-reduce", True))
    fixes.append(Fix("shows which transport failed", "NCCL_DEBUG", "INFO"))
    return _cause(hits, n, "Communication between the GPUs (NCCL) failed."), fixes


def model_access(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    ids = _signature_ids(hits)
    fixes: list[Fix] = []
    gated = bool(ids & {"hf.gated", "hf.gated_text", "hf.restricted", "hf.restricted_b", "hf.auth", "hf.401",
                        "hf.403", "hf.invalid_token", "hf.token_hint"})
    if gated or not ids & {"hf.offline", "hf.local_entry", "hf.disk_cache", "llamacpp.gguf_open",
                           "llamacpp.gguf_bounds", "hf.no_config", "hf.repo_id", "hf.revision"}:
        fixes.append(Fix("gated models need a token from an account that accepted the license", "HF_TOKEN",
                         "<your hf_... token>"))
        fixes.append(Fix("access is granted per account", action="accept the model's license on its Hugging Face "
                                                                  "page with the token's account"))
    if ids & {"hf.offline", "hf.local_entry", "hf.disk_cache"}:
        fixes.append(Fix("download once where the hub is reachable, then serve from the cache or a directory",
                         action="huggingface-cli download MODEL, then serve the local path (HF_HUB_OFFLINE=1)"))
    if ids & {"hf.no_config", "hf.repo_not_found", "hf.repo_not_found_text", "hf.not_identifier", "hf.repo_id",
              "hf.incorrect_path", "llamacpp.gguf_open"}:
        fixes.append(Fix("a typo, a private repo, or a relative path that does not exist where the server runs",
                         action="check the model id/path (and --revision)"))
    if "llamacpp.gguf_bounds" in ids:
        fixes.append(Fix("the file is shorter than its header says", action="download the GGUF again and check "
                                                                            "its checksum"))
    return _cause(hits, n, "The model could not be fetched or read."), fixes


# an engine defect's workaround, by the messages that show where it is
_ENGINE_WORKAROUNDS: tuple[tuple[frozenset[str], Fix], ...] = (
    (frozenset({"torch.dynamo", "torch.backend_compiler", "torch.inductor", "triton.compile"}),
     Fix("skips torch.compile and CUDA graphs, where the failure is", "--enforce-eager", True)),
    (frozenset({"vllm.custom_all_reduce_cuda_call"}),
     Fix("tensor parallelism then all-reduces through NCCL instead of vLLM's CUDA IPC buffers",
         "--disable-custom-all-reduce", True)),
    (frozenset({"vllm.get_ip_dns"}),
     Fix("vLLM then skips resolving an outside host name to find its own address", "VLLM_HOST_IP",
         "<this host's IP address>")),
)


def engine_bug(n: dict, facts: dict, hits: Hits | None = None, why: str = "") -> tuple[str, list[Fix]]:
    ids = _signature_ids(hits)
    fixes = [fix for shown_by, fix in _ENGINE_WORKAROUNDS if ids & shown_by]
    version = facts.get("vllm_version")
    fixes.append(Fix("this is a defect in the engine, not your configuration",
                     action=f"upgrade vLLM{f' (running {version})' if version else ''}, or pin the last release "
                            "that worked"))
    fixes.append(Fix("maintainers need the full log", action="search/report it on the engine's issue tracker "
                                                             "with this log"))
    if hits and hits.best and hits.best.kind != "bug":   # a release too old for the model: no defect to report
        return hits.best.describe(n), [Fix("a newer release implements it", action="upgrade the engine"
                                              + (f" (running vLLM {version})" if version else ""))]
    return _cause(hits, n, "The engine hit an internal error.") + " This is the engine's bug, not your " \
                                                                  "configuration.", fixes


def _signature_ids(hits: Hits | None) -> set[str]:
    return set(hits.signatures) if hits else set()


def _cause(hits: Hits | None, n: dict, default: str) -> str:
    """The surest message's cause with the numbers read filled in, or `default`."""
    return hits.best.describe(n) if hits and hits.best else default


BUILDERS = {
    FailureClass.KV_CACHE_TOO_SMALL: kv_too_small, FailureClass.NO_CACHE_BLOCKS: no_cache_blocks,
    FailureClass.GPU_MEMORY_IN_USE: gpu_in_use, FailureClass.OOM_WEIGHTS_LOAD: oom_weights,
    FailureClass.OOM_PROFILING_OR_GRAPH: oom_profile, FailureClass.OOM_RUNTIME: oom_runtime,
    FailureClass.TP_MISCONFIG: tensor_parallel, FailureClass.CONTEXT_TOO_LONG: context,
    FailureClass.TOKENIZER_CHAT_TEMPLATE: chat_template, FailureClass.CONNECTION: connection,
    FailureClass.DTYPE_CAPABILITY: dtype, FailureClass.QUANTIZATION_MISMATCH: quantization, FailureClass.NCCL: nccl,
    FailureClass.MODEL_ACCESS: model_access, FailureClass.ENGINE_BUG: engine_bug,
}


_MEMORY = {FailureClass.KV_CACHE_TOO_SMALL, FailureClass.NO_CACHE_BLOCKS, FailureClass.OOM_PROFILING_OR_GRAPH,
           FailureClass.OOM_RUNTIME, FailureClass.OOM_WEIGHTS_LOAD}


def feature_fixes(facts: dict) -> tuple[list[Fix], str]:
    """What the log's LoRA, speculative-decoding, multimodal and swap settings cost, as fixes, and a note when a
    setting cannot help (engines/vllm/lora.py, speculative.py, offload.py size them)."""
    args = facts.get("non_default_args") or {}
    fixes: list[Fix] = []
    note = ""
    if args.get("enable_lora"):
        loras, rank = args.get("max_loras") or 1, args.get("max_lora_rank") or 16
        if loras > 1:
            fixes.append(Fix(f"every GPU preallocates max_loras ({loras}) adapter slots in each layer",
                             "--max-loras", max(1, loras // 2)))
        elif rank > 8:
            fixes.append(Fix(f"the adapter slots are max_lora_rank ({rank}) wide in every layer", "--max-lora-rank",
                             max(8, rank // 2)))
    spec = args.get("speculative_config")
    if isinstance(spec, dict):
        k = spec.get("num_speculative_tokens")
        if spec.get("method") not in ("ngram", "suffix") and k:
            lighter = {**spec, "method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4}
            lighter.pop("model", None)
            fixes.append(Fix("the drafter's weights and attention layers share the GPU with the target; n-gram "
                             "speculation needs neither", "--speculative-config",
                             json.dumps(lighter, separators=(",", ":"))))
        fixes.append(Fix("speculative decoding's drafter and its rejection-sampler warm-up take memory the target "
                         "could use", action="drop --speculative-config if the KV cache matters more than latency"))
    limits = args.get("limit_mm_per_prompt")
    if isinstance(limits, dict) and any((v.get("count", 1) if isinstance(v, dict) else v) > 1
                                        for v in limits.values()):
        fixes.append(Fix("vLLM profiles the vision encoder with the most items a prompt may carry",
                         "--limit-mm-per-prompt", json.dumps({k: 1 for k in limits}, separators=(",", ":"))))
    if args.get("swap_space"):
        note = (" --swap-space is CPU memory for preempted requests: raising it adds no GPU KV capacity.")
    return fixes, note


# a message that points elsewhere for its cause ("see root cause above"): the engine process's own lines hold it
_PASTE_ENGINE_LOG = Fix("the engine process's own lines name the cause", action="paste the log from the first ERROR "
                        "of the engine process (EngineCore, or a worker) to the end")


def build(cls: FailureClass, n: dict, facts: dict, hits: Hits | None, why: str = "") -> tuple[str, list[Fix]]:
    """The cause and the fixes for one finding."""
    builder = BUILDERS.get(cls)
    if builder is None:   # a known message of no class oomguard fixes (no GPU visible, an ECC error): its cause
        return _cause(hits, n, "Unrecognised failure."), [_PASTE_ENGINE_LOG] if cls is FailureClass.UNKNOWN else []
    cause, fixes = builder(n, facts, hits, why)
    if cls in _MEMORY:
        extra, note = feature_fixes(facts)
        fixes = fixes[:1] + extra + fixes[1:]
        cause += note
    return cause, fixes

