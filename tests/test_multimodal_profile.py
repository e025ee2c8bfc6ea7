"""The vision encoder's part of vLLM's profile run (oomguard/engines/vllm/multimodal.py), pinned to the vLLM code it
mirrors: each test names the file and function whose arithmetic it checks."""

import dataclasses
import json
from pathlib import Path

import pytest

from oomguard.engines.vllm.multimodal import (PIXEL_BYTES, EncoderProfile, MultimodalConfig, encoder_profile,
                                              max_tokens_per_item, smart_resize)
from oomguard.engines.vllm.releases import release
from oomguard.models.spec import _vision_spec, parse_config

CATALOG = Path(__file__).resolve().parents[1] / "oomguard" / "models" / "catalog"


def _model(name: str):
    entry = json.loads((CATALOG / f"{name}.json").read_text())
    return parse_config(entry["config"], entry["id"])


GEMMA3 = _model("google--gemma-3-27b-it")
QWEN25_VL = _model("Qwen--Qwen2.5-VL-7B-Instruct")
QWEN3_VL = _model("Qwen--Qwen3-VL-8B-Instruct")
QWEN3_VL_MOE = _model("Qwen--Qwen3-VL-30B-A3B-Instruct")
MLLAMA = _model("meta-llama--Llama-3.2-11B-Vision-Instruct")
TEXT = _model("Qwen--Qwen2.5-7B-Instruct")


def _profile(model, version, mm=None, engine="v1", max_model_len=32768, max_num_seqs=256, mnbt=8192, **kw):
    return encoder_profile(model, mm, version, engine, max_model_len, max_num_seqs, mnbt, 2, 1, **kw)


def test_text_only_model_has_no_encoder_profile():
    """A config without vision_config builds no vision tower (no SupportsMultiModal model class)."""
    assert _profile(TEXT, (0, 19, 0)) is None


def test_gemma3_at_8192_batched_tokens_profiles_32_images_of_256_tokens():
    """gemma3_mm.py Gemma3ProcessingInfo.get_num_image_tokens: (0 crops + 1) x image_seq_length 256;
    multimodal/encoder_budget.py: budget max(8192, 256) = 8192, _get_max_items max(1, min(8192 // 256,
    256 seqs x min(999, 32768 // 256))) = 32."""
    p = _profile(GEMMA3, (0, 19, 0), max_model_len=131072)
    assert (p.modality, p.tokens_per_item, p.items, p.budget_tokens, p.profiled) == ("image", 256, 32, 8192, True)
    assert p.expected_log == ("Encoder cache will be initialized with a budget of 8192 tokens, and profiled with 32 "
                              "image items of the maximum feature size.")
    assert p.notes[0].startswith("vLLM profiles the vision encoder with 32 images of 256 tokens (encoder budget 8192 "
                                 "tokens)")
    # SigLIP 896/14 = 64 x 64 positions per image, float32 pixels, outputs 256 x 5376 in bf16
    assert p.patches_per_item == 4096
    pixels, outputs = 32 * 3 * 896 * 896 * PIXEL_BYTES, 32 * 256 * 5376 * 2
    assert p.held_bytes == pixels + outputs
    per_position = 2 * (2 * 1152 + 2 * 4304)            # SigLIP: LayerNorm'd residual, fc1 and its GELU
    assert p.encoder_peak_bytes == pixels + outputs + 32 * 4096 * per_position


def test_qwen25_vl_128k_profiles_one_14_frame_video_as_the_real_log_says():
    """qwen2_vl.py get_mm_max_tokens_per_item: image 16384 (3584^2 at max_pixels 12845056), video frames while
    ceil(n / 2) x 16384 <= 128000, capped at _MAX_FRAMES_PER_VIDEO 14 -> 7 x 16384 = 114688 > image; the budget grows
    to it and one item is profiled. The 0.23.0 log of this model at the default max_model_len reads exactly so."""
    p = _profile(QWEN25_VL, (0, 23, 0), max_model_len=128000, mnbt=2048)
    assert p.expected_log == ("Encoder cache will be initialized with a budget of 114688 tokens, and profiled with 1 "
                              "video items of the maximum feature size.")
    assert (p.modality, p.tokens_per_item, p.items, p.budget_tokens) == ("video", 114688, 1, 114688)
    assert p.patches_per_item == 458752                 # 7 x 256 x 256 ViT positions
    pixels = 458752 * 3 * 2 * 14 * 14 * PIXEL_BYTES     # pixel_values_videos [positions, C x T x 14 x 14], fp32
    outputs = 114688 * 3584 * 2
    assert p.held_bytes == pixels + outputs
    # Qwen2.5-VL's ViT: gated SiLU MLP of 3420 over width 1280, about 25 KB a position (spec calibration ~32 KB total)
    assert p.encoder_peak_bytes == pixels + outputs + 458752 * 2 * (2 * 1280 + 3 * 3420)
    assert any("larger than max_num_batched_tokens" in n for n in p.notes)


def test_every_limit_zero_profiles_nothing():
    """v1/core/encoder_cache_manager.py compute_mm_encoder_budget: no modality left -> budget 0, "Encoder cache will
    not be initialized", and profile_run skips the encoder."""
    mm = MultimodalConfig(limits={"image": 0, "video": 0})
    p = _profile(QWEN25_VL, (0, 19, 0), mm)
    assert not p.profiled and p.held_bytes == p.encoder_peak_bytes == 0 and p.items == 0
    assert "explicitly disabled via limit_mm_per_prompt" in p.notes[0]
    assert max_tokens_per_item(QWEN25_VL, mm, (0, 19, 0), 32768) == {}


def test_one_limit_zero_drops_that_modality():
    """registry.get_max_tokens_per_item_by_nonzero_modality: a 0 limit leaves the modality out of T."""
    p = _profile(QWEN25_VL, (0, 23, 0), MultimodalConfig(limits={"video": 0}), max_model_len=128000)
    assert (p.modality, p.tokens_per_item, p.items, p.budget_tokens) == ("image", 16384, 1, 16384)


def test_skip_mm_profiling_flag():
    """gpu_model_runner.profile_run: "Skipping memory profiling for multimodal encoder and encoder cache." when
    multimodal_config.skip_mm_profiling (config from 0.10.1); older releases have no such argument."""
    mm = MultimodalConfig.from_flags({"skip_mm_profiling": True})
    p = _profile(GEMMA3, (0, 19, 0), mm)
    assert not p.profiled and p.encoder_peak_bytes == 0 and "--skip-mm-profiling" in p.notes[0]
    old = _profile(GEMMA3, (0, 10, 0), mm)
    assert old.profiled and any("has no --skip-mm-profiling" in n for n in old.notes)


def test_v0110_pads_every_output_to_the_encoder_budget():
    """gpu_model_runner.profile_run 0.11.0-0.11.2: output.new_zeros((encoder_budget, hidden)) for each of the N
    outputs; T is the contiguous placeholder (get_mm_max_contiguous_tokens: "\\n\\n" boi 256 eoi "\\n\\n" = 260),
    N = 8192 // 260 = 31. 0.12.0 pads to T only; 0.13.0 counts embeddings and does not pad."""
    p = _profile(GEMMA3, (0, 11, 0), max_model_len=131072)
    assert (p.tokens_per_item, p.items, p.budget_tokens, p.embeds_per_item) == (260, 31, 8192, 256)
    pixels = 31 * 3 * 896 * 896 * PIXEL_BYTES
    assert p.held_bytes == pixels + 31 * 8192 * 5376 * 2          # ~2.5 GiB of padded outputs
    assert any("pads each of the 31 encoder outputs to 8192 rows" in n for n in p.notes)
    assert _profile(GEMMA3, (0, 12, 0), max_model_len=131072).held_bytes == pixels + 31 * 260 * 5376 * 2
    new = _profile(GEMMA3, (0, 13, 0), max_model_len=131072)
    assert (new.tokens_per_item, new.items) == (256, 32)
    assert new.held_bytes == 32 * 3 * 896 * 896 * PIXEL_BYTES + 32 * 256 * 5376 * 2


def test_max_pixels_override_lowers_qwen_image_tokens():
    """qwen2_vl.py _get_vision_info: --mm-processor-kwargs max_pixels replaces size["longest_edge"];
    get_image_size_with_most_features factorizes 1003520 // 28^2 = 1280 = 32 x 40 (0.13+), while 0.12 smart_resizes
    a 9999999^2 square to 980^2 (1225 tokens)."""
    default = max_tokens_per_item(QWEN25_VL, None, (0, 23, 0), 32768)
    assert default["image"] == 16384
    mm = MultimodalConfig(processor_kwargs={"max_pixels": 1003520})
    assert max_tokens_per_item(QWEN25_VL, mm, (0, 23, 0), 32768)["image"] == 1280
    assert max_tokens_per_item(QWEN25_VL, mm, (0, 12, 0), 32768)["image"] == 1225
    p = _profile(QWEN25_VL, (0, 23, 0), MultimodalConfig(limits={"video": 0}, processor_kwargs={"max_pixels": 1003520}))
    assert (p.tokens_per_item, p.items, p.budget_tokens) == (1280, 6, 8192)
    # min_pixels above max_pixels's square lifts the image back up (smart_resize's min_pixels branch)
    assert smart_resize(9999999, 9999999, 28, 3136, 12845056) == (3584, 3584)


def test_qwen_video_frames_per_release():
    """qwen2_vl.py _MAX_FRAMES_PER_VIDEO 16 (to 0.10.2) then 14; up to 0.10.1 get_num_frames_with_most_features
    subtracts the images' tokens from seq_len first."""
    video_only = MultimodalConfig(limits={"image": 0})
    assert max_tokens_per_item(QWEN25_VL, video_only, (0, 10, 2), 300000)["video"] == 8 * 16384
    assert max_tokens_per_item(QWEN25_VL, video_only, (0, 11, 0), 300000)["video"] == 7 * 16384
    assert max_tokens_per_item(QWEN25_VL, None, (0, 10, 1), 128000)["video"] == 6 * 16384   # 128000 - 16384
    assert max_tokens_per_item(QWEN25_VL, None, (0, 10, 2), 128000)["video"] == 7 * 16384
    assert max_tokens_per_item(QWEN25_VL, None, (0, 23, 0), 20000)["video"] == 16384        # 2 frames, one grid


def test_dummy_built_for_max_num_batched_tokens_before_011():
    """gpu_model_runner 0.8.5-0.9.2 get_decoder_dummy_data(seq_len=self.max_num_tokens): a one-frame Qwen video
    although T counts the frames max_model_len holds."""
    p = _profile(QWEN25_VL, (0, 9, 2), max_model_len=128000, mnbt=8192)
    assert (p.tokens_per_item, p.items, p.patches_per_item) == (98304, 1, 65536)
    assert any("undercounts" in n for n in p.notes)


def test_modality_tie_break():
    """encoder_budget.py get_modality_with_max_tokens: max by T, the first listed winning ties up to 0.16
    (key=x[1]) and the later name from 0.17 (key=(x[1], x[0]))."""
    assert _profile(QWEN25_VL, (0, 16, 0), max_model_len=20000).modality == "image"
    assert _profile(QWEN25_VL, (0, 17, 0), max_model_len=20000).modality == "video"


def test_items_rule_per_release():
    """profile_run: min(cdiv(budget, T), reqs x limit) in 0.7.3-0.9.2; max(1, min(budget // T, ...)) in 0.10.0;
    MultiModalBudget.get_max_items (0.10.1+) with max_items_per_prompt = max(1, min(limit, max_model_len // T));
    the default limit is 1 up to 0.8.0 and 999 from 0.8.5 (V1)."""
    assert _profile(GEMMA3, (0, 9, 2), mnbt=8000).items == 32          # cdiv(8000, 256)
    assert _profile(GEMMA3, (0, 10, 0), mnbt=8000).items == 31
    assert _profile(GEMMA3, (0, 8, 0), max_num_seqs=8).items == 8       # 8 requests x limit 1
    assert _profile(GEMMA3, (0, 8, 5), max_num_seqs=8).items == 32      # 8 x 999
    one = MultimodalConfig(limits={"image": 1})
    assert _profile(GEMMA3, (0, 19, 0), one, max_num_seqs=4).items == 4
    assert _profile(GEMMA3, (0, 19, 0), max_model_len=512, max_num_seqs=4).items == 8   # per prompt 512 // 256
    assert _profile(GEMMA3, (0, 19, 0), MultimodalConfig(limits={"image": {"count": 2, "width": 512}}),
                    max_num_seqs=4).items == 8


def test_fixed_budget_in_066():
    """0.6.6 gpu_model_runner.profile_run: min(16384, 16384) // T items, no max() with the batch."""
    p = _profile(GEMMA3, (0, 6, 6))
    assert (p.budget_tokens, p.items) == (16384, 64)


def test_model_runner_v2_skips_encoder_for_dense_models_in_025_026():
    """config/vllm.py _is_default_v2_model_runner_model: "or not model_config.is_moe" from 0.25 puts dense VL models
    on MRV2, whose profile_run runs only _dummy_run until gpu/mm/encoder_runner.profile_encoder_cache (0.27). MoE
    models stay on the GPU model runner; from 0.27 MRV2 frees the pixel inputs inside execute_mm_encoder."""
    for version in ((0, 25, 0), (0, 26, 0)):
        p = _profile(QWEN3_VL, version)
        assert not p.profiled and p.runner == "mrv2" and "Model Runner V2" in p.notes[0]
        assert _profile(QWEN3_VL_MOE, version).profiled
    assert _profile(QWEN3_VL, (0, 24, 0)).runner == "gmr"
    assert _profile(QWEN3_VL, (0, 26, 0), model_runner="gmr").profiled
    p = _profile(QWEN3_VL, (0, 27, 0))
    assert p.profiled and p.runner == "mrv2" and p.held_bytes == 16384 * 16384 * 2   # outputs only


def test_qwen3_vl_tokens_and_deepstack_width():
    """qwen3_vl.py: image 4096^2 at longest_edge 16777216 over 32-pixel units = 16384 tokens; video two frames of
    longest_edge 25165824 / 2 = 12288 tokens (0.15+); embed_multimodal rows are out_hidden_size x (1 + 3 deepstack
    levels) wide; in 0.11-0.12 get_max_video_tokens multiplies by 12.5 for the timestamp text."""
    assert max_tokens_per_item(QWEN3_VL, None, (0, 19, 0), 262144) == {"image": 16384, "video": 12288}
    assert QWEN3_VL.vision.out_width == 4096 * 4
    p = _profile(QWEN3_VL, (0, 19, 0), max_model_len=262144)
    assert (p.modality, p.items, p.embeds_per_item) == ("image", 1, 16384)
    old = max_tokens_per_item(QWEN3_VL, None, (0, 11, 0), 262144)
    assert old["video"] == int(old["video"] / 12.5) * 12.5 and old["video"] > old["image"]


def test_v0_caps_sequences_by_multimodal_tokens():
    """worker/model_runner.py GPUModelRunnerBase.profile_run: max_num_seqs = min(max_num_seqs, mnbt //
    get_max_multimodal_tokens) (limits default 1 in V0), floored at 1 with a warning; every dummy sequence carries
    limit items of every modality, and a sequence too short for them grows the LM dummy."""
    p = _profile(GEMMA3, (0, 8, 5), engine="v0")
    assert (p.runner, p.items, p.tokens_per_item, p.lm_dummy_tokens) == ("v0", 32, 256, None)
    q = _profile(QWEN25_VL, (0, 8, 5), engine="v0", max_model_len=32768)
    assert q.items == 1 and q.lm_dummy_tokens == 32768                 # image 16384 + video 16384 > 8192
    assert any("Computed max_num_seqs (0) to be less than 1" in n for n in q.notes)


def test_mllama_runs_v0_encoder_decoder_until_0102():
    """worker/enc_dec_model_runner.py profile_run does not cut max_num_seqs: every sequence has one 4-tile image
    (mllama.py calc_token_per_chunk (560 / 14)^2 + 1 = 1601 per tile); registry.py lists Mllama as last supported
    in 0.10.2."""
    p = _profile(MLLAMA, (0, 10, 2), max_num_seqs=16)
    assert (p.runner, p.items, p.tokens_per_item, p.patches_per_item) == ("v0", 16, 6404, 4 * 1608)
    gone = _profile(MLLAMA, (0, 11, 0))
    assert not gone.profiled and "no longer serves" in gone.notes[0]


def _with_vision(config: dict, model_id: str):
    return dataclasses.replace(TEXT, model_id=model_id, vision=_vision_spec(config))


def test_llava_and_llava_next_tokens():
    """llava.py get_max_image_tokens: CLIP (336 / 14)^2 + 1, minus CLS ("default") = 576; llava_next.py
    get_image_size_with_most_features over the v1.6 pinpoints: 672x672 -> 48 x 48 unpadded + 48 newlines + 576 base
    = 2928."""
    clip = {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
            "num_hidden_layers": 24, "image_size": 336, "patch_size": 14}
    llava = _with_vision({"model_type": "llava", "vision_config": clip, "text_config": {"hidden_size": 4096}}, "l")
    assert max_tokens_per_item(llava, None, (0, 19, 0), 4096) == {"image": 576}
    nxt = _with_vision({"model_type": "llava_next", "vision_config": clip, "text_config": {"hidden_size": 4096},
                        "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]}, "n")
    assert max_tokens_per_item(nxt, None, (0, 19, 0), 4096) == {"image": 2928}
    assert _profile(nxt, (0, 19, 0)).patches_per_item == 5 * 577


def test_internvl_tiles_and_video():
    """internvl.py: 448 / 14 = 32^2 x 0.5^2 = 256 tokens a tile, max_dynamic_patch 12 + thumbnail = 3328; video
    (a Qwen2 LM) frames = (seq_len - 3328) // 256 in get_num_frames_with_most_features; max_dynamic_patch in
    --mm-processor-kwargs changes the tiles."""
    vit = {"model_type": "intern_vit_6b", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
           "image_size": 448, "patch_size": 14}
    model = _with_vision({"model_type": "internvl_chat", "downsample_ratio": 0.5, "max_dynamic_patch": 12,
                          "use_thumbnail": True, "vision_config": vit,
                          "llm_config": {"model_type": "qwen2", "hidden_size": 3584}}, "internvl")
    assert model.vision.out_width == 3584
    assert max_tokens_per_item(model, None, (0, 19, 0), 32768) == {"image": 3328, "video": 115 * 256}
    assert max_tokens_per_item(model, MultimodalConfig(processor_kwargs={"max_dynamic_patch": 6}), (0, 19, 0),
                               32768)["image"] == 7 * 256
    assert "video" not in max_tokens_per_item(model, None, (0, 8, 5), 32768)   # no video before 0.9


def test_other_catalog_families():
    """kimi_vl.py get_num_image_tokens on the 1024^2 dummy at in_token_limit 4096: 897 px padded to 924 = 33^2;
    mistral3.py / pixtral.py: ceil(1540 / 28)^2 = 3025 (+ one break per row in 0.10.1-0.12); mllama4.py: 16 + 1
    tiles of (336 / 14)^2 x 0.5^2 = 144."""
    assert max_tokens_per_item(_model("moonshotai--Kimi-VL-A3B-Instruct"), None, (0, 19, 0), 8192) == {"image": 1089}
    mistral = _model("mistralai--Mistral-Small-3.1-24B-Instruct-2503")
    assert max_tokens_per_item(mistral, None, (0, 19, 0), 8192) == {"image": 3025}
    assert max_tokens_per_item(mistral, None, (0, 11, 0), 8192) == {"image": 55 * 56}
    assert max_tokens_per_item(_model("meta-llama--Llama-4-Scout-17B-16E-Instruct"), None, (0, 19, 0),
                               8192) == {"image": 17 * 144}
    glm = _profile(_model("zai-org--GLM-4.1V-9B-Thinking"), (0, 19, 0))
    assert glm.estimated and any("estimated" in n for n in glm.notes)


def test_from_flags_reads_the_flag_dests():
    """engines/vllm/flags.py dests limit_mm_per_prompt (dict), mm_processor_kwargs (dict), skip_mm_profiling."""
    assert MultimodalConfig.from_flags({}) is None
    mm = MultimodalConfig.from_flags({"limit_mm_per_prompt": {"image": 2, "video": {"count": 0}},
                                      "mm_processor_kwargs": {"max_pixels": 1003520}})
    assert mm.limit("image", 999) == 2 and mm.limit("video", 999) == 0 and mm.limit("audio", 999) == 999
    assert mm.processor_kwargs == {"max_pixels": 1003520} and not mm.skip_profiling


def test_activation_peak_is_encoder_or_held_plus_lm():
    """profile_run: the encoder forward's peak, then its outputs (and inputs) held through _dummy_run."""
    p = EncoderProfile("image", 256, 32, 8192, held_bytes=10, encoder_peak_bytes=100, profiled=True, notes=())
    assert p.activation_peak(50) == 100 and p.activation_peak(95) == 105
    skipped = dataclasses.replace(p, profiled=False)
    assert skipped.activation_peak(50) == 50


@pytest.mark.parametrize("version,limit", [((0, 8, 0), 1), ((0, 8, 5), 999), ((0, 33, 0), 999)])
def test_release_default_limit(version, limit):
    """multimodal/registry.py init_mm_limits_per_prompt .get(key, 1) to 0.8.0; config get_limit_per_prompt
    999 (V1) from 0.8.5."""
    assert release(version).mm_default_limit == limit


def test_weights_of_vision_towers_unchanged_by_the_shape_fields():
    """The shape fields ride along; the weight estimate of the tower is the same number as before them."""
    assert QWEN25_VL.vision.params > 0 and QWEN25_VL.vision.note.startswith("vision tower estimated")
    assert (QWEN25_VL.vision.hidden, QWEN25_VL.vision.intermediate, QWEN25_VL.vision.gated) == (1280, 3420, True)
    assert (GEMMA3.vision.image_size, GEMMA3.vision.patch_size, GEMMA3.vision.gated) == (896, 14, False)
