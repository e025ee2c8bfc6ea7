"""What vLLM measures at startup rather than computes: activation peak, non-torch memory, CUDA-graph pool.

vLLM runs a dummy forward pass (GPUModelRunner.profile_run) and reads the allocator's peak, so there is no
closed form in its source. These are fitted models of those measurements, with the physics in their shape:
- the forward pass of max_num_batched_tokens tokens allocates per-token activations (hidden and MLP widths);
- the sampler dummy run (_dummy_sampler_run) holds logits [num_reqs, vocab] and same-sized temporaries on the
  last pipeline stage; how many bytes per logit is read from the sampler code of each release (below), not fitted;
- pipeline stages keep IntermediateTensors (hidden states and residual) for max_num_batched_tokens;
- non-torch memory grows with NCCL / custom all-reduce buffers once there are several TP ranks;
- the CUDA-graph pool grows with the layers on the rank (partly sharded by TP) and the routed MoE width.
Each figure is linear in its coefficients (the activation peak is the larger of two linear candidates), and
benchmarks/fit_profile.py fits them all by least squares on ../shared/data/vllm_startup_logs.jsonl (vLLM 0.19
H100 sweep, plus older logs for the V0 non-torch constants); the values below are its fit to 3 significant
figures and tests/test_profile_fit.py fails when they drift from a fresh fit. Rerun it with --write after
adding records or catalog models. forward_bytes_per_hidden fits to 0: every dense forward-bound record has
hidden size 4096, so the data cannot tell hidden from intermediate width and the MLP term takes it all.
The planner marks every figure from here as an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from oomguard.engines.vllm.releases import release
from oomguard.engines.vllm.versions import Version
from oomguard.gpus.spec import GpuSpec
from oomguard.models.spec import ModelSpec
from oomguard.units import GiB, cdiv


# Bytes per (dummy request x vocabulary entry) the sampler warm-up holds at its peak, from the code each release runs
# (vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py; the dummy requests have temperature 0.5, top_p 0.9 and
# top_k vocab - 1, no logprobs, no penalties): model-dtype logits 2 + their fp32 copy 4, then
SAMPLER_SORT_BYTES = 38        # torch.sort: fp32 values 4 + int64 indices 8 + its int64 scratch 8 + CUB's 4 + 8
SAMPLER_SORT_SMALL_BYTES = 50  # below 128 rows PyTorch sorts segment by segment with more scratch (SortStable.cu)
SAMPLER_KERNEL_BYTES = 14      # FlashInfer or Triton top-k/top-p: two more fp32 tensors (probabilities, noise/mask)
TRITON_BYTES_PER_SM_LOGIT = 4  # topk_topp_triton.py keeps one fp32 row of the vocabulary per SM
# FlashInfer's all-reduce + RMSNorm fusion (compilation/passes/fusion/allreduce_rms_fusion.py AllReduceFusionPass):
# the largest all-reduce it fuses, in MiB, per compute-capability major and TP size (FI_ALLREDUCE_FUSION_MAX_SIZE_MB,
# the same from 0.17 to 0.33 for Hopper and B200)
FUSION_MAX_MIB = {9: {2: 64, 4: 2, 8: 0.5}, 10: {2: 64, 4: 32, 8: 1}}
MULTICAST_PAGE = 512 * 2**20   # cuMulticastGetGranularity(RECOMMENDED) on NVSwitch Hopper/Blackwell, NCCL's choice too
ALLOCATION_PAGE = 2 * 2**20    # cuMemGetAllocationGranularity(RECOMMENDED) for device memory
LAMPORT_COMM_MAX = 2**31 - ALLOCATION_PAGE   # flashinfer/comm/trtllm_ar.py MAX_COMM_SIZE
CUSTOM_ALL_REDUCE_GIB = 18 / 1024   # custom_all_reduce.py: two cudaMalloc'd 8 MiB buffers (meta, data), 10 + 8 MiB
PCIE_NCCL_GIB = 0.05           # TP over PCIe: no custom all-reduce, symmetric memory or FlashInfer workspace; NCCL
                               # keeps its P2P/SHM buffers (4 MiB x channels x peers) and little else on the device
# ... but how much it keeps there varies with the transport it picks (P2P where the cards allow it, else shared
# memory) and its channels: TP-over-PCIe starts logged 0.38-1.13 GiB in use at vLLM's snapshot (free at start), up to
# this much above context_gib + PCIE_NCCL_GIB, and vLLM counts none of it: the warm-up verdict allows for it
PCIE_NCCL_SPREAD_GIB = 0.55


def sampler_bytes_per_logit(version: Version, num_reqs: int, flashinfer: bool = False) -> int:
    """The sampler warm-up's bytes per logit for this release: sort-based top-k/top-p or a fused kernel."""
    rel = release(version)
    if not rel.sampler_sorts or (flashinfer and rel.flashinfer_sampler_if_installed):
        return SAMPLER_KERNEL_BYTES
    return SAMPLER_SORT_SMALL_BYTES if num_reqs < 128 else SAMPLER_SORT_BYTES


@dataclass(frozen=True)
class ProfileCoefficients:
    forward_bytes_per_hidden: float = 0.0     # per token per hidden unit, in units of the activation dtype
    forward_bytes_per_inter: float = 4.74     # per token per MLP-intermediate unit on this rank (gate/up/act)
    non_torch_single_gib: float = 0.261       # one GPU, with the CUDA-graph estimate inside the window (0.18-0.26)
    non_torch_single_early_gib: float = 0.144  # one GPU otherwise: lazily loaded kernels, cuBLAS handles
    non_torch_tp_gib: float = 0.496           # TP > 1 over NVLink from 0.11 (NCCL set up before the snapshot): the
                                              # profile run's own NCCL communicator and kernels
    non_torch_pp_only_gib: float = 0.07       # pipeline-only workers
    non_torch_v0_gib: float = 0.107           # V0 worker.py accounting (0.7-0.10)
    non_torch_v06_gib: float = 0.83           # 0.6.x counted the CUDA context and cuBLAS handles too
    context_gib: float = 0.535                 # CUDA context + allocator state present before vLLM's snapshot
    nccl_init_gib: float = 1.07               # NCCL communicators created before the snapshot (V1 >= 0.11)
    graph_base_gib: float = 0.455             # CUDA-graph pool, fixed part
    graph_per_layer_gib: float = 0.014       # per decoder layer on the rank, at the default capture sizes
    graph_per_layer_tp_gib: float = 0.0       # per decoder layer, the part sharded over TP ranks (/ tp)
    graph_moe_gib_per_m: float = 1.81         # MoE: per million (MoE layers x top_k x expert-intermediate / tp)
    graph_est_base_gib: float = 0.235         # the same four for vLLM's estimate ("Estimated CUDA graph memory")
    graph_est_per_layer_gib: float = 0.0175
    graph_est_per_layer_tp_gib: float = 0.0
    graph_est_moe_gib_per_m: float = 1.23


COEFFICIENTS = ProfileCoefficients()

# What the code alone says for the forward-pass coefficients, in activation-dtype elements per token and unit, for
# settings no startup log informs: an MLP writes gate_up (2 x intermediate) and silu_and_mul's output (1 x)
# (vllm/model_executor/layers/activation.py SiluAndMul).
SOURCE_PRIORS = {"forward_bytes_per_hidden": 0.0, "forward_bytes_per_inter": 3.0}

# Not NVIDIA or AMD: every fitted figure here comes from CUDA startups (ROCm's from the ROCm fit below), so a plan for
# another vendor's GPU widens its ranges by the spread ROCm showed before it was modelled (Llama-3.1-8B on a Radeon AI
# PRO R9700: 0.83 vs 3.43 GiB of activation and non-torch memory in two runs of one benchmark repository).
UNCALIBRATED_PLATFORM_GIB = 2.6


@dataclass(frozen=True)
class RocmFit:
    """What a ROCm start adds to the CUDA figures where vLLM's code gives no number: the HIP runtime's and PyTorch's
    allocator behaviour. Fitted by benchmarks/fit_rocm.py on one folder of R9700 runs (the ROCm-attention runs,
    vLLM 0.13) and scored on the others (README "Accuracy on real vLLM startups"); each a median residual."""

    # RocmPlatform.get_current_memory_usage (platforms/rocm.py) is total - free (mem_get_info) with no empty_cache,
    # so "Model loading took" also counts what HIP allocated while loading and the blocks PyTorch's allocator keeps
    # cached after process_weights_after_loading replaced tensors; memory_profiling frees the latter before the
    # profile run, but the figure is already in the budget (releases.py rocm_weights_device_wide)
    load_residue_gib: float = 0.531
    # activation peak + non-torch increase above the CUDA fit (hipBLASLt workspaces, and the non-torch memory made
    # while loading, which non_torch_increase counts again from the initial snapshot)
    profile_gib: float = 0.252
    # "Graph capturing finished ... took" above the CUDA fit (also a mem_get_info delta on ROCm)
    graph_gib: float = 0.354
    # the available KV memory the AMD runs logged fell this far below and above the prediction (the widest misses of
    # the held-out runs and of the fitting folder's scatter around its medians, so that an at-risk range holds every
    # start seen): ROCm starts of one setup differ by up to 2.6 GiB (benchmarks/measured_repeat.py), by taking more
    # than the quiet runs the medians come from
    kv_below_gib: float = 4.47
    kv_above_gib: float = 0.58
    # the graph pool's miss (90th percentile, the same runs): what the warm-up verdict allows for (the profile's
    # misses do not shrink what is free at the warm-up: a larger peak or non-torch figure shrinks the KV cache as much)
    graph_margin_gib: float = 0.66


ROCM_FIT = RocmFit()

# How far the fitted figures miss what vLLM measures: 90th-percentile absolute residuals of the fit on the startup
# records (python benchmarks/fit_profile.py); the planner widens its available-KV figure by their sum into a range.
ESTIMATE_P90_GIB = {"activation_peak": 0.04, "non_torch": 0.10, "cuda_graph": 0.28, "cuda_graph_estimate": 0.34}


def moe_workspace_bytes(model: ModelSpec, tokens: int, tp: int, act_bytes: int) -> int:
    """Fused-MoE scratch for `tokens` tokens: TritonExperts.workspace_shapes (fused_moe/fused_moe.py), workspace13
    [tokens, top_k, max(I, H)] and workspace2 [tokens, top_k, max(2I, H)], I the expert width on this rank.
    MXFP4 experts run OpenAI's Triton or Marlin kernels with their own small buffers: not counted."""
    moe = model.moe
    if not (moe and any(moe.moe_layers)) or (model.quant and model.quant.method == "mxfp4"):
        return 0
    inter, hidden = moe.expert_intermediate_size // tp, model.hidden_size
    first_gemm = 2 * inter if model.gated_mlp else inter   # N: gate and up, or up alone (is_act_and_mul=False)
    return tokens * moe.top_k * (max(inter, hidden) + max(first_gemm, hidden)) * act_bytes


def forward_peak_bytes(model: ModelSpec, tokens: int, tp: int, act_bytes: int,
                       c: ProfileCoefficients = COEFFICIENTS, engine: str = "v1") -> float:
    """Peak of the eager forward pass over `tokens` tokens on one TP rank: per-token activations of the dense MLP
    (or a MoE model's shared experts) and, for MoE, the fused-MoE workspace. The V1 figure is fitted (its compiled
    graph keeps more buffers alive); V0 runs plain PyTorch modules, whose MLP holds what the code says."""
    per_inter = c.forward_bytes_per_inter if engine == "v1" else SOURCE_PRIORS["forward_bytes_per_inter"]
    per_token = c.forward_bytes_per_hidden * model.hidden_size
    if model.moe and any(model.moe.moe_layers):
        per_token += per_inter * model.moe.shared_intermediate_size / tp
    else:
        per_token += per_inter * model.intermediate_size / tp
    return tokens * per_token * act_bytes + moe_workspace_bytes(model, tokens, tp, act_bytes)


def v2_sampling_state_bytes(max_num_reqs: int, vocab: int) -> int:
    """Model runner V2's per-request sampling state that scales with the vocabulary, allocated with its sampler in
    load_model after the weights are measured (v1/worker/gpu/sample/penalties.py PenaltiesState: output_bin_counts
    [max_num_reqs, vocab] int32 and prompt_bin_mask [max_num_reqs, vocab / 32] int32; 0.22 to 0.33 alike)."""
    return max_num_reqs * vocab * 4 + max_num_reqs * cdiv(vocab, 32) * 4


def sampler_peak_bytes(vocab: int, num_reqs: int, version: Version, multiprocessors: int = 0,
                       flashinfer: bool = False, runner_v2: bool = False, logits_bytes: int = 2) -> int:
    """Peak of the sampler dummy run (gpu_model_runner._dummy_sampler_run) over num_reqs x vocab logits; model runner
    V2's warm-up (v1/worker/gpu/sample/sampler.py Sampler.apply_sampling_params) holds the logits and their float32
    copy, the Gumbel draw running in one kernel. Up to 0.32 its default parameters skip top-k/top-p; from 0.33 a
    second pass with SamplingParams.for_sampler_warmup (v1/worker/gpu/model_runner.py _dummy_sampler_run) applies
    penalties, bias and min-p in place and top-k/top-p through Triton's per-SM vocabulary rows
    (topk_topp_triton.py apply_top_k_top_p_triton), unless FlashInfer's fused sampler takes it."""
    if runner_v2:
        peak = num_reqs * vocab * (logits_bytes + 4)
        if not release(version).v2_sampler_plain_warmup and not flashinfer:
            peak += TRITON_BYTES_PER_SM_LOGIT * min(multiprocessors, num_reqs) * vocab
        return peak
    triton = not release(version).sampler_sorts and not flashinfer and num_reqs >= 8  # apply_top_k_top_p
    buffer = TRITON_BYTES_PER_SM_LOGIT * multiprocessors * vocab if triton else 0
    return num_reqs * vocab * sampler_bytes_per_logit(version, num_reqs, flashinfer) + buffer


def activation_candidates(model: ModelSpec, tokens: int, num_reqs: int, vocab: int, tp: int, pp: int,
                          last_stage: bool, act_bytes: int, version: Version, multiprocessors: int = 0,
                          c: ProfileCoefficients = COEFFICIENTS, engine: str = "v1",
                          flashinfer: bool = False, rejection_bytes: int = 0,
                          runner_v2: bool = False) -> tuple[float, float]:
    """The two peaks profile_run can hit on one worker: (forward pass, sampler dummy run), each linear in `c`."""
    forward = forward_peak_bytes(model, tokens, tp, act_bytes, c, engine)
    # hidden_states stay alive while the sampler runs, with the rows gathered for it (hidden_states[logit_indices])
    # and the lm_head's input copy (gpu_model_runner._dummy_sampler_run / compute_logits)
    hidden_alive = (tokens + 2 * num_reqs) * model.hidden_size * act_bytes
    # from 0.13 the fused-MoE workspace comes from the WorkspaceManager (v1/worker/workspace.py) and stays allocated
    kept = moe_workspace_bytes(model, tokens, tp, act_bytes) if release(version).moe_workspace_persists else 0
    # with speculative decoding the rejection sampler warms up after the sampler (speculative.rejection_warmup_bytes)
    sampler = max(sampler_peak_bytes(vocab, num_reqs, version, multiprocessors, flashinfer, runner_v2, act_bytes),
                  rejection_bytes) + \
        hidden_alive + kept if last_stage else 0.0
    pp_buffers = 2 * tokens * model.hidden_size * act_bytes if pp > 1 else 0.0  # IntermediateTensors
    return forward + pp_buffers, sampler + pp_buffers


def activation_peak_bytes(model: ModelSpec, tokens: int, num_reqs: int, vocab: int, tp: int, pp: int,
                          last_stage: bool, act_bytes: int, version: Version, multiprocessors: int = 0,
                          c: ProfileCoefficients = COEFFICIENTS, engine: str = "v1", flashinfer: bool = False,
                          rejection_bytes: int = 0, runner_v2: bool = False) -> int:
    """torch peak increase during profile_run on one worker: the larger of the two candidates (`flashinfer`: with
    FlashInfer's sampler, which releases up to 0.11 use when it is installed)."""
    return int(max(activation_candidates(model, tokens, num_reqs, vocab, tp, pp, last_stage, act_bytes, version,
                                         multiprocessors, c, engine, flashinfer, rejection_bytes, runner_v2)))


def allreduce_fusion_workspace_bytes(version: Version, tp: int, pp: int, hidden: int, act_bytes: int,
                                     max_num_batched_tokens: int, gpu: GpuSpec, graphs: bool = True) -> int:
    """Device memory of FlashInfer's all-reduce fusion workspace, which vLLM's first compiled forward (the profile run,
    inside the memory-profiling window) creates: allreduce_rms_fusion.py sizes it for min(max size / (hidden x dtype),
    max_num_batched_tokens) tokens, and flashinfer/comm/trtllm_ar.py allocates three buffers for them: the
    all-reduce buffer (tp x tokens x hidden x 2 bytes), the barrier flags (tp x 256 x 4) and three Lamport buffers.
    The FlashInfer of 0.17-0.21 rounds each up to a multicast page (3 x 512 MiB on NVSwitch H100s) and fails, leaving
    the fusion off, where the GPUs cannot multicast; later ones allocate what the buffers need. None over PCIe."""
    rel = release(version)
    sizes = FUSION_MAX_MIB.get(gpu.compute_capability[0], {})
    if tp <= 1 or not graphs or gpu.interconnect != "nvlink" or not rel.flashinfer_allreduce_fusion or \
            tp not in sizes or (rel.allreduce_fusion_single_dp_pp and pp > 1):
        return 0
    tokens = min(int(sizes[tp] * 2**20) // (hidden * act_bytes), max_num_batched_tokens)
    comm = tp * tokens * hidden * 2
    buffers = (comm, tp * 256 * 4, 3 * min(comm, LAMPORT_COMM_MAX))
    if rel.allreduce_fusion_multicast_pages:
        if not gpu.nvlink_multicast:
            return 0
        return sum(-(-(_pages(b) + ALLOCATION_PAGE) // MULTICAST_PAGE) * MULTICAST_PAGE for b in buffers)
    return sum(_pages(b + 2048) for b in buffers)   # each with a 2 KiB signal pad


def _pages(size: int) -> int:
    return -(-size // ALLOCATION_PAGE) * ALLOCATION_PAGE


def non_torch_bytes(engine: str, version: Version, tp: int, pp: int, c: ProfileCoefficients = COEFFICIENTS,
                    interconnect: str = "nvlink", compute_capability: tuple[int, int] = (9, 0),
                    graphs: bool = True, fusion_workspace: int = 0) -> int:
    """non_torch_increase during load + profile (memory_profiling in vllm/utils/mem_utils.py), fitted per band.

    On one GPU, 0.18-0.26 estimate the CUDA-graph pool inside the window (gpu_worker.determine_available_memory
    calls profile_cudagraph_memory there unless graphs are off): what that capture leaves behind is counted too (one
    Qwen3-14B H100 setup logged 0.13 GiB on 0.15, 0.16 and 0.17 and 0.25 on 0.18). From 0.11 Worker.init_device
    sets up NCCL and custom all-reduce before the initial snapshot, so TP over NVLink adds only what the profile run
    creates (PyTorch's TP-group communicator), what the graph estimate leaves as on one GPU, and FlashInfer's fusion
    workspace (`fusion_workspace`, allreduce_fusion_workspace_bytes). Over PCIe vLLM turns custom all-reduce off and
    NCCL keeps its buffers mostly in host memory. Before 0.11 NCCL is set up inside the window."""
    rel = release(version)
    graph_window = rel.graph_estimate_in_window and graphs
    single = c.non_torch_single_gib if graph_window else c.non_torch_single_early_gib
    if engine == "v0":
        gib = c.non_torch_v06_gib if rel.v0_counts_cuda_context else c.non_torch_v0_gib
    elif tp > 1 and interconnect == "pcie":
        gib = single + PCIE_NCCL_GIB
    elif tp > 1:
        gib = c.non_torch_tp_gib + (c.non_torch_single_gib - c.non_torch_single_early_gib if graph_window else 0.0)
        if not rel.nccl_before_snapshot:
            # the window also holds what 0.11 moved before it: vLLM's own TP communicator (and the expert-parallel
            # one, built for every model in 0.9-0.13), each the size of the one the 0.11+ profile run creates, and
            # custom all-reduce's buffers (parallel_state.initialize_model_parallel, custom_all_reduce.py)
            communicator = c.non_torch_tp_gib - c.non_torch_single_early_gib
            gib += communicator * (2 if rel.ep_group_for_every_model else 1) + CUSTOM_ALL_REDUCE_GIB
    elif pp > 1:
        gib = c.non_torch_pp_only_gib
    else:
        gib = single
    return int(gib * GiB) + fusion_workspace


def start_used_bytes(engine: str, version: tuple[int, int, int], world_size: int,
                     c: ProfileCoefficients = COEFFICIENTS, interconnect: str = "nvlink") -> int:
    """GPU memory already in use when vLLM takes its initial snapshot (what the free-memory check sees)."""
    gib = c.context_gib
    if engine == "v1" and release(version).nccl_before_snapshot and world_size > 1:
        # Worker.init_device initialises NCCL before MemorySnapshot from 0.11: its device buffers over NVLink (the
        # fitted figure, H100s); over PCIe NCCL keeps them in host memory
        gib += c.nccl_init_gib if interconnect != "pcie" else PCIE_NCCL_GIB
    return int(gib * GiB)


def cuda_graph_sizes(version: Version, max_num_seqs: int, max_num_batched_tokens: int,
                     compute_capability: tuple[int, int] = (9, 0), decode_query_len: int = 1,
                     performance_mode: str = "balanced") -> tuple[int, ...]:
    """Token counts vLLM captures CUDA graphs for by default (config/vllm.py VllmConfig._set_cudagraph_sizes);
    `decode_query_len`: 1 + the speculative tokens, which each decode step carries; the interactivity performance
    mode captures every size from 1 to 32 where the others start 1, 2, 4."""
    rel = release(version)
    cap = 1024 if rel.graph_cap_1024_on_blackwell and compute_capability[0] == 10 else 512
    per_seq = 2 * (decode_query_len if rel.graph_sizes_scale_with_spec else 1)
    largest = min(per_seq * max_num_seqs, cap) if rel.graph_sizes_follow_max_num_seqs else cap
    largest = min(largest, max_num_batched_tokens)
    small = range(1, min(largest, 32) + 1) if performance_mode == "interactivity" else (1, 2, 4)
    if rel.graph_sizes_step_16_above_256:
        sizes = [s for s in small if s <= largest] + list(range(8, min(largest + 1, 256), 8)) + \
            list(range(256, largest + 1, 16))
    else:
        sizes = [1, 2, 4] + list(range(8, largest + 1, 8))
    if rel.graph_sizes_add_batched_tokens and max_num_batched_tokens <= largest:
        sizes.append(max_num_batched_tokens)
    if rel.graph_sizes_add_max_num_seqs and max_num_seqs <= largest:
        sizes.append(max_num_seqs)
    return tuple(sorted({s for s in sizes if s <= max_num_batched_tokens}))


def cuda_graph_captures(version: Version, max_num_seqs: int, max_num_batched_tokens: int,
                        compute_capability: tuple[int, int] = (9, 0)) -> int:
    """Capture passes: one piecewise graph per size, plus a full decode graph per size <= max_num_seqs from 0.11
    (gpu_model_runner.capture_model / cudagraph_dispatcher)."""
    return _captures(version, cuda_graph_sizes(version, max_num_seqs, max_num_batched_tokens, compute_capability),
                     max_num_seqs)


def _captures(version: Version, sizes: tuple[int, ...], max_num_seqs: int) -> int:
    full = [s for s in sizes if s <= max_num_seqs] if release(version).full_and_piecewise_graphs else []
    return len(sizes) + len(full)


# The runs the graph coefficients are fitted on (vLLM 0.19, max_num_seqs 1024, 8192 batched tokens): 102 captures,
# the largest of 512 tokens. Other settings scale the per-capture part by their capture count and the MoE
# workspace by their largest capture.
REFERENCE_CAPTURES = cuda_graph_captures((0, 19, 0), 1024, 8192)
REFERENCE_LARGEST = max(cuda_graph_sizes((0, 19, 0), 1024, 8192))


@dataclass(frozen=True)
class GraphShape:
    """How many graphs a run captures and the largest one's tokens (by default, the fitted runs')."""

    captures: int = REFERENCE_CAPTURES
    largest: int = REFERENCE_LARGEST

    @classmethod
    def of(cls, version: Version, max_num_seqs: int, max_num_batched_tokens: int,
           compute_capability: tuple[int, int] = (9, 0), decode_query_len: int = 1,
           performance_mode: str = "balanced") -> GraphShape:
        sizes = cuda_graph_sizes(version, max_num_seqs, max_num_batched_tokens, compute_capability, decode_query_len,
                                 performance_mode)
        return cls(_captures(version, sizes, max_num_seqs), max(sizes) if sizes else 0)


def _graph_gib(model: ModelSpec, layers_on_rank: int, tp: int, shape: GraphShape, base: float, per_layer: float,
               per_layer_tp: float, moe_per_m: float) -> float:
    per_capture = (per_layer + per_layer_tp / tp) * layers_on_rank * shape.captures / REFERENCE_CAPTURES
    gib = base + per_capture
    moe = model.moe
    if moe and any(moe.moe_layers):  # fused-MoE buffers of the largest capture, on the MoE layers of the rank
        moe_layers = round(sum(moe.moe_layers) * layers_on_rank / model.num_layers)
        gib += moe_per_m * moe_layers * moe.top_k * moe.expert_intermediate_size / tp / 1e6 * \
            shape.largest / REFERENCE_LARGEST
    return gib


def cuda_graph_bytes(model: ModelSpec, layers_on_rank: int, enforce_eager: bool,
                     c: ProfileCoefficients = COEFFICIENTS, tp: int = 1, shape: GraphShape = GraphShape()) -> int:
    """What capture takes ("Graph capturing finished ... took X GiB", gpu_model_runner.capture_model); 0 eager."""
    if enforce_eager or not shape.captures:
        return 0
    return int(_graph_gib(model, layers_on_rank, tp, shape, c.graph_base_gib, c.graph_per_layer_gib,
                          c.graph_per_layer_tp_gib, c.graph_moe_gib_per_m) * GiB)


def cuda_graph_estimate_bytes(model: ModelSpec, layers_on_rank: int, enforce_eager: bool,
                              c: ProfileCoefficients = COEFFICIENTS, tp: int = 1,
                              shape: GraphShape = GraphShape()) -> int:
    """vLLM's own estimate, which 0.20+ subtracts from the KV budget (gpu_model_runner.profile_cudagraph_memory:
    the largest capture, plus the second-largest's cost for each other one)."""
    if enforce_eager or not shape.captures:
        return 0
    return int(_graph_gib(model, layers_on_rank, tp, shape, c.graph_est_base_gib, c.graph_est_per_layer_gib,
                          c.graph_est_per_layer_tp_gib, c.graph_est_moe_gib_per_m) * GiB)
