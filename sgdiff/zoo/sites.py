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

import dataclasses
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
    "wan22_ti2v": (4, 2, 2, 4, 0, 0, 0),  # Wan's blocks modulated per token: Wan's counts
    # 1 layer: LayerNorm-modulates before attention and FF (2) + norm_out (1); gated attention and FF
    # residuals + the cross-attention's output / rescale_output_factor added back (3); its RoPE on each third of
    # q and k (t, h, w axes), rotate-half by slicing each third's halves (6)
    "allegro": (3, 3, 6, 0, 0, 0, 0),
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
    # 1 per-mode block a mode (text, image; the reference-image mode's blocks are not run at text-to-image) + 1 joint
    # single block: modulates 1 a mode block `(1 + scale) * norm(x) + shift`, 2 in the single block (text, content),
    # + norm_out (5); gated residuals `x + gate * (attn + ff)` 1 a mode block, 2 in the single block less the last
    # block's text one, dead code (only the content reaches norm_out) (3); RoPE on q and k of the 3 attentions (6);
    # RMSNorm QK norms, fp32 modules on `q.float()` (6); the 3 SwiGLU feed-forwards (3). Per block (+1 of each
    # kind): (4, 4, 6, 6, 3, 0, 0). bf16: each RoPE is found twice, once skipped ("not cast back to x's dtype": it
    # runs on the fp32 norm output and is cast with `.to(value.dtype)` after), once rewritten.
    "flux3": (5, 3, 6, 6, 3, 0, 0),
    # Flux's blocks (no pooled projection, no guidance): Flux's counts; the double blocks' GELU-tanh feed-forwards
    # (2) are close, not admitted at lossless, as in Flux
    "bria": (6, 5, 4, 6, 1, 0, 0),
    # Bria's blocks, each block's text half a projection of one text-encoder layer: Flux's counts
    "bria_fibo": (6, 5, 4, 6, 1, 0, 0),
    # 1 noise-refiner layer, 1 plain + 1 injection main layer, 1 Perceiver layer: modulates: the refiner's
    # `RMSNorm(x) * (1 + scale)` before attention and FF (global modulation) + the final `norm(x) * (1 + scale)` (3);
    # gated residuals `x + tanh(gate) * RMSNorm(out)`: attention and FF of each Z-Image block (6) + the injection
    # layer's `x + tanh(cross_attn_gate) * norm(cross_out)` (7); RoPE (complex spelling) on q and k of the 3
    # self-attentions (6); RMSNorm QK norms of the 5 attentions (refiner, 2 main, the injection's cross-attention,
    # the Perceiver's cross- and self-attention) (12); the SiLU-gated FFs (4); norms no modulation takes: the
    # refiner's attention_norm2 and ffn_norm2 (2), 4 a main layer (attention_norm1 and ffn_norm1, whose per-token
    # modulation is missed, see MISSED, attention_norm2, ffn_norm2), + cross_attn_norm1/2 of the injection layer
    # (10), the Perceiver layer's 3 and its norm_out (16). Per (+1 refiner, +1 plain, +1 injection, +1 Perceiver
    # layer): (2, 7, 6, 12, 4, 0, 15)
    "bria_fibo2": (3, 7, 6, 12, 4, 0, 16),
    # 1 block, 1 layerwise + 1 refiner text-fusion block: every Krea2RMSNorm is `rms_norm(x.float(), weight=w + 1)
    # .to(dtype)`, a cast RMSNorm the modulate family takes (also in fp32): 4 a block (norm1, norm2, norm_q, norm_k),
    # 4 a text-fusion block, txt_in's, the final layer's (14), + the block's two `(1 + scale) * norm(x) + shift` and
    # the final layer's (17). Its QK norms are those cast RMSNorms, so qk_norm 0. Gated residuals pregate and
    # postgate (2); RoPE on q and k (2); SwiGLU FFs of the 3 blocks (3). Per (+1 block of each kind):
    # (14, 2, 2, 0, 3, 0, 0). Not sites: the text-fusion blocks' plain residuals; the attention's sigmoid output gate
    # `out * sigmoid(to_gate(x))` (no family); the 3 GELU-tanh MLP activations (time embed, time_mod_proj, txt_in)
    # are close, not admitted at lossless
    "krea2": (17, 2, 2, 0, 3, 0, 0),
    # 1 block: LayerNorm-modulates before attention and MLP + the final layer (3); gated residuals (2); the RMSNorms
    # on the image q, k and the text k run as bare norms (norm family, 3), not qk_norm (their consumer is PRX's
    # rotation-table RoPE, and a cat); that RoPE on the image q and k, `f[..., 0] * x_[..., 0] + f[..., 1] * x_[..., 1]`
    # (rope_matrix, 2); the MLP's `down(gelu_tanh(gate(x)) * up(x))` is close, not admitted at lossless
    "prx": (3, 2, 2, 0, 0, 0, 3),
    # 1 layer (shared adaLN table from the timestep, [S, B, H] layout): RMSNorm-modulates before attention and MLP,
    # `(x.float() * (1 + scale.float()) + shift.float()).to(x.dtype)`, + final_norm's LayerNorm-modulate (3); the
    # per-head RMSNorm QK norms (2). bf16: the modulate takes the fp32 product past the RMSNorm, so the two
    # RMSNorms are the norm family's (2); the gated residuals `x + (gate.float() * y.float()).to(x.dtype)`, the
    # 16-bit product spelled through fp32 (fxpasses/narrow.py) (2); fp32: each RMSNorm joins its modulate
    # (REWRITTEN_BY_DTYPE); the GeGLU `up_proj(x) * F.gelu(gate_proj(x))` (1); its RoPE on q and k, rotate-half by
    # x.chunk(2, -1) on the leading rot_dim channels in x's dtype (bf16: the rope op's arith_dtype) (2)
    "ernie_image": (3, 2, 2, 2, 1, 0, 2),
    # 1 layer: RMSNorm * (1 + scale) (no shift) before attention and FF + norm_final(x) * (1 + scale) (3); the
    # tanh-gated residuals `x + gate * rmsnorm(y)` of attention and FF (2); per-head RMSNorm QK norms (2); the SwiGLU
    # `silu(w1(x)) * w3(x)` (1); the RMSNorms on the attention and FF outputs and llm_cond_norm (3); its RoPE on q
    # and k, rotate-half by sliced halves in q's dtype (bf16 products and sum: the rope op's arith_dtype) (2)
    "ideogram4": (3, 2, 2, 2, 1, 0, 3),
    # 1 double block, bf16: its adaLN norms are FP32LayerNorms cast back before the modulation, two ops a site (see
    # "auraflow"); only the image stream reaches norm_out, so the text stream's FF (txt_norm2 modulate, its
    # residuals) is dead: 3 sites (img_norm1, txt_norm1, img_norm2) x 2 + norm_out's cast LayerNorm (7). Gated
    # residuals: image attention and FF (2); RMSNorm QK norms on q and k of both streams (4); RoPE on the image
    # q and k, its pairs split from x.float() (2); fp32: 3 modulates, norm_out a plain norm (1)
    "joyimage": (7, 2, 2, 4, 0, 0, 0),
    "joyimage_edit_plus": (7, 2, 2, 4, 0, 0, 0),  # JoyImage's blocks, batched RoPE tables: JoyImage's counts
    # Wan 2.1 I2V blocks, 1 layer: modulates norm1, norm3 (2 a block) + norm_out, and (bf16) the cross-attention's
    # FP32LayerNorm norm2 and the image embedder's two FP32LayerNorms, cast back: cast LayerNorms (6); gated
    # attention and FF residuals (2); RoPE on the self-attention's q and k (2); RMSNorms across heads on q and k
    # of both attentions and on the image tokens' added k (5). Layer differencing (+1 layer): +3, +2, +2, +5
    "chronoedit": (6, 2, 2, 5, 0, 0, 0),
    # Cosmos-Predict2.5, 1 layer: CosmosAdaLayerNormZero before self-attention, cross-attention and FF (3 a
    # block) + norm_out's CosmosAdaLayerNorm (4); the three gated residuals `x + gate * y` (3); rotate-half RoPE
    # (apply_rotary_emb, use_real_unbind_dim=-2) on the self-attention's q and k (2); per-head RMSNorm on q and k
    # of both attentions (4); the time embedding's RMSNorm (1). The FFs' exact GELU (and crossattn_proj's) is no
    # activation site. Layer differencing: +3, +3, +2, +4
    "cosmos": (4, 3, 2, 4, 0, 0, 1),
    # LTX-2, 1 audio-video layer: modulates 8 a block (video and audio before self-attention and FF, and the
    # a2v / v2a cross-attention's four `norm(x) * (1 + scale) + shift` of the shared audio_to_video_norm /
    # video_to_audio_norm outputs) + both norm_outs (10); gated residuals: both self-attentions, a2v, v2a, both
    # FFs (6); interleaved RoPE on q and k of the video and audio self-attentions and of a2v and v2a (8); RMSNorms
    # across heads on q and k of six attentions (12); norm2 / audio_norm2 before the text cross-attentions, not
    # modulated (cross_attn_mod off) (2). Layer differencing: +8, +6, +8, +12, 0, 0, +2. Not sites: the two
    # `coords * scale + offset` of the RoPE coordinates (integer, 'input is not a floating-point tensor')
    "ltx2": (10, 6, 8, 12, 0, 0, 2),
    # Flux-like, 1 dual + 1 single block: modulates 4 (dual: norm1, norm1_context, norm2, norm2_context) + 1
    # (single) + norm_out (6); gated residuals 4 + 1 (5); RoPE on q and k of each block (4); RMSNorm QK norms
    # 4 + 2 (6); the single block's GELU-tanh into its cat (1). Layer differencing (+1 dual, +1 single): +5, +5,
    # +4, +6, +1
    "motif_video": (6, 5, 4, 6, 1, 0, 0),
    # 1 layer + 1 refiner layer: RMSNorm-modulates (index_select'ed rows) before attention and FF + norm_out (3);
    # gated attention and FF residuals (2); per-head RMSNorm on q and k of the block's and the refiner's
    # attention (4); SwiGLU of both FFs (2); the refiner's norm1, norm2 and final_norm (3). Not sites: the
    # refiner's plain residuals. Its partial RoPE on q and k (the leading rotary_dim channels rotated by
    # x.chunk(2, -1) in x's dtype, the rest concatenated after) (2). Layer differencing (+1 layer, +1 refiner
    # layer): +2, +2, +2, +4, +2, 0, +2
    "minimax_h3": (3, 2, 2, 4, 2, 0, 3),
    # 1 text (encoder) block + 1 visual (decoder) block; every chain in fp32 and cast back:
    # `(norm(x.float()) * (scale.float() + 1.0) + shift.float()).type_as(x)` LayerNorm-modulates: 2 a text block
    # (attention, FF), 3 a visual block (self-attention, cross-attention, FF), + the out layer's (6); gated
    # residuals `(x.float() + gate.float() * out.float()).type_as(x)`: 2 + 3 (5); per-head RMSNorm QK norms of
    # `q.float()` cast back: text self-attention 2, visual self- and cross-attention 4 (6); the text and pooled-text
    # embedders' LayerNorms (2); its RoPE, a 2x2 rotation table summed `(rope * x_).sum(-1)` then a fixed
    # `.to(torch.bfloat16)`, on the text and visual self-attentions' q and k (rope_matrix, 4). The FFs' exact GELU is
    # no activation site. (tiny + 1 block of each kind: (5, 5, 2, 6, 0, 0, 0) a text + visual pair)
    "kandinsky5": (6, 5, 4, 6, 0, 0, 2),
    # 1 text block in each of the video and audio branches + 1 fused video/audio block (the released flags
    # ca_rope, cross_gates, fix_modulation): LayerNorm-modulates (apply_scale_shift, fp32, cast back) 2 a text
    # block (4); the fused block's video and audio self-attention, cross-attention and FF (6) and the va / av
    # normalizations before the video <-> audio cross-attentions (2); the video and audio out layers (2): 14.
    # Gated residuals (apply_gate_sum): 2 a text block (4) + the fused block's 8 (self-, text cross-, cross-modal
    # attention and FF of both streams): 12. RMSNorm QK norms: 2 an attention, 2 text + 6 fused attentions: 16.
    # Norms: the video and audio text embedders', the two pooled-text embedders', the audio embedder's LayerNorm and
    # the audio out layer's second LayerNorm after its modulation (6). RoPE (Kandinsky 5's rotation table): q and k
    # of the two text self-attentions, the video and audio self-attentions and, with ca_rope, the video <-> audio
    # cross-attentions (12); exact-GELU FFs. (tiny + 1 block of each kind: (12, 12, 8, 16, 0, 0, 0) more)
    "kandinsky6": (14, 12, 12, 16, 0, 0, 6),
    # 1 Wan block + 1 face adapter, bf16: Wan's counts (4, 2, 2, 4) with the modulate family also taking the CLIP
    # image embedder's two FP32LayerNorms (cast back to bf16, layer_norm ops): 6; the face adapter's RMSNorm on its
    # query (qk_norm, 5); norms: the face encoder's 3 LayerNorms (before its SiLUs), the adapter's pre_norm_q and
    # pre_norm_kv, and its norm_k, a per-head RMSNorm of the key split by `view(B, T, N, heads, -1)` (5-D),
    # which the qk_norm family does not take and the norm family rewrites as a plain RMSNorm (6). The adapter's
    # output is added back ungated (no site); the FF's GELU-tanh is `close`, not admitted at lossless (as Wan's).
    # Per Wan block + its adapter (tiny + 1 block): (3, 2, 2, 5, 0, 0, 3).
    "wan_animate": (6, 2, 2, 5, 0, 0, 6),
    # 1 layer (GQA: 4 heads, 2 kv heads, as the real 32 / 8): modulates: norm1's RMSNorm * (1 + scale) (no shift),
    # ffn_norm1(x) * (1 + scale_mlp), and norm_out's LuminaLayerNormContinuous (2L+1); tanh-gated residuals of
    # attention and FF (2L); complex RoPE on the self-attention's q and k and the cross-attention's q (3L); the
    # LayerNorms across heads on q and k of both attentions (4L); the FF's SiLU gate (L); norms the others leave:
    # norm2 and ffn_norm2 (the sandwich norms), norm1_context, and the caption embedder's LayerNorm (3L+1).
    # Not sites: the cross-attention's per-head tanh gate `self_attn + cross_attn * gate.tanh().view(1, 1, -1, 1)`
    # ([B, S, H, D], no token-stream residual). (With 1 kv head a norm_k is no head split: the norm family takes it.)
    "lumina_next": (3, 2, 3, 4, 1, 0, 4),
    # Lumina2's block structure (1 layer, 1 noise-refiner layer, both modulated, 1 context-refiner layer, not):
    # Lumina2's counts. Its RoPE table is made on the first call (a graph break there, 7 graphs, the same
    # counts); the zoo's tests call the model once before compiling it
    "zimage": (5, 6, 6, 6, 3, 0, 9),
    # Wan 2.1's blocks with AnyFlow's dual-timestep embedder (1 block), bf16: the FP32LayerNorms cast back: norm1
    # and norm3 LayerNorm-modulates, the cross-attention's affine norm2 a cast LayerNorm the modulate family takes,
    # + norm_out (3L+1); gated attention and FF residuals `(x.float() + y * gate).type_as(x)` (2L); RMSNorms across
    # heads on q and k of both attentions (4L); its complex RoPE in float64, `x.to(torch.float64)` times a
    # complex128 table, on q and k (2L). Its GELU-tanh FF and the text embedder's GELU-tanh are close, not admitted
    # at lossless (as Wan's).
    "anyflow": (4, 2, 2, 4, 0, 0, 0),
    "anyflow_far": (4, 2, 2, 4, 0, 0, 0),  # AnyFlow's blocks, chunk-causal: AnyFlow's counts
    # 1 Wan 2.1 I2V block, a cached denoising step (its blocks compiled as one shared frame past the RoPE's
    # .tolist(): the counts do not grow with the block count): LayerNorm-modulates norm1 / norm3, the cross-attention's
    # cast norm2, norm_out (4); gated residuals (2); RMSNorm QK norms of both attentions and the image keys' (5); the
    # CLIP projection's LayerNorms (2). Its RoPE is missed (MISSED)
    "wan_animate2": (4, 2, 0, 5, 0, 0, 2),
    # 1 GDN + 1 softmax block (softmax_every_n 2), fp32 the same: the per-frame `x_norm * (1 + scale) + shift`
    # before the attention and the FF, a reshape past the LayerNorm (the modulate family takes the product, the norm
    # family the LayerNorm), 2 a block + the final layer's (5); complex RoPE (x.float() times the table, cast back):
    # the main branch's on q and k (2 a block), the camera branch's UCPE on its q, its cat of k and v and its output
    # (the table's conjugate) (3 a block) (10); RMSNorm QK norms of the main and camera branches and of the
    # cross-attention (6 a block: 12); GLUMBConvTemp's 1x1 conv + SiLU and depthwise conv + SiLU GLU (2 a block) and
    # the softmax block's output gate `attn * silu(output_gate(x).float())` (5); the softmax camera branch's q, k and
    # v cast to bf16 and padded from their head dim to 128 (linear_attention's cast_copy, 3); norm1, norm2 (2 a
    # block), norm_final and the caption's attention_y_norm (6). The gated residuals and the GDN block's output gate
    # are missed (MISSED). Not sites: the Pluecker and cross-attention residuals (plain adds), GLUMBConvTemp's
    # `x + t_conv(x)` (no bias), the GDN scan, the short temporal conv, the UCPE 4x4 transforms and RMS downscaling.
    # Layer differencing (3 blocks: +1 GDN, 4 blocks: +1 of each): a GDN block (2, 0, 5, 6, 2, 0, 2), a softmax block
    # (2, 0, 5, 6, 3, 3, 2)
    "sana_wm": (5, 0, 10, 12, 5, 3, 6),
    # 1 layer, a KV-cached denoising step, fp32 the same: `norm(x) * (1 + scale) + shift` RMSNorm-modulates
    # (per-token tables) before the self-attention and the FF (2 a layer) + norm_out's LayerNorm-modulate (3); gated
    # residuals of the self-attention and the FF (2 a layer); interleaved RoPE on q and k and on the cache's pre-RoPE
    # sink keys (3 a layer); RMSNorms across heads on the self-attention's q and the cross-attention's q and k
    # (qk_norm, 3 a layer); norm2 (not modulated) and the self-attention's norm_k, whose RoPE'd keys are concatenated
    # after the sink's and history's before the head split (norm, 2 a layer). Not sites: the cross-attention's plain
    # residual; the GELU-tanh of the FF and the caption projection (close). Per layer (+1 layer): (2, 2, 3, 3, 0, 0, 2)
    "sana_wm_refiner": (3, 2, 3, 3, 0, 0, 2),
    # Models whose forward breaks the graph count the sites of every graph torch.compile makes of one call; blocks
    # that share a compiled frame count once (Mochi, HunyuanVideo 1.5, HiDream, HunyuanImage 2.1: their counts do
    # not grow with the block count).
    # 2 layers (the last text-stops-after-attention): modulated RMSNorms of video and text before attention and FF
    # and norm_out's (8); tanh-gated residuals, in bf16 `x + (rms_norm(y.float()) * tanh(gate)).to(bf16)` (6); its
    # RoPE, the halves widened and each cast back before the stack, one graph q and k share (1); SwiGLU FFs (3);
    # the text / video RMSNorms the modulations leave (8)
    "mochi": (8, 6, 1, 0, 3, 0, 8),
    # 1 block, 1 refiner layer (its blocks one shared frame): AdaLayerNormZero of video and text before attention
    # and FF + norm_out (5); gated residuals 4 + the refiner's 2 (6); RoPE on q and k (2); RMSNorm QK norms (4);
    # the refiner's LayerNorms and the text norms (5)
    "hunyuanvideo15": (5, 6, 2, 4, 0, 0, 5),
    "framepack": (6, 7, 4, 6, 1, 0, 2),  # HunyuanVideo's blocks: HunyuanVideo's counts
    # 1 layer, Wan's blocks: norm1 / norm3 LayerNorm-modulates, the cross-attention's cast norm2 (modulate family),
    # norm_out (4); gated residuals (2); its even/odd RoPE on q and k, the cos / sin slices taken anew for each
    # product (2); RMSNorms across heads on q and k of both attentions (4)
    "helios": (4, 2, 2, 4, 0, 0, 0),
    # 1 block: LayerNorm-modulates before attention and FF + the output's (3), gated residuals (2), Kandinsky's
    # rotation-matrix RoPE on q and k (2), RMSNorm QK norms (2)
    "kandinsky6_sr": (3, 2, 2, 2, 0, 0, 0),
    # 1 CogVideoX block + its face cross-attention: LayerNormZero of video and text before attention and FF (4) +
    # norm_out (1); the block's four gated residuals and the face injection `x + local_face_scale * attn(...)`
    # (residual_add with its number, 5); RoPE on the video q and k (2); the block's LayerNorm QK norms (2); the
    # local facial extractor's and the cross-attention's LayerNorms (22: 20 + 1 a block, and the one on the
    # extractor's output, `latents[:, :n] @ proj_out`, which eager batches: not a projection's, as at full width)
    "consisid": (5, 5, 2, 2, 0, 0, 22),
    # 1 layer: AdaLayerNormZero's rows modulate both streams before attention and FF (4); gated residuals 4 less
    # the dead text stream past attention (2); RoPE on the image rows of q and k (2); per-head LayerNorm QK norms (2)
    "glm_image": (4, 2, 2, 2, 0, 0, 0),
    # 1 dual + 1 single block + 1 refiner layer (the blocks compiled frame by frame past the glyph reordering):
    # HunyuanVideo's counts and one text RMSNorm more (the glyph stream's)
    "hunyuan_image": (6, 7, 4, 6, 1, 0, 3),
    # 1 layer (Phi-3 blocks, no adaLN in them): norm_out's LayerNorm-modulate (1); its RoPE on q and k (2); the
    # SiLU-gated FF (1); the block's two RMSNorms and the final one (3)
    "omnigen": (1, 0, 2, 0, 1, 0, 3),
    # 1 dual + 1 single block (every block its own frames around the MoE routing): LayerNorm-modulates of image and
    # text before attention and FF, the single block's two, norm_out (7); gated residuals (6); its rotation-matrix
    # RoPE `f[..., 0] * x[..., 0] + f[..., 1] * x[..., 1]` on q and k of each attention (4); RMSNorm QK norms (6);
    # SwiGLU experts and FFs (5)
    "hidream": (7, 6, 4, 6, 5, 0, 0),
    # 1 block, a cached decode step: LayerNorm-modulates before attention and FF + norm_out and the text's (4); tanh
    # gated residuals (2); complex RoPE on q and k (2); per-head RMSNorm QK norms (2); the SwiGLU (1)
    "qwenimage21": (4, 2, 2, 2, 1, 0, 0),
    # 1 dense + 1 MoE block (bf16 only, see DTYPES): scale-modulated LayerNorms before attention and FF + norm_out
    # (5); tanh-gated residuals (4); complex RoPE on image q, k and text k (6); RMSNorm QK norms (6); SwiGLU FF,
    # shared expert, grouped experts (3); the text and output RMSNorms (3)
    "nucleus_moe": (5, 4, 6, 6, 3, 0, 3),
    # 1 layer of both pathways (understanding: the prompt's tokens, causal; generation: the video tokens), fp32 the
    # same: no adaLN (the timestep embedding is scatter-added to the video tokens before the layers) and plain
    # residuals, so no modulate or gated residual; the rotate-half mRoPE on q_und, q_gen, k_gen and k_und (4: k_und
    # is rotated twice a layer, for the causal pathway and, as k_und_for_gen, the same normed tensor, for the
    # generation pathway's keys; the second rotation is the first's computation again, merged before the families
    # run, fxpasses/repeated.py); per-head RMSNorm QK norms norm_q, norm_k, norm_added_q, norm_added_k (4); the
    # SiLU-gated MLPs of both pathways (2); the RMSNorms before attention and MLP of both pathways (4 a layer) and
    # the final norm and norm_moe_gen (6). Layer differencing (1, 2, 3 layers: rope 4/8/12, qk_norm 4/8/12,
    # activation 2/4/6, norm 6/10/14): +4, +4, +2, +4 a layer
    "cosmos3": (0, 0, 4, 4, 2, 0, 6),
}
REWRITTEN_BY_DTYPE = {("sana", "fp32"): (3, 3, 0, 0, 2, 3, 1), ("wan", "fp32"): (3, 2, 2, 4, 0, 0, 1),
                      # fp32: the casts are gone, so the adaLN sites are one LayerNorm-modulate each (4 + 2 + 1)
                      # and the QK norms plain LayerNorms (qk_norm: 4 + 2)
                      ("auraflow", "fp32"): (7, 6, 0, 6, 3, 0, 0),
                      # fp32: the FP32LayerNorms without their casts are plain norms (norm family: 3 a block + skip_norm)
                      ("hunyuandit", "fp32"): (1, 8, 12, 16, 0, 0, 13), ("skyreels_v2", "fp32"): (3, 2, 2, 4, 0, 0, 1),
                      ("wan22_ti2v", "fp32"): (3, 2, 2, 4, 0, 0, 1),
                      ("wan_vace", "fp32"): (5, 5, 4, 8, 0, 0, 2),
                      # fp32: one LayerNorm-modulate a site (7 + norm_out)
                      ("easyanimate", "fp32"): (8, 6, 4, 6, 0, 0, 2),
                      ("ernie_image", "fp32"): (3, 2, 2, 2, 1, 0, 0), ("ideogram4", "fp32"): (3, 2, 2, 2, 1, 0, 3),
                      ("joyimage", "fp32"): (3, 2, 2, 4, 0, 0, 1), ("joyimage_edit_plus", "fp32"): (3, 2, 2, 4, 0, 0, 1),
                      # fp32: no casts, so the cross-attention norm2 and the image embedder's norm1 / norm2 are plain
                      # LayerNorms (norm family, 3) and the adaLN sites one LayerNorm-modulate each (2 + norm_out)
                      ("chronoedit", "fp32"): (3, 2, 2, 5, 0, 0, 3),
                      # fp32: no casts: Wan's 3 LayerNorm-modulates; the cross-attention FP32LayerNorm and the image embedder's two
                      # are plain LayerNorms (norm: 6 + 3)
                      ("wan_animate", "fp32"): (3, 2, 2, 5, 0, 0, 9),
                      # fp32: the FP32LayerNorms have no casts: norm1 / norm3 / norm_out one LayerNorm-modulate each (2L+1) and the
                      # cross-attention norm2 a plain LayerNorm (norm family, L)
                      ("anyflow", "fp32"): (3, 2, 2, 4, 0, 0, 1), ("anyflow_far", "fp32"): (3, 2, 2, 4, 0, 0, 1),
                      ("wan_animate2", "fp32"): (3, 2, 0, 5, 0, 0, 3),  # norm2 a plain LayerNorm
                      ("helios", "fp32"): (3, 2, 2, 4, 0, 0, 1)}  # the cross-attention norm2 a plain LayerNorm

#: model -> the dtypes it is built in where not both: Nucleus-Image's grouped expert GEMMs (torch._grouped_mm, as
#: published: use_grouped_mm) take bf16 only under torch.compile (their fake kernel refuses fp32)
DTYPES: Dict[str, Tuple[str, ...]] = {"nucleus_moe": ("bf16",)}

@dataclasses.dataclass(frozen=True)
class Miss:
    """Chains a model computes that no family rewrites: how many in the tiny config and at blocks2,
    in which dtypes, and why."""
    family: str
    tiny: int
    blocks2: int
    reason: str
    dtypes: Tuple[str, ...] = ("fp32", "bf16")


#: model -> its chains no family rewrites. Expected = rewritten + missed.
MISSED: Dict[str, List[Miss]] = {
    "wan_animate2": [Miss("rope", 2, 2, "its RoPE rotates each sample's valid tokens in float64 and joins them to the "
                                        "rest (cat), stacks the samples, then casts (.float(), .type_as(value)): no "
                                        "cast back to x's dtype ends the rotation")],
    "sana_wm": [Miss("residual_gate", 4, 4, "the blocks' gated residuals (attention and FF, 2 a block) `x + (gate * "
                                            "y.reshape(B, T, S, C)).reshape(B, N, C)`: the per-frame gate rows [B, T, "
                                            "1, C] multiply the update per frame and the product is reshaped to the "
                                            "token stream before the add, where the chain takes the product as the "
                                            "add's operand"),
                Miss("activation", 1, 1, "the GDN block's output gate `attn * silu(output_gate(x).float())`: attn, "
                                         "the GDN branch's `(num / den).permute(0, 3, 1, 2).reshape(B, N, C)` plus "
                                         "the camera branch's projection, is channels-first (strides (N * C, 1, N)) "
                                         "and so is eager's product, where the op writes the layout of SiLU's "
                                         "operand; in bf16 the fit reported is the widened SiLU with no cast back")],
    "bria_fibo2": [Miss("modulate", 4, 4, "the main layers' `RMSNorm(x) * scale`, scale select_per_token's "
                                          "torch.where(noise_mask == 1, 1 + scale_noisy, 1 + scale_clean): the `1 +` "
                                          "before a per-token select is no modulate spelling; the norm family takes "
                                          "the RMSNorm alone")],
}

#: model -> the skips its report lists beside the lossless tier's not-admitted ones: (family, op, reason).
#: A missed chain's, or a candidate that is no chain of the family's (a site that is not one)
SKIPS: Dict[str, set] = {
    # each RoPE is found twice in bf16: one fit runs on the fp32 norm output (cast after: skipped), the other
    # takes the site
    "flux3": {("rope", "rope", "the result is not cast back to x's dtype")},
    # a cast_copy candidate on an integer tensor and a cat_pad on the bool attention mask: no chains
    "motif_video": {("linear_attention", "cast_copy", "not a 4-D floating-point tensor"),
                    ("pad", "cat_pad", "not tensors of one dtype (float32, float16 or bfloat16), up to 5 dims")},
    # cast_copy candidates on the complex RoPE's cast of x (no 4-D float), cat_pad candidates in the per-image
    # sequences' padding (pad_sequence's cats into a new_full, an integer cat of the position ids): no chains
    "zimage": {("linear_attention", "cast_copy", "not a 4-D floating-point tensor"),
               ("pad", "cat_pad", "intermediate cat_17 has another user (new_full_4)"),
               ("pad", "cat_pad", "intermediate cat_18 has another user (new_full_5)"),
               ("pad", "cat_pad", "not tensors of one dtype (float32, float16 or bfloat16), up to 5 dims")},
    "wan_animate2": {("rope", "rope_complex", "the result is not cast back to x's dtype")},  # MISSED
    # bf16: each camera-branch RoPE whose input needs `.contiguous()` (a clone between its .to(float32) and the
    # complex view) is found twice, the fit with the trailing .type_as skipped, the one without it taking the site;
    # the GDN block's output gate (MISSED), bf16's and fp32's reasons
    "sana_wm": {("rope", "rope_complex", "the result is not cast back to x's dtype"),
                ("activation", "silu_mul", "the SiLU of a widened a is not cast back to a's dtype"),
                ("activation", "silu_mul",
                 "the chain's output strides (1536, 1, 48) do not follow the input's layout")},
    # a cast_copy candidate on an integer tensor, a cat_pad on the mask: no chains
    "mochi": {("linear_attention", "cast_copy", "not a 4-D floating-point tensor"),
              ("pad", "cat_pad", "not tensors of one dtype (float32, float16 or bfloat16), up to 5 dims")},
    "hunyuanvideo15": {("linear_attention", "cast_copy", "not a 4-D floating-point tensor"),
                       ("pad", "cat_pad", "not tensors of one dtype (float32, float16 or bfloat16), up to 5 dims")},
}

#: model -> sites rewritten per FAMILIES at blocks2 (bf16), where it differs from the tiny count:
#: a per-block count at two blocks where tiny has one (the difference is one block's sites), Chroma's
#: five approximator RMSNorms, HunyuanDiT without its long skip. (``explain`` on the meta device, or
#: the H200's where its graph differs: there CogVideoX's, CogView3-Plus's and HunyuanDiT's per-head QK
#: LayerNorms are taken as cast LayerNorms by the modulate family where the GPU's graph gives them to
#: qk_norm, 2L QK norms; Lumina2's full config does not run on the meta device: one main layer's
#: sites more, measured on the H200.)
BLOCKS2: Dict[str, Tuple[int, ...]] = {
    "sana": (5, 6, 0, 0, 4, 8, 1),
    "pixart": (5, 6, 0, 0, 0, 0, 0),
    "qwenimage": (8, 6, 8, 8, 0, 0, 1),
    "chroma": (6, 5, 4, 6, 1, 0, 5),
    "cogview4": (8, 6, 4, 4, 0, 0, 0),
    "hunyuandit": (7, 4, 6, 8, 0, 0, 0),
    "cogview3plus": (9, 7, 0, 4, 0, 0, 0),
    "dit": (5, 4, 0, 0, 0, 0, 0),
    "wan": (7, 4, 4, 8, 0, 0, 0),
    "cogvideox": (9, 7, 0, 4, 0, 0, 1),
    "ltx": (5, 4, 4, 8, 0, 0, 0),
    "skyreels_v2": (7, 4, 4, 8, 0, 0, 0),
    "wan22_ti2v": (7, 4, 4, 8, 0, 0, 0),
    "allegro": (5, 6, 12, 0, 0, 0, 0),
    "sanavideo": (5, 6, 4, 8, 4, 0, 1),
    "lumina2": (7, 8, 8, 8, 4, 0, 11),
    # 2 blocks and the full config's 2 + 2 text-fusion blocks; on CUDA its cast RMSNorms are the fused
    # rms_norm's (weight bf16, input fp32), which the qk_norm and norm families take (31 on the meta device)
    "krea2": (5, 4, 4, 12, 6, 0, 14),
    "prx": (5, 4, 4, 0, 0, 0, 6),
    "lumina_next": (5, 4, 6, 8, 2, 0, 7),
    "zimage": (7, 8, 8, 8, 4, 0, 11),  # 2 layers, 1 refiner layer of each kind (the tiny config's at 2 layers)
    # no meta-device run (see their builders): the tiny config at two blocks, on the CPU (one of each kind elsewhere:
    # FramePack, HunyuanImage 2.1, HiDream, Nucleus-Image, ConsisID; the shared frames of Mochi and HunyuanVideo 1.5:
    # the tiny counts)
    "helios": (7, 4, 4, 8, 0, 0, 0),
    "kandinsky6_sr": (5, 4, 4, 4, 0, 0, 0),
    "glm_image": (8, 6, 4, 4, 0, 0, 0),
    "omnigen": (1, 0, 4, 0, 2, 0, 5),
    "qwenimage21": (6, 4, 4, 4, 2, 0, 0),
    "joyimage": (15, 6, 4, 8, 0, 0, 0),  # 2 double blocks: the first's text FF is live
    "joyimage_edit_plus": (15, 6, 4, 8, 0, 0, 0),
    # ERNIE-Image, Ideogram 4 (autocast on the meta device fails), ChronoEdit and LTX-2 (dynamo's fake pass refuses
    # a real tensor their RoPE builds): the tiny config at two layers, on the CPU
    "ernie_image": (5, 4, 4, 4, 2, 0, 4),
    "ideogram4": (5, 4, 4, 4, 2, 0, 5),
    "chronoedit": (9, 4, 4, 10, 0, 0, 0),
    "ltx2": (18, 12, 16, 24, 0, 0, 4),
    "cosmos": (7, 6, 4, 8, 0, 0, 1),
    "minimax_h3": (5, 4, 4, 6, 3, 0, 3),
    "anyflow": (7, 4, 4, 8, 0, 0, 0),
    "anyflow_far": (7, 4, 4, 8, 0, 0, 0),  # no meta-device run (flex attention): the tiny config at two layers
    "sana_wm_refiner": (5, 4, 6, 6, 0, 0, 4),  # 2 layers (the meta device's count; the tiny config's at 2 layers)
    # the face extractor at its full depth (10 perceiver layers against the tiny 5) and widths, where one of its
    # LayerNorms is the norm family's rather than qk_norm's (the meta device's count, and the H200's)
    "consisid": (5, 5, 2, 2, 0, 0, 45),
    # at the real widths a transposed copy of a 4-D tensor is a cast_copy site (the H200's count: its autocast
    # refuses the meta device)
    "mochi": (8, 6, 1, 0, 3, 1, 8),
    # no meta-device run (its RoPE's autocast): the tiny config at two layers, on the CPU; the real widths (2 layers,
    # hidden 4096, 32 / 8 heads of 128, MLP 12288) on the CPU with a small latent give the same
    "cosmos3": (0, 0, 8, 8, 4, 0, 10),
}

#: image and video DiTs of diffusers.models.transformers with no zoo entry yet: class -> why
NOT_YET: Dict[str, str] = {}

#: classes of diffusers.models.transformers that are not image or video DiTs (no zoo entry)
NOT_DITS = {
    "Transformer2DModel": "the legacy all-in-one class: continuous input is a U-Net's spatial transformer (SD); "
                          "patched input with ada_norm_zero / ada_norm_single is DiT / PixArt-alpha, whose blocks the "
                          "zoo's dit and pixart entries cover",
    "DualTransformer2DModel": "two continuous Transformer2DModels mixed (Versatile Diffusion's U-Net)",
    "PriorTransformer": "the unCLIP / Kandinsky 2.x / Shap-E prior over CLIP embedding tokens",
    "TransformerTemporalModel": "the temporal attention layers inside video U-Nets (and SVD's spatio-temporal ones)",
    "DreamLiteTransformer2DModel": "the spatial transformer of DreamLite's U-Net (GroupNorm + conv proj_in, "
                                   "LayerNorm blocks with no timestep conditioning)",
    "AceStepTransformer1DModel": "ACE-Step: music over 1-D audio latents",
    "StableAudioDiTModel": "Stable Audio: audio over 1-D latents",
    "StableAudio3DiTModel": "Stable Audio 3: audio over 1-D latents",
    "LongCatAudioDiTTransformer": "LongCat-Audio-DiT: audio",
    "MiniMaxMusic3Transformer1DModel": "MiniMax-Music3: music over 1-D latents",
    "MiniMaxMusic3RVQDepthDecoder": "MiniMax-Music3's RVQ depth decoder (codebook tokens)",
    "T5FilmDecoder": "T5-FiLM: spectrograms (music)",
    "RFD4ProteinaTransformer": "RFD4-Proteina: protein structures",
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
    for miss in MISSED.get(name, ()):
        if dtype in miss.dtypes:
            counts[miss.family] += miss.blocks2 if size == "blocks2" else miss.tiny
    return counts


def dtypes_of(name: str, dtypes=("fp32", "bf16")) -> Tuple[str, ...]:
    """Those of ``dtypes`` that zoo model ``name`` is built in (:data:`DTYPES`)."""
    return tuple(d for d in dtypes if d in DTYPES.get(name, dtypes))


def coverage(dtypes=("fp32", "bf16")) -> Tuple[int, int]:
    """(sites rewritten, sites expected) over every zoo model and ``dtypes``, tiny configs."""
    cases = [(m, d) for m in REWRITTEN for d in dtypes_of(m, dtypes)]
    return sum(sum(rewritten(m, d).values()) for m, d in cases), sum(sum(expected(m, d).values()) for m, d in cases)
