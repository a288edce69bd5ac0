"""Every chain family, found in real diffusers DiTs (tiny configs, random weights, CPU), and the
compiled model bitwise equal to eager.

Counts per model, for modulate / residual_gate / rope / qk_norm / ... / norm, are those of the
captured graph. ``norm``: the norms no other family fused (Sana's caption RMSNorm, QwenImage's
txt_norm, Chroma's approximator RMSNorm, CogVideoX's norm_final, HunyuanVideo's token-refiner
LayerNorms; Wan's cross-attention FP32LayerNorm in an fp32 model, where it has no casts and the
modulate family does not take it).
QwenImage differs from the 4L+1 / 4L of a per-block count: its forward discards the text stream
of the last block (only ``hidden_states`` reaches ``norm_out``), so that block's ``txt_norm2``
modulation and both text-stream gated residuals are dead code, which torch.compile removes:
4L modulates and 4L-2 gated residuals, 4 and 2 for one layer.
"""
import logging

import pytest
import torch

import sgdiff
from sgdiff import zoo
from tests.helpers import NOT_ADMITTED, bits_equal

FAMILIES = ("modulate", "residual_gate", "rope", "qk_norm", "activation", "linear_attention", "norm")
EXPECTED = {
    # 1 double + 1 single block: 4L+S+1, 4L+S, 2L+2S, 4L+2S, S (GELU into the single block's cat)
    "flux": (6, 5, 4, 6, 1, 0, 0),
    "flux2": (6, 5, 4, 6, 3, 0, 0),  # SwiGLU: 2 double-block FFs + the single block's
    # GLUMBConv: conv_inverted + SiLU, conv_depth + its GLU; linear attention: q, k, padded v
    # and the output (cast back to bf16: an fp32 model has no cast there, see BY_DTYPE);
    # residual updates: 2 gated and the cross-attention's `attn / rescale_output_factor + x`
    "sana": (3, 3, 0, 0, 2, 4, 1),
    "sd35": (9, 7, 0, 10, 0, 0, 0),  # 2 layers, layer 0 dual attention: 4L+X, 4L-2+X, -, 4L+2X
    "pixart": (3, 3, 0, 0, 0, 0, 0),  # 2 gated residuals (one divided by rescale_output_factor), 1 rescaled
    # Wan's cross-attention norm is an FP32LayerNorm: cast, LayerNorm, cast back (bf16 only)
    "wan": (4, 2, 2, 4, 0, 0, 0),
    "qwenimage": (4, 2, 4, 4, 0, 0, 1),  # see the module docstring
    "chroma": (6, 5, 4, 6, 1, 0, 1),  # Flux's blocks: Flux's counts
    # 1 layer: LayerNormZero modulates image and text before attention and before the FF (4) and
    # norm_out (1); gated residuals: attention and FF on both streams, but the text stream's last
    # FF residual is dead code (only the image stream reaches norm_final, no RoPE); per-head
    # LayerNorm on q and k
    "cogvideox": (5, 3, 0, 2, 0, 0, 1),
    # 1 layer: modulated RMSNorms before attention and FF, and norm_out (2L+1); attention and FF
    # gated residuals (2L); RoPE on the self-attention's q and k; RMSNorms across heads on q and
    # k of both attentions, the self-attention's before its RoPE, then the head split
    "ltx": (3, 2, 2, 4, 0, 0, 0),
    # 1 double + 1 single block + 1 token-refiner layer: modulates 4 (both streams, before attention
    # and FF) + 1 (single) + norm_out; gated residuals 4 (double) + 1 (single) + 2 (the refiner's
    # attention and FF); RoPE on the image q and k of each block; QK norms 4 (double) + 2
    # (single); the single block's GELU into its cat
    "hunyuanvideo": (6, 7, 4, 6, 1, 0, 2),
    # 1 layer: only the image stream reaches norm_out, so the last block's text stream past its
    # attention is dead code (its gated attention residual, its FF's modulate and residual):
    # modulates 2 (both streams before attention) + 1 (image FF) + norm_out; gated residuals 2
    # (image attention and FF); RoPE on the image tokens' q and k; per-head LayerNorm on q and k
    "cogview4": (4, 2, 2, 2, 0, 0, 0),
    # 1 layer, 1 noise-refiner layer (both modulated), 1 context-refiner layer (not): modulates:
    # the RMSNorm * (1 + scale) before attention and FF of the 2 modulated blocks + norm_out (5);
    # residuals: attention and FF of each block, tanh-gated or plain (6); RoPE and per-head
    # RMSNorm on q and k of each (6, 6); the FF's FP32SiLU GLU (3); norms the modulations leave:
    # norm2 and ffn_norm2 of the modulated blocks, all four of the context refiner's, and the
    # caption embedder's RMSNorm (9)
    "lumina2": (5, 6, 6, 6, 3, 0, 9),
    # 1 MMDiT + 1 single block, bf16: every LayerNorm is an FP32LayerNorm cast back to bf16 before
    # its modulation, so an adaLN site is two ops (the cast LayerNorm, then the modulate): 8 per
    # MMDiT block (norm1, norm1_context, norm2, norm2_context), 4 per single block; the QK norms
    # (FP32LayerNorm over head_dim: 4 per MMDiT block, 2 per single block) are cast LayerNorms too,
    # which the modulate family takes; + norm_out's bare `x * (1 + scale) + shift` (19). Gated
    # residuals 4 + 2; the SwiGLU-style feed-forwards' SiLU-gates, one per stream and block (3).
    # (1 MMDiT block alone: the last block's text stream is dead code, fewer.)
    "auraflow": (19, 6, 0, 0, 3, 0, 0),
    # 4 layers (3 plain + 1 with a long skip, the fewest that has one), bf16: the three FP32LayerNorms
    # of a block (AdaLayerNormShift's norm, norm2, norm3), cast back: cast LayerNorms in the modulate
    # family (3 a block, +1 skip_norm), + norm_out's LayerNorm-modulate (14); attention outputs
    # divided by rescale_output_factor and added (2 a block); RoPE on q and k of the
    # self-attention and q of the cross-attention (3 a block); LayerNorm QK norms (4 a block).
    # Not sites: the ungated FF residual, AdaLayerNormShift's `norm(x) + shift` past its norm.
    "hunyuandit": (14, 8, 12, 16, 0, 0, 0),
    # 1 spatial + 1 temporal block (ada_norm_single): LayerNorm-modulates before attention and FF
    # of each (4) + norm_out (1); gated residuals 2 a block + the spatial block's cross-attention
    # residual (5)
    "latte": (5, 5, 0, 0, 0, 0, 0),
    "skyreels_v2": (4, 2, 2, 4, 0, 0, 0),  # Wan's blocks: Wan's counts
    # 1 layer: LayerNorm-modulates before attention and FF (2) + norm_out (1); gated attention and FF
    # residuals + the cross-attention's output / rescale_output_factor added back (3). Its RoPE
    # (rotate-half by slicing the head dim's halves) is not found: no rope spelling takes it yet.
    "allegro": (3, 3, 0, 0, 0, 0, 0),
    # 1 layer: LayerNorm-modulates before attention and FF + norm_out (3); gated attention and FF
    # residuals + the cross-attention's rescaled residual (3); Wan's even/odd RoPE on relu(q) and
    # relu(k) of the linear attention (2); RMSNorms across heads on q and k of both attentions (4);
    # GLUMBConv's conv + SiLU and its GLU (2); the caption RMSNorm (1). Its linear attention (RoPE
    # between the ReLU and the cast, no padded v) is not Sana's spelling: not found. The temporal
    # conv's residual: the conv has no bias, no conv_residual site.
    "sanavideo": (3, 3, 2, 4, 2, 0, 1),
    # 1 Wan block + 1 VACE block: each Wan's counts (see "wan"), the VACE block's control hint
    # added back `hidden_states + hint * scale` one gated residual more
    "wan_vace": (7, 5, 4, 8, 0, 0, 0),
    # 1 MMDiT + 1 image-only block, bf16: its adaLN norms are FP32LayerNorms cast back before the
    # modulation, two ops a site (see "auraflow"): 4 sites a block, less the last block's dead text
    # norm2 (7, so 14) + norm_out's plain LayerNorm-modulate (15). Gated residuals: attention and FF
    # of both streams (4 a block) less the last block's 2 dead text ones (6); RoPE on the image
    # slice of q and k (2 a block); per-head LayerNorm QK norms 4 (MMDiT) + 2; the caption RMSNorm
    # and norm_final (2)
    "easyanimate": (15, 6, 4, 6, 0, 0, 2),
    # 1 layer: LayerNorm-modulates of image and text before attention and FF + norm_out (5); gated
    # residuals 4 a block less the last block's dead text FF one (3); LayerNorm QK norms (2)
    "cogview3plus": (5, 3, 0, 2, 0, 0, 0),
    # Flux's blocks (1 double + 1 single): modulates 4 + 1 + norm_out, gated residuals 4 + 1, RoPE
    # on the joint q and k of each block, RMSNorm QK norms 4 + 2; SwiGLU feed-forwards (ff,
    # ff_context) and the single block's act(gate) * proj_mlp (3); the context embedder's RMSNorm (1)
    "ovis_image": (6, 5, 4, 6, 3, 0, 1),
    # Flux's blocks: Flux's counts (its double blocks' GELU-tanh feed-forwards are close, not admitted)
    "longcat_image": (6, 5, 4, 6, 1, 0, 0),
    # 1 layer (AdaLayerNormZero, class labels): LayerNorm-modulates before attention and FF + the
    # final `norm_out(x) * (1 + scale) + shift` (3); gated attention and FF residuals (2)
    "dit": (3, 2, 0, 0, 0, 0, 0),
}
BY_DTYPE = {("sana", "fp32"): (3, 3, 0, 0, 2, 3, 1), ("wan", "fp32"): (3, 2, 2, 4, 0, 0, 1),
            # fp32: the casts are gone, so the adaLN sites are one LayerNorm-modulate each (4 + 2 + 1)
            # and the QK norms plain LayerNorms (qk_norm: 4 + 2)
            ("auraflow", "fp32"): (7, 6, 0, 6, 3, 0, 0),
            # fp32: the FP32LayerNorms without their casts are plain norms (norm family: 3 a block + skip_norm)
            ("hunyuandit", "fp32"): (1, 8, 12, 16, 0, 0, 13), ("skyreels_v2", "fp32"): (3, 2, 2, 4, 0, 0, 1),
            ("wan_vace", "fp32"): (5, 5, 4, 8, 0, 0, 2),
            # fp32: one LayerNorm-modulate a site (7 + norm_out)
            ("easyanimate", "fp32"): (8, 6, 4, 6, 0, 0, 2)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture(scope="module", params=[(m, d) for m in EXPECTED for d in DTYPES], ids=lambda p: f"{p[0]}-{p[1]}")
def case(request):
    """One model per name and dtype, built once: (name, model, kwargs, eager output)."""
    name, dtype = request.param
    logging.getLogger("diffusers").setLevel(logging.ERROR)  # the `.to(dtype)` fp32-modules notice
    model, kwargs = zoo.build(name, dtype=DTYPES[dtype])
    with torch.no_grad():
        eager = model(**kwargs)[0]
    return name, dtype, model, kwargs, eager


def test_every_chain_is_found_and_rewritten(case):
    name, dtype, model, kwargs, _ = case
    report = sgdiff.explain(model, **kwargs)
    assert tuple(report.counts[f] for f in FAMILIES) == BY_DTYPE.get((name, dtype), EXPECTED[name]), str(report)
    # nothing of these families was found and left eager, but for close chains (linear + GELU)
    assert all(reason == NOT_ADMITTED for _, _, reason in report.skipped), \
        report.skipped
    assert all(report.found[f] == report.counts[f] for f in FAMILIES if f != "activation"), report.skipped


def test_explaining_models_in_a_row_reports_first_compiles():
    """Explains of other models one after another (other sizes to torch.compile, which traces
    each from explain's own frame): each report is that of a first, static compile, not one
    with the symbolic sizes torch.compile's automatic dynamic gives a recompile."""
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    for name in ("flux", "sana"):
        model, kwargs = zoo.build(name, dtype=torch.bfloat16)
        report = sgdiff.explain(model, **kwargs)
        assert tuple(report.counts[f] for f in FAMILIES) == EXPECTED[name], str(report)
        assert all(reason == NOT_ADMITTED for _, _, reason in report.skipped), report.skipped


def test_compiled_model_is_bitwise_equal_to_eager(case):
    name, _, model, kwargs, eager = case
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(model, backend="sgdiff")(**kwargs)[0]
    finally:
        torch._dynamo.reset()
    assert bits_equal(got, eager)


# extra-high adds the close rewrites: each projection + GELU-tanh (feed-forwards, caption and
# text projections) becomes linear_gelu_tanh, beside the lossless activation sites
EXTRA_HIGH_ACTIVATION = {"flux": 3, "wan": 2, "pixart": 2, "sd35": 3, "qwenimage": 1, "sana": 3}


@pytest.mark.parametrize("name", sorted(EXTRA_HIGH_ACTIVATION))
def test_extra_high_adds_each_projection_gelu_and_stays_close(name):
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    model, kwargs = zoo.build(name, dtype=torch.bfloat16)
    lossless, extra = sgdiff.explain(model, **kwargs), sgdiff.explain(model, quality="extra-high", **kwargs)
    assert extra.counts["activation"] == EXTRA_HIGH_ACTIVATION[name], str(extra)
    assert all(extra.counts[f] == lossless.counts[f] for f in FAMILIES if f != "activation")
    assert not extra.skipped
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            eager = model(**kwargs)[0].float()
            got = torch.compile(model, backend="sgdiff", options={"quality": "extra-high"})(**kwargs)[0].float()
    finally:
        torch._dynamo.reset()
    assert not torch.equal(got, eager)  # the rewrite ran: one rounding fewer
    assert (got - eager).abs().max() <= 0.05 * eager.abs().max()
