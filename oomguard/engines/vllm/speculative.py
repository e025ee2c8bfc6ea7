"""Speculative decoding: what the drafter adds to each GPU at startup, per vLLM release.

- Weights (vllm/v1/worker/gpu_model_runner.py load_model -> drafter.load_model, inside the same memory profiler, so
  "Model loading took" covers both): a draft model whole, sharded like the target (draft TP must equal TP in V1);
  an EAGLE head's decoder layer(s), its fc projection (replicated) and, for EAGLE-3, its own small-vocabulary
  lm_head; MTP's layers from the target checkpoint (skipped when speculative decoding is off), one decoder layer
  each plus the fusion projection. n-gram and suffix decoding put nothing on the GPU.
- KV cache: the drafter's attention layers register beside the target's (get_kv_cache_spec), so every block is
  wider and fewer fit. A hybrid target keeps 1 + k recurrent-state pages a request (MambaSpec.num_speculative_blocks).
- Profile run: after the sampler warm-up, _dummy_sampler_run warms the rejection sampler over [num_reqs, vocab]
  logits (model runner V1 from 0.8.5; model runner V2, the default for more models from 0.22 and for every model from
  0.29, has no such run).
- CUDA graphs: capture sizes reach max_num_seqs x (1 + k) x 2 tokens from 0.13 (config/vllm.py _set_cudagraph_sizes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from oomguard.engines.vllm.releases import VllmRelease
from oomguard.engines.vllm.versions import fmt
from oomguard.engines.vllm.weights import (Parallel, builds_indexer, indexer_bytes, layer_bytes, padded_vocab,
                                           stage_weight_bytes)
from oomguard.errors import UsageError
from oomguard.models.spec import ModelSpec

NO_GPU_METHODS = ("ngram", "suffix", "ngram_gpu")
# the per-model MTP method names vLLM folds into "mtp" (config/speculative.py SpeculativeConfig.__post_init__)
_MTP_NAMES = ("mtp", "deepseek_mtp", "qwen3_next_mtp", "qwen3_5_mtp", "glm4_moe_mtp", "mimo_mtp", "ernie_mtp",
              "longcat_flash_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp")
MODELLED_METHODS = ("draft_model", "eagle", "eagle3", "mtp") + NO_GPU_METHODS
EAGLE3_DRAFT_VOCAB = 32000   # the draft_vocab_size of the published EAGLE-3 heads (their config.json)
# DeepSeek-style MTP layers keep their own shared_head lm_head copy until 0.16 shares the target's
_OWN_HEAD_TYPES = ("deepseek_v3", "deepseek_v32", "glm4_moe", "glm_moe_dsa", "kimi_k2")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None
    draft_tensor_parallel_size: int | None = None
    draft: ModelSpec | None = None         # the draft model's config, for method draft_model (the shell loads it)
    legacy_flags: bool = False             # given as --speculative-model / --num-speculative-tokens

    @classmethod
    def from_flags(cls, flags: dict) -> SpeculativeConfig | None:
        given = flags.get("speculative_config")
        legacy = flags.get("speculative_model") is not None or flags.get("num_speculative_tokens") is not None
        if given is not None and legacy:
            raise UsageError("give --speculative-config or the older --speculative-model / --num-speculative-tokens, "
                             "not both")
        if given is None and not legacy:
            return None
        raw = given if given is not None else {"model": flags.get("speculative_model"),
                                               "num_speculative_tokens": flags.get("num_speculative_tokens"),
                                               "draft_tensor_parallel_size":
                                                   flags.get("speculative_draft_tensor_parallel_size")}
        model = raw.get("model")
        method = str(raw.get("method") or _method_from_model(model))
        method = "mtp" if method in _MTP_NAMES else method
        k = raw.get("num_speculative_tokens")
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise UsageError(f"num_speculative_tokens must be a positive integer, got {k!r}")
        if k is None and method != "mtp":
            raise UsageError(f"speculative decoding with {method} needs num_speculative_tokens (e.g. "
                             f"--speculative-config '{{\"method\": \"{method}\", \"num_speculative_tokens\": 3}}')")
        if method in ("draft_model", "eagle", "eagle3") and not model:
            raise UsageError(f"speculative method {method} needs the draft's \"model\" in --speculative-config")
        return cls(method, k or 0, model, raw.get("draft_tensor_parallel_size"), legacy_flags=given is None)


def _method_from_model(model: str | None) -> str:
    """What vLLM infers from the draft's name when no method is given (SpeculativeConfig.__post_init__)."""
    if not model:
        raise UsageError("--speculative-config needs a \"method\" (ngram, eagle, eagle3, mtp, draft_model) or a "
                         "\"model\"")
    name = model.lower()
    if model in ("[ngram]", "ngram"):
        return "ngram"
    for tag in ("eagle3", "eagle", "medusa", "mlp_speculator"):
        if tag in name.replace("-", "_"):
            return tag
    return "draft_model"


@dataclass(frozen=True)
class Drafter:
    """What speculative decoding adds on one GPU."""

    weights_bytes: int
    attention_layers: int              # drafter layers with a KV cache shaped like the target's attention
    draft_model: ModelSpec | None      # or a whole draft model, whose own layers get KV specs
    tokens: int                        # k: proposed tokens per step
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    mtp: bool = False                  # the checkpoint's own MTP layers (decoder layers past the last one)


def check(spec: SpeculativeConfig, model: ModelSpec, rel: VllmRelease, engine: str, tp: int) -> None:
    """The refusals vLLM makes for these flags at this release (engine/arg_utils.py, config/speculative.py)."""
    version = fmt(rel.version)
    if spec.legacy_flags and rel.speculative_config_flag:
        raise UsageError(f"vLLM {version} has no --speculative-model / --num-speculative-tokens (replaced by "
                         "--speculative-config in 0.8.5): use --speculative-config '{\"model\": \"...\", "
                         "\"num_speculative_tokens\": N}'")
    if not spec.legacy_flags and not rel.speculative_config_flag:
        raise UsageError(f"vLLM {version} has no --speculative-config (from 0.8.5): use --speculative-model and "
                         "--num-speculative-tokens")
    if spec.method == "mtp" and not _mtp_layers(model):
        raise UsageError(f"{model.model_id} carries no MTP layers (num_nextn_predict_layers / mtp_num_hidden_layers "
                         "in config.json): pick another speculative method")
    if spec.method == "draft_model" and engine == "v1" and not rel.v1_draft_model:
        raise UsageError(f"vLLM {version}'s V1 engine runs no separate draft model (only EAGLE, MTP and n-gram "
                         "speculation, until 0.15): use one of those, or plan --vllm-version 0.15.0 or later")
    draft_tp = spec.draft_tensor_parallel_size
    if draft_tp not in (None, 1, tp) or (engine == "v1" and draft_tp not in (None, tp)):
        raise UsageError(f"draft_tensor_parallel_size {draft_tp} is not one vLLM {version} takes: use "
                         f"{tp} (the target's TP)" + (" or 1" if engine == "v0" else ""))


def _mtp_layers(model: ModelSpec) -> int:
    # qwen3_next_mtp.py: getattr(config, "num_nextn_predict_layers", 1)
    return model.mtp_layers or (1 if model.model_type == "qwen3_next" else 0)


def drafter(spec: SpeculativeConfig, model: ModelSpec, rel: VllmRelease, par: Parallel, act_bytes: int,
            compute_capability: tuple[int, int]) -> Drafter:
    """The drafter's weights on one GPU of the last pipeline stage, and its KV-bearing layers."""
    h, tp = model.hidden_size, par.tp
    method = spec.method
    if method in NO_GPU_METHODS:
        return Drafter(0, 0, None, spec.num_speculative_tokens,
                       (f"{method} speculation proposes {spec.num_speculative_tokens} tokens a step from the text "
                        "itself: no drafter weights or KV cache on the GPU",))
    last = model.num_layers - 1
    one_layer = layer_bytes(model, last, replace(par, pp=1), act_bytes, version=rel.version)
    if method == "mtp":
        n = _mtp_layers(model)
        k = spec.num_speculative_tokens or n
        # deepseek_mtp.py eh_proj is a plain nn.Linear (whole on every GPU); qwen3_next_mtp.py / qwen3_5_mtp.py fc is
        # column-parallel; both with enorm and hnorm
        fusion = 2 * h * h * act_bytes // (tp if model.model_type.startswith("qwen") else 1) + 2 * h * act_bytes
        own_head = padded_vocab(model.vocab_size) // tp * h * act_bytes \
            if model.model_type in _OWN_HEAD_TYPES and not rel.mtp_shares_lm_head else 0
        if model.indexer and not builds_indexer(model, last, rel.version):
            # a DSA model's MTP layer always builds its indexer (deepseek_v2.py DeepseekV2MLAAttention.__init__
            # is_mtp_layer), which the last decoder layer may lack (GLM-5.2's shared indexer, vLLM 0.24+)
            one_layer += indexer_bytes(model, act_bytes, rel.version)
        weights = n * (one_layer + fusion + own_head)
        note = (f"MTP speculation: the checkpoint's {n} MTP layer(s) load too ({weights / 2**30:.2f} GiB a GPU, "
                f"skipped without speculation) and add {n} attention layer(s) to every KV block; {k} tokens "
                "proposed a step" + (" (layers reused)" if k > n else ""))
        return Drafter(int(weights), n, None, k, (note,), mtp=True)
    if method in ("eagle", "eagle3"):
        # llama_eagle.py: fc ReplicatedLinear(2H -> H); llama_eagle3.py: fc over 3 auxiliary hidden states and its
        # own lm_head over a small draft vocabulary
        fc = (3 if method == "eagle3" else 2) * h * h * act_bytes
        head = padded_vocab(EAGLE3_DRAFT_VOCAB) // tp * h * act_bytes if method == "eagle3" else 0
        weights = one_layer + fc + head
        note = (f"{method.upper()} speculation with {spec.model}: one decoder layer shaped like the target's, its "
                f"fc projection" + (" and a 32k-token lm_head" if head else "") + f" ({weights / 2**30:.2f} GiB a "
                "GPU, estimated from the target's shapes), one more attention layer in every KV block; "
                f"{spec.num_speculative_tokens} tokens proposed a step")
        return Drafter(int(weights), 1, None, spec.num_speculative_tokens, (note,))
    if method == "draft_model":
        if spec.draft is None:
            raise UsageError(f"the draft model {spec.model} is not in the catalog: plan it by a catalog id")
        weights = stage_weight_bytes(spec.draft, Parallel(tp=tp), 0, act_bytes, compute_capability, rel.version)
        note = (f"draft model {spec.model}: {weights / 2**30:.2f} GiB a GPU (sharded over the target's "
                f"{tp} GPU(s)), its {spec.draft.num_layers} layers in every KV block; "
                f"{spec.num_speculative_tokens} tokens proposed a step")
        return Drafter(weights, 0, spec.draft, spec.num_speculative_tokens, (note,))
    return Drafter(0, 0, None, spec.num_speculative_tokens, (), (
        f"speculative method {method} is not modelled: its weights and KV cache are not counted here",))


def runs_model_runner_v2(model: ModelSpec, rel: VllmRelease, method: str | None = None) -> bool:
    """Whether vLLM runs this model on model runner V2 (config/vllm.py VllmConfig.use_v2_model_runner and
    _is_default_v2_model_runner_model), which warms up no rejection sampler; `method`: the speculative one, if any."""
    if method is not None and method not in rel.v2_spec_methods:
        return False   # _get_v2_model_runner_unsupported_features: back to V1
    if rel.v2_runner_everywhere:
        return True
    if model.architecture in rel.v2_runner_archs:
        return not rel.v2_runner_plain_only or (model.moe is None and model.quant is None)
    return rel.v2_runner_dense and model.moe is None and model.recurrent is None


def rejection_warmup_bytes(rel: VllmRelease, model: ModelSpec, method: str, num_reqs: int, vocab: int,
                           logits_bytes: int) -> int:
    """Peak of the rejection sampler's warm-up (gpu_model_runner._dummy_sampler_run with a speculative config): random
    target logits and their float32 probabilities over [num_reqs, vocab]; from 0.11.1 [2 x num_reqs, vocab] random
    logits, the bonus rows' full logprobs and float32 target probabilities. 0 where the release or runner runs none."""
    if runs_model_runner_v2(model, rel, method):
        return 0
    per_logit = {"early": logits_bytes + 8, "late": 3 * logits_bytes + 16}.get(rel.rejection_warmup, 0)
    return num_reqs * vocab * per_logit
