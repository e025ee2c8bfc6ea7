"""Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5) and Mamba2 hybrids (Nemotron-H) planned as vLLM plans them: state pages, the attention block size
that holds one, layer groups sharing one block pool, and the releases that run them.

The expected figures are vLLM's arithmetic, worked through from its source in docs/research/vllm-hybrid-kv.md
section 7 (kv_cache_interface.MambaSpec, mamba_utils.gated_delta_net_state_shape,
HybridAttentionMambaModelConfig / _align_hybrid_block_size, kv_cache_utils); no startup log of these models is in
the data yet.
"""

import pytest

from oomguard.engines.vllm.memory import EngineConfig, predict
from oomguard.errors import NotSupportedError, UsageError
from oomguard.gpus.catalog import resolve_gpu
from oomguard.models.load import from_catalog
from oomguard.models.spec import parse_config

NEXT = "Qwen/Qwen3-Next-80B-A3B-Instruct"


def plan(model=NEXT, version=(0, 19, 0), tp=2, gpu="h200", **flags):
    flags.setdefault("max_model_len", 32768)
    return predict(from_catalog(model), resolve_gpu(gpu), EngineConfig(tensor_parallel_size=tp, **flags), version,
                   gpu_count=tp)


def test_qwen3_next_layers_and_state():
    model = from_catalog(NEXT)
    assert model.layer_attention.count("linear") == 36 and model.layer_attention.count("full") == 12
    assert model.layer_attention[3] == "full" and model.layer_attention[0] == "linear"  # full_attention_interval 4
    conv, temporal = model.recurrent.state_elements(1)
    assert (conv * 2 + temporal * 2) == 1_097_728      # bf16 conv (3 x 8192) + temporal (32 x 128 x 128)
    assert model.attn_output_gate and model.moe.shared_expert_gate


@pytest.mark.parametrize("version, block, page_bytes, blocks_per_request", [
    ((0, 19, 0), 544, 6_684_672 // 12, 61 + 3 * 1),   # no prefix caching: one state page a request
    ((0, 33, 0), 576, 7_077_888 // 12, 57 + 3 * 3),   # prefix caching on ("align"), FlashInfer GDN prefill on Hopper
])
def test_block_size_padding_and_groups_as_vllm_computes_them(version, block, page_bytes, blocks_per_request):
    report = plan(version=version)
    layout = report.kv_layout
    assert report.block_size == block
    assert len(layout.groups) == 4 and layout.group_size == 12        # 12 attention + 36 GDN layers
    assert layout.groups[0].spec.page_size_bytes == page_bytes
    assert layout.bytes_per_block == 12 * page_bytes
    assert layout.blocks_per_request(32768, 8192) == blocks_per_request
    assert report.max_concurrency == pytest.approx(report.num_gpu_blocks / blocks_per_request, abs=0.01)


def test_prefix_caching_flag_changes_the_state_pages():
    on = plan(version=(0, 19, 0), enable_prefix_caching=True)       # 0.15+: "align" mode when asked
    off = plan(version=(0, 33, 0), enable_prefix_caching=False)
    assert on.kv_layout.blocks_per_request(32768, 8192) == 61 + 3 * 2
    assert off.block_size == 544 and off.kv_layout.blocks_per_request(32768, 8192) == 64


def test_kv_tokens_line_per_release():
    old, new = plan(version=(0, 20, 0)), plan(version=(0, 21, 0))
    # up to 0.20 the pool divided by the groups times the block; from 0.21 concurrency x max_model_len
    assert old.kv_cache_tokens == old.num_gpu_blocks // 4 * 544
    assert new.kv_cache_tokens == int(new.max_concurrency * 32768)


def test_releases_without_the_architecture_refuse_it():
    with pytest.raises(UsageError, match="0.10.2"):
        plan(version=(0, 10, 1))
    with pytest.raises(UsageError, match="0.17.0"):
        plan("Qwen/Qwen3.5-27B", version=(0, 16, 0), tp=1)
    assert plan("Qwen/Qwen3.5-27B", version=(0, 17, 0), tp=1).block_size == 784   # fp32 temporal state


NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def test_nemotron_h_single_purpose_layers_and_parameters():
    model = from_catalog(NANO)
    # hybrid_override_pattern: 23 Mamba2 mixers (M), 6 attention layers (*), 23 MoE blocks (E)
    assert (model.layer_attention.count("mamba"), model.layer_attention.count("full")) == (23, 6)
    assert model.layer_ffn.count("moe") == 23 and not model.gated_mlp      # relu2 experts: up and down only
    weights = plan(NANO, tp=1, gpu="h100").first.weights_bytes
    assert 31.4e9 < weights / 2 < 31.8e9                                    # NVIDIA's 31.6B parameters, in bf16


def test_nemotron_h_state_and_block_size():
    # conv 3 x (4096 + 2 x 8 x 128) bf16 + temporal 64 x 64 x 128 in config.json's float32: 2,134,016 bytes;
    # attention 2 KV heads x 128 x 2 x bf16 = 1,024 bytes a token, so the block is 16 x cdiv(2134016, 16384)
    report = plan(NANO, tp=1, gpu="h100")
    assert report.block_size == 2096
    assert len(report.kv_layout.groups) == 5 and report.kv_layout.group_size == 6   # 1 attention + 4 Mamba groups
    with pytest.raises(UsageError, match="0.12.0"):
        plan(NANO, version=(0, 11, 0), tp=1, gpu="h100")                     # the MoE variant arrived in 0.12


def test_nemotron_h_temporal_state_dtype_by_release():
    # without mamba_ssm_cache_dtype in config.json: the model dtype up to 0.12, float16 0.13-0.19, float32 from 0.20
    blocks = {v: plan("nvidia/Nemotron-H-56B-Base-8K", version=v, max_model_len=8192).block_size
              for v in ((0, 12, 0), (0, 19, 0), (0, 20, 0))}
    assert blocks[(0, 12, 0)] == blocks[(0, 19, 0)] < blocks[(0, 20, 0)]


def test_other_mamba_hybrids_are_refused_by_name():
    config = {"model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"], "hidden_size": 1024,
              "num_hidden_layers": 36, "num_attention_heads": 8, "vocab_size": 32784}
    with pytest.raises(NotSupportedError, match="falcon_h1"):
        parse_config(config, "tiiuae/Falcon-H1-0.5B-Instruct")
