"""vLLM error texts added to oomguard/engines/vllm/messages.json from the wheels' sources (the raise sites the first
review missed): engine arguments and config validation, quantized checkpoints, attention backends, distributed
setup, model loading, tokenizers and chat templates, LoRA, speculative decoding and the OpenAI server's request
checks. Each line below is rendered from the format string at the site the row's `source` names, with plausible
values filled in, as vLLM prints it; none is copied from a failure report."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from oomguard.diagnose import diagnose_text
from oomguard.diagnose.scan import Scanner

ROWS = {r["id"]: r for r in json.loads(
    resources.files("oomguard.engines.vllm").joinpath("messages.json").read_text(encoding="utf-8"))["messages"]}


def top(text: str) -> dict:
    findings = diagnose_text(text, use_planner=False).to_dict()["findings"]
    assert findings, f"no finding for {text!r}"
    return findings[0]


def hit_ids(text: str) -> set[str]:
    scanner = Scanner()
    for number, line in enumerate(text.splitlines(), 1):
        scanner.feed(number, line)
    scanner.finish()
    return {sid for hits in scanner.classes.values() for sid in hits.signatures}


def check(rid: str, text: str, numbers: dict | None = None) -> dict:
    row = ROWS[rid]
    assert rid in hit_ids(text), f"{rid} does not fire on {text!r}"
    finding = top(text)
    assert finding["class"] == row["class"], (rid, finding["class"], finding["summary"])
    if row["class"] == "unknown":
        # a known configuration message: recognised (not the "no known message" fallback), and its cause is told
        assert finding["confidence"] >= 0.5, (rid, finding)
    if numbers:
        from oomguard.failures import Signature
        sig = Signature(rid, row["class"], row["needle"], row["weight"], row["source"], pattern=row.get("pattern"))
        got = sig.numbers(" ".join(text.split()))
        for key, value in numbers.items():
            assert got.get(key) == value, (rid, key, got)
    return finding


# --- context length (vllm/renderers/params.py, vllm/entrypoints/renderer.py, vllm/entrypoints/chat_utils.py) -------

CONTEXT = {
    "vllm.ctx_context_length_only": (
        "vllm.exceptions.VLLMValidationError: You passed 30000 input tokens and requested 4096 output tokens. However, "
        "the model's context length is only 32768 tokens, resulting in a maximum input length of 28672 tokens. Please "
        "reduce the length of the input prompt.",
        {"prompt_tokens": 30000, "completion_tokens": 4096, "max_model_len": 32768}),
    "vllm.ctx_this_maximum_context": (
        "ValueError: This maximum context length is 8192 tokens. However, your request has 9000 input tokens. Please "
        "reduce the length of the input messages.", {"max_model_len": 8192, "prompt_tokens": 9000}),
    "vllm.mm_limit_per_request": (
        "ValueError: At most 1 image(s) may be provided in one request.", {"limit": 1, "modality": "image"}),
}


@pytest.mark.parametrize("rid", sorted(CONTEXT))
def test_context_length_texts(rid):
    text, numbers = CONTEXT[rid]
    check(rid, text, numbers)


def test_context_length_characters_variant_has_the_context_length():
    text = ("You passed 120000 input characters and requested 256 output tokens. However, the model's context length "
            "is only 4096 tokens, resulting in a maximum input length of 3840 tokens (at most 115200 characters). "
            "Please reduce the length of the input prompt.")
    finding = check("vllm.ctx_context_length_only", text, {"max_model_len": 4096})
    assert "4,096" in finding["summary"]


# --- quantized checkpoints (vllm/model_executor/layers/quantization/, vllm/config/model.py) --------------------------

QUANT = {
    "vllm.quant_config_key_missing": "ValueError: Cannot find any of ['bits', 'w_bit'] in the model's quantization config.",
    "vllm.fp8_e5m2_with_fp8_checkpoint": "ValueError: fp8_e5m2 kv-cache is not supported with fp8 checkpoints.",
    "vllm.bnb_version_wrong": "ImportError: bitsandbytes version is wrong. Please install bitsandbytes>=0.46.1.",
    "vllm.quant_deprecated": "ValueError: The quantization method deepspeedfp is deprecated and will be removed in future "
                             "versions of vLLM. To bypass, set `--allow-deprecated-quantization`.",
    "vllm.mistral_quant_unknown": "ValueError: Found unknown quantization='nf4' in config",
    "vllm.gguf_partial_shards": "ValueError: Detected some but not all shards of model.layers.0.self_attn.qkv_proj are "
                                "quantized. All shards of fused layers to have the same precision.",
    "vllm.amd_quark_missing": "ImportError: The package `amd-quark` is required to use MX-FP4 models. Please install it "
                              "with `pip install amd-quark`.",
    "vllm.modelopt_nvfp4_algo": "ValueError: Unsupported ModelOpt NVFP4 quant_algo: W4A8_NVFP4. Supported: NVFP4 / "
                                "W4A16_NVFP4.",
    "vllm.modelopt_algo_unknown": "ValueError: Unknown ModelOpt quant algo: W4A8_AWQ",
    "vllm.quant_scheme_mixed": "ValueError: Found a different quantization schemes for ['q_proj', 'k_proj', 'v_proj'] in "
                               "model.layers.0.self_attn.qkv_proj. vLLM requires all to use the same scheme.",
    "vllm.ct_target_unmatched": "ValueError: Unable to find matching target for model.layers.0.mlp.gate in the "
                                "compressed-tensors config.",
    "vllm.fused_moe_scheme": "RuntimeError: Unsupported FusedMoe scheme: {'num_bits': 4}, {'num_bits': 8}",
    "vllm.fp8_moe_scales": "ValueError: For FP8 Fused MoE layers, we require per tensor or channelwise, dynamic per token "
                           "quantization. Found QuantizationStrategy.GROUP, False",
    "vllm.fp8_kv_scale_per_tensor": "ValueError: Only support per-tensor scaling factor for fp8 KV cache",
    "vllm.ct_sparsity_removed": "DeprecationWarning: Sparsity support has been removed from compressed-tensors. Please use "
                                "a model without sparsity configuration.",
    "vllm.fp8_activation_scheme": "ValueError: Unsupported activation scheme per_token",
    "vllm.marlin_group_required": "ValueError: Marlin kernels require group quantization or channelwise quantization, but "
                                  "found no group size and strategy is not channelwise.",
    "vllm.quant_config_multiple": "ValueError: Found multiple config files for awq: ['quant_config.json', "
                                  "'quantize_config.json']",
}


@pytest.mark.parametrize("rid", sorted(QUANT))
def test_quantization_texts(rid):
    check(rid, QUANT[rid])


def test_bitsandbytes_version_is_read():
    check("vllm.bnb_version_wrong", QUANT["vllm.bnb_version_wrong"], {"required_version": "0.46.1"})


# --- attention backends (vllm/attention/, vllm/platforms/) -----------------------------------------------------------

ATTENTION = {
    "vllm.paged_attn_head_size": ("ValueError: Head size 96 is not supported by PagedAttention. Supported head sizes "
                                  "are: [64, 80, 128, 256].", {"head_size": 96}),
    "vllm.mm_encoder_attn_backend": ("ValueError: Unsupported multi-modal encoder attention backend for CUDA: "
                                     "AttentionBackendEnum.FLASHINFER.", None),
    "vllm.mla_prefill_backend": ("ValueError: No valid MLA prefill backend found with head_size=192, dtype=torch.float16. "
                                 "Reasons: {FLASHINFER: compute capability not supported}.", None),
}


@pytest.mark.parametrize("rid", sorted(ATTENTION))
def test_attention_backend_texts(rid):
    text, numbers = ATTENTION[rid]
    check(rid, text, numbers)


# --- distributed setup (vllm/config/parallel.py, vllm/executor/, vllm/distributed/, vllm/platforms/interface.py) ----

DISTRIBUTED = {
    "vllm.tp_pp_world_mismatch": (
        "RuntimeError: world_size (4) is not equal to tensor_model_parallel_size (2) x pipeline_model_parallel_size (4)",
        {"world_size": 4, "tensor_parallel_size": 2, "pipeline_parallel_size": 4}),
    "vllm.ray_unique_ip": (
        "RuntimeError: Every node should have a unique IP address. Got 2 nodes with node ids ['a1', 'b2'] and 1 unique "
        "IP addresses {'10.0.0.5'}. Please check your network configuration. If you set `VLLM_HOST_IP` environment "
        "variable, make sure it is unique for each node.", None),
    "vllm.ray_import_failed": (
        "ValueError: Failed to import Ray: No module named 'ray'.Please install Ray with `pip install ray`.", None),
    "vllm.ray_node_no_gpu": (
        "ValueError: Current node has no GPU available. current_node_resource={'CPU': 32.0}. vLLM engine cannot start "
        "without GPU. Make sure you have at least 1 GPU available in a node current_node_id='abc' "
        "current_ip='10.0.0.5'.", None),
    "vllm.ray_platform_unsupported": ("RuntimeError: current platform cpu does not support ray.", None),
    "vllm.pp_partition_string": ("ValueError: Invalid partition string: 16;16", None),
    "vllm.pg_tp_exceeds_gpus": (
        "ValueError: Cannot provide a placement group requiring 8 GPUs (placement_group_specs=[{'GPU': 1.0}]) within "
        "1800 seconds.\nTensor parallel size may exceed available GPUs in your cluster. Check resources with `ray "
        "status` and `ray list nodes`.", {"num_gpus": 8}),
    "vllm.dcp_q_per_kv": (
        "ValueError: The model's number of query heads per KV head (6) must be divisible by "
        "`--decode-context-parallel-size` (4) for GQA/MQA.", {"q_per_kv": 6, "dcp_size": 4}),
    "vllm.dcp_exceeds_max": (
        "ValueError: `--decode-context-parallel-size` (8) exceeds the maximum supported value (4) for "
        "`--tensor-parallel-size` (8) and 8 model KV heads.", {"dcp_size": 8, "max_dcp_size": 4}),
    "vllm.eplb_needs_parallel": (
        "ValueError: EPLB requires tensor_parallel_size or data_parallel_size to be greater than 1, but got TP=1,DP=1.",
        None),
    "vllm.eplb_needs_ep": ("ValueError: enable_expert_parallel must be True to use EPLB.", None),
    "vllm.dp_rank_range": ("ValueError: data_parallel_rank (2) must be in the range [0, 2)",
                           {"data_parallel_rank": 2, "data_parallel_size": 2}),
    "vllm.dp_external_lb": ("ValueError: data_parallel_external_lb can only be set when data_parallel_size > 1", None),
    "vllm.tp_divisible_dcp_v10": ("ValueError: tp_size=2 must be divisible bydcp_size=4.",
                                  {"tensor_parallel_size": 2, "dcp_size": 4}),
    "vllm.spec_pp_unsupported": ("ValueError: EAGLE3 with pipeline parallel is not supported.", None),
    "vllm.spec_tp_arg": ("ValueError: 'tensor_parallel_size' is not a valid argument in the speculative_config. Please "
                         "pass 'draft_tensor_parallel_size' instead.", None),
    "vllm.visible_device_missing": ("RuntimeError: Physical device 3 for logical device 1 is not visible in "
                                    "CUDA_VISIBLE_DEVICES=0,1", {"physical_device": 3, "logical_device": 1}),
}


@pytest.mark.parametrize("rid", sorted(DISTRIBUTED))
def test_distributed_setup_texts(rid):
    text, numbers = DISTRIBUTED[rid]
    check(rid, text, numbers)


def test_gated_needles_need_their_pattern():
    """`data_parallel_rank (`, `max_lora_rank (`, `load format \\`` and `is not visible in` fire only in the error's
    own wording."""
    for text in ("INFO 05-01 10:00:00 [core.py:70] data_parallel_rank (0) of 2 started",
                 "INFO max_lora_rank (16) is used for the dummy LoRA",
                 "WARNING Load format `runai_streamer` is already registered, and will be overwritten",
                 "The file is not visible in the listing."):
        assert not hit_ids(text) & set(ROWS), text


# --- model loading and access (vllm/transformers_utils/config.py, vllm/model_executor/model_loader/) ----------------

MODEL_ACCESS = {
    "vllm.config_format_undetected": (
        "ValueError: Could not detect config format for no config file found. With config_format 'auto', ensure your "
        "model has either config.json (HF format) or params.json (Mistral format). Otherwise please specify your_custom_"
        "config_format in engine args for customized config parser."),
    "vllm.mistral_config_load": (
        "ValueError: Failed to load mistral 'params.json' config for model mistralai/Foo-7B. Please check if the model "
        "is a mistral-format model and if the config file exists."),
    "vllm.gguf_remote_config": (
        "ValueError: Could not find config.json for remote GGUF model repo. To load remote GGUF model through "
        "`<repo_id>:<quant_type>`, ensure your model has config.json (HF format) file. Otherwise please specify "
        "--hf-config-path <original_repo> in engine args to fetch config from unquantized hf model."),
    "vllm.load_format_unsupported": "ValueError: Load format `tensorflow` is not supported",
    "vllm.load_format_unknown": "ValueError: Unknown load_format: tensorflow",
    "vllm.sharded_state_missing": (
        "ValueError: Could not find checkpoint files 'model-rank-*-part-*.safetensors', only pre-sharded checkpoints "
        "are currently supported!"),
    "vllm.gguf_download_missing": "ValueError: Downloaded GGUF files not found in /models/hub for quant_type Q4_K_M",
    "vllm.index_weights_missing": (
        "FileNotFoundError: Weight files referenced in index but missing: ['model-00003-of-00004.safetensors']"),
    "vllm.tensorizer_uri": (
        "ValueError: ./model.tensors is not a valid tensorizer URI. Please check that the URI is correct. It must "
        "either point to a local existing file, or have a S3, HTTP or HTTPS scheme."),
    "vllm.gguf_config": "RuntimeError: Can't get gguf config for llama4.",
    "vllm.lora_hf_download": "ERROR 05-01 10:00:00 [utils.py:200] Error downloading the HuggingFace model",
}


@pytest.mark.parametrize("rid", sorted(MODEL_ACCESS))
def test_model_access_texts(rid):
    check(rid, MODEL_ACCESS[rid])


# --- tokenizers and chat templates (vllm/tokenizers/, vllm/sampling_params.py) ---------------------------------------

TOKENIZER = {
    "vllm.mistral_chat_template": "ValueError: chat_template is not supported for Mistral tokenizers.",
    "vllm.gen_prompt_after_assistant": (
        "ValueError: Cannot set `add_generation_prompt` to True when the last message is from the assistant. Consider "
        "using `continue_final_message` instead."),
    "vllm.continue_not_assistant": (
        "ValueError: Cannot set `continue_final_message` to True when the last message is not from the assistant."),
    "vllm.tokenizer_mode_unregistered": "ValueError: No tokenizer registered for tokenizer_mode='deepseek_v32'.",
    "vllm.mistral_structured_backend": (
        "ValueError: Mistral tokenizer is not supported for the 'lm-format-enforcer' structured output backend. Please "
        "use ['xgrammar', 'outlines'] backends or tokenizer_mode='hf' instead."),
}


@pytest.mark.parametrize("rid", sorted(TOKENIZER))
def test_tokenizer_texts(rid):
    check(rid, TOKENIZER[rid])


# --- LoRA, speculative decoding, runners, request flags (no failure class of their own: recognised, class unknown) --

CONFIG = {
    "vllm.max_lora_rank_choice": ("ValueError: max_lora_rank (24) must be one of (1, 8, 16, 32, 64, 128, 256, 320, 512).",
                                  {"max_lora_rank": 24}),
    "vllm.no_free_lora_slots": ("ValueError: No free lora slots", None),
    "vllm.lora_not_enabled_flag": ("RuntimeError: LoRA is not enabled. Use --enable-lora to enable LoRA.", None),
    "vllm.model_lora_unsupported": ("ValueError: GPTBigCodeForCausalLM does not support LoRA yet.", None),
    "vllm.lora_extra_vocab": ("ValueError: LoRA added vocab size 512 is greater than lora_extra_vocab_size 256.", None),
    "vllm.lora_bias_flag": ("ValueError: Adapter bias cannot be used for sql-lora without --enable-lora-bias.", None),
    "vllm.enable_mm_embeds": ("ValueError: You must set `--enable-mm-embeds` to input `image_embeds`", None),
    "vllm.enable_prompt_embeds": ("ValueError: You must set `--enable-prompt-embeds` to input `prompt_embeds`.", None),
    "vllm.runner_pooling_unsupported": (
        "ValueError: This model does not support `--runner pooling`. You can pass `--convert embed` to adapt it into a "
        "pooling model.", None),
    "vllm.spec_vocab_mismatch": (
        "ValueError: Target and draft model should have the same vocabulary size. Target model vocab_size=151936. "
        "Draft model vocab_size=32000. Using models with different tokenizers can cause out-of-bounds errors during "
        "speculative decoding.", None),
    "vllm.spec_tokens_without_model": ("ValueError: num_speculative_tokens was provided but without speculative model.",
                                       None),
    "vllm.spec_model_without_tokens": (
        "ValueError: A speculative model was provided, but `num_speculative_tokens` was not provided", None),
    "vllm.spec_method_unknown": ("ValueError: Unknown speculative decoding method: lookahead", None),
    "vllm.structured_backend_per_request": (
        "ValueError: Request-level structured output backend selection is not supported. The request specified "
        "'outlines', but vLLM was initialised with 'xgrammar'. This error can be resolved by removing '_backend' from "
        "the request.", None),
    "vllm.priority_not_enabled": ("ValueError: Got priority 1 but Priority scheduling is not enabled.", None),
}


@pytest.mark.parametrize("rid", sorted(CONFIG))
def test_configuration_texts(rid):
    text, numbers = CONFIG[rid]
    check(rid, text, numbers)


def test_every_added_row_has_a_line_here():
    covered = set(CONTEXT) | set(QUANT) | set(ATTENTION) | set(DISTRIBUTED) | set(MODEL_ACCESS) | set(TOKENIZER) | set(CONFIG)
    missing = covered - set(ROWS)
    assert not missing, f"rows not in the table: {missing}"
