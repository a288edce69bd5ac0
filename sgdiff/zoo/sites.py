"""The sites each zoo model holds, per chain family: what the lossless passes rewrite, and the
chains a model computes that no family rewrites yet, with the reason.

Counts are those of the captured graph of the ``tiny`` config (one block of each kind, see each
builder) in bf16, :data:`REWRITTEN_BY_DTYPE` where fp32 differs, and of ``blocks2`` (the real widths,
two blocks) in bf16, where a model's count changes with its block count: the two configs are the
layer differencing of a per-block count. ``tests/test_zoo.py`` holds every model to them;
``bench/zoo.py`` reports found against expected on the GPU; :func:`coverage` is the share of
expected sites rewritten over the whole zoo.

``norm``: the norms no other family fused (Sana's caption RMSNorm, QwenImage's txt_norm, Chroma's
approximator RMSNorm, CogVideoX's norm_final, HunyuanVideo's token-refiner LayerNorms; Wan's
cross-attention FP32LayerNorm in an fp32 model, where it has no casts and the modulate family does
not take it). QwenImage differs from the 4L+1 / 4L of a per-block count: its forward discards the
text stream of the last block (only ``hidden_states`` reaches ``norm_out``), so that block's
``txt_norm2`` modulation and both text-stream gated residuals are dead code, which torch.compile
removes: 4L modulates and 4L-2 gated residuals, 4 and 2 for one layer.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

FAMILIES = ("modulate", "residual_gate", "rope", "qk_norm", "activation", "linear_attention", "norm")
#: model -> sites rewritten at lossless per FAMILIES, tiny config, bf16 (and fp32 unless
#: REWRITTEN_BY_DTYPE says otherwise)
REWRITTEN = {
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
REWRITTEN_BY_DTYPE = {("sana", "fp32"): (3, 3, 0, 0, 2, 3, 1), ("wan", "fp32"): (3, 2, 2, 4, 0, 0, 1),
                      # fp32: the casts are gone, so the adaLN sites are one LayerNorm-modulate each (4 + 2 + 1)
                      # and the QK norms plain LayerNorms (qk_norm: 4 + 2)
                      ("auraflow", "fp32"): (7, 6, 0, 6, 3, 0, 0),
                      # fp32: the FP32LayerNorms without their casts are plain norms (norm family: 3 a block + skip_norm)
                      ("hunyuandit", "fp32"): (1, 8, 12, 16, 0, 0, 13), ("skyreels_v2", "fp32"): (3, 2, 2, 4, 0, 0, 1),
                      ("wan_vace", "fp32"): (5, 5, 4, 8, 0, 0, 2),
                      # fp32: one LayerNorm-modulate a site (7 + norm_out)
                      ("easyanimate", "fp32"): (8, 6, 4, 6, 0, 0, 2)}

#: model -> chains the model computes that no family rewrites: (family, sites in the tiny config,
#: sites at blocks2, reason). Expected = rewritten + missed.
MISSED: Dict[str, List[Tuple[str, int, int, str]]] = {
    "allegro": [("rope", 2, 4, "rotate-half RoPE by slicing the head dim's halves, cos/sin from an embedding "
                            "lookup: no rope spelling takes it yet")],
}

#: model -> sites rewritten per FAMILIES at blocks2 (bf16), where it differs from the tiny count:
#: a per-block count at two blocks where tiny has one (the difference is one block's sites), Chroma's
#: five approximator RMSNorms, HunyuanDiT without its long skip. (``explain`` on the meta device;
#: there CogVideoX's and CogView3-Plus's per-head QK LayerNorms are taken as cast LayerNorms by the
#: modulate family where a real device's graph gives them to qk_norm: their rows are a real device's,
#: 2L QK norms; Lumina2's full config does not run on the meta device: one main layer's sites more.)
BLOCKS2: Dict[str, Tuple[int, ...]] = {
    "sana": (5, 6, 0, 0, 4, 8, 1),
    "pixart": (5, 6, 0, 0, 0, 0, 0),
    "qwenimage": (8, 6, 8, 8, 0, 0, 1),
    "chroma": (6, 5, 4, 6, 1, 0, 5),
    "cogview4": (8, 6, 4, 4, 0, 0, 0),
    "hunyuandit": (9, 4, 6, 6, 0, 0, 0),
    "cogview3plus": (9, 7, 0, 4, 0, 0, 0),
    "dit": (5, 4, 0, 0, 0, 0, 0),
    "wan": (7, 4, 4, 8, 0, 0, 0),
    "cogvideox": (9, 7, 0, 4, 0, 0, 1),
    "ltx": (5, 4, 4, 8, 0, 0, 0),
    "skyreels_v2": (7, 4, 4, 8, 0, 0, 0),
    "allegro": (5, 6, 0, 0, 0, 0, 0),
    "sanavideo": (5, 6, 4, 8, 4, 0, 1),
    "lumina2": (7, 8, 8, 8, 4, 0, 11),
}

NOT_YET = {
    "MochiTransformer3DModel": "its attention processor calls torch.nonzero, a graph break under torch.compile's "
                               "defaults: the attention runs eagerly and each QK norm and RoPE compiles as a small "
                               "graph of its own, so its sites cannot be counted per block; its full config does not "
                               "run on the meta device (autocast has no 'meta' device type)",
    "ConsisIDTransformer3DModel": "its face injection `hidden + local_face_scale * cross_attention(...)` scales "
                                  "by a Python float, which the residual family skips ('update is not a tensor'); "
                                  "equal in fp32 and bf16 on the CPU, not registered until that spelling is a site",
    "OmniGenTransformer2DModel": "its RoPE module compares the largest position id with a limit in Python "
                                 "(`if seq_len > original_max_position_embeddings`): a graph break, and its full "
                                 "config cannot run on the meta device (.item() of a meta tensor)",
    "ZImageTransformer2DModel": "its forward takes lists (x, t, cap_feats) and returns a list, where the zoo's "
                                "contract (tests, benches, trajectories) is a tensor in and out; built and equal "
                                "in fp32 and bf16 on the CPU with Lumina2's counts, not yet registered",
}


def rewritten(name: str, dtype: str = "bf16", size: str = "tiny") -> Dict[str, int]:
    """family -> sites the lossless passes rewrite in zoo model ``name`` (``dtype``: fp32 or bf16)."""
    if size == "blocks2" and name in BLOCKS2:
        counts = BLOCKS2[name]
    else:
        counts = REWRITTEN_BY_DTYPE.get((name, dtype), REWRITTEN[name])
    return dict(zip(FAMILIES, counts))


def expected(name: str, dtype: str = "bf16", size: str = "tiny") -> Dict[str, int]:
    """family -> the sites of a config (tiny or blocks2): those rewritten and those :data:`MISSED`."""
    counts = rewritten(name, dtype, size)
    for family, tiny, blocks2, _ in MISSED.get(name, ()):
        counts[family] += blocks2 if size == "blocks2" else tiny
    return counts


def coverage(dtypes=("fp32", "bf16")) -> Tuple[int, int]:
    """(sites rewritten, sites expected) over every zoo model and ``dtypes``, tiny configs."""
    done = sum(sum(rewritten(m, d).values()) for m in REWRITTEN for d in dtypes)
    return done, sum(sum(expected(m, d).values()) for m in REWRITTEN for d in dtypes)
