"""attention_fp8's Triton kernels under the interpreter: the e4m3 copies of q, smoothed k and
smoothed v are the reference's bits (the interpreter's fp32 division is IEEE's, its e4m3 cast
pre-rounded on the e4m3 grid by ``to_e4m3``), in cuDNN's ``[B, S, H, D]`` order whatever q, k, v's
strides; the output's restoration is the reference's in fp32 (the interpreter does not contract
the product and the sum) and within its bf16 rounding (the interpreter truncates)."""
import pytest
import torch

pytest.importorskip("triton")

from sgdiff.kernels.attention_fp8 import quantized_operands, restore_values  # noqa: E402
from sgdiff.kernels.linear_fp8 import E4M3  # noqa: E402
from sgdiff.kernels.triton import fp8_heads  # noqa: E402

pytestmark = pytest.mark.interpreter
BF16 = torch.bfloat16


def _qkv(b, h, s, s_k, d, heads_last=True, seed=0):
    """q, k shifted by 0.7, v with an offset per channel (what smoothing takes out)."""
    g = torch.Generator().manual_seed(seed)

    def make(n, shift=0.0):
        t = (torch.randn(b, n, h, d, generator=g) * 1.5 + shift).to(BF16)
        return t.transpose(1, 2) if heads_last else t.transpose(1, 2).contiguous()
    return make(s), make(s_k, shift=0.7), make(s_k, shift=2.0 * torch.randn(d, generator=g))


@pytest.mark.parametrize("b,h,s,s_k,d,heads_last", [(1, 2, 200, 200, 64, True), (2, 1, 70, 130, 128, True),
                                                    (1, 3, 65, 17, 64, False)])
def test_operands_are_the_references_bits_in_cudnns_order(b, h, s, s_k, d, heads_last):
    q, k, v = _qkv(b, h, s, s_k, d, heads_last)
    q8, k8, v8, q_scale, k_scale, v_mean, v_scale = fp8_heads.quantize_operands(q, k, v)
    want = quantized_operands(q, k, v)
    for got, ref in ((q8, want[0]), (k8, want[2]), (v8, want[4])):
        assert got.dtype == E4M3 and got.is_contiguous() and got.shape == ref.transpose(1, 2).shape
        assert torch.equal(got.view(torch.uint8), ref.transpose(1, 2).contiguous().view(torch.uint8))
    for got, ref in ((q_scale, want[1]), (k_scale, want[3]), (v_mean, want[5]), (v_scale, want[6])):
        assert torch.equal(got, ref)
    assert float(q8.float().abs().max()) == 448.0 and float(k8.float().abs().max()) == 448.0


def test_channel_ranges_over_many_tiles_are_the_references_bits():
    """Tokens over more tiles than a step of the finishing kernel takes, the extremes of each
    channel placed in the last, partial tile or the first: the centres and scales equal ATen's
    aminmax-based references bit for bit (a largest value is the same in any order), around the
    range's centre (k) and around the mean (v: each tile's tokens added in order, the reference's),
    and the uncentred scales' largest is q's one scale."""
    from sgdiff.kernels.attention_fp8 import MEAN_TILE, channel_ranges, tensor_scale, tiled_token_means
    from sgdiff.kernels.attention_int8 import channels_around

    s = fp8_heads.STATS_BLOCK * fp8_heads.FINISH_BLOCK + 77
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, s, 2, 16, generator=g).to(BF16).transpose(1, 2)
    x[0, 0, s - 1, :8] = 40.0  # the last, partial tile
    x[0, 1, 0, 8:] = -40.0
    x[0, 1, s - 2, 3] = 1e-3  # a small value at the far end changes nothing
    centre, scale = fp8_heads.channel_ranges(x, centre="range")
    want_centre, want_scale = channel_ranges(x)
    assert torch.equal(centre, want_centre) and torch.equal(scale, want_scale)
    # v's tiles are 64 tokens; one head of them (the interpreter adds a token at a time)
    v = x[:, :1, :MEAN_TILE * fp8_heads.FINISH_BLOCK + 77]
    v[0, 0, -1, :8] = 40.0  # its last, partial tile
    mean, scale = fp8_heads.channel_ranges(v, centre="mean")
    want_mean, want_scale = channels_around(v, tiled_token_means(v))
    assert torch.equal(mean, want_mean) and torch.equal(scale, want_scale)
    assert torch.allclose(mean, v.float().mean(dim=2, keepdim=True), rtol=1e-5, atol=1e-6)
    zeros, scales = fp8_heads.channel_ranges(x, centre="none")
    assert not zeros.any() and torch.equal(scales.amax(), tensor_scale(x))


def test_padded_copies_hold_zeros_past_the_tokens_and_the_restoration_reads_the_first_ones():
    """The copies of a geometry cuDNN takes only padded: the tokens, then zeros; the output's
    first tokens restored from a padded one."""
    q, k, v = _qkv(2, 2, 70, 50, 64)
    q8, k8, v8, *_ = fp8_heads.quantize_operands(q, k, v, 128, 128)
    plain = fp8_heads.quantize_operands(q, k, v)
    for got, want, s in ((q8, plain[0], 70), (k8, plain[1], 50), (v8, plain[2], 50)):
        assert got.shape == (2, 128, 2, 64) and torch.equal(got[:, :s].view(torch.uint8), want.view(torch.uint8))
        assert not got[:, s:].view(torch.uint8).any()
    mean, scale = torch.randn(2, 2, 1, 64), torch.rand(2, 2, 64) + 0.01
    o8 = (torch.randn(2, 128, 2, 64) * 50).to(E4M3)
    got = fp8_heads.restore_heads(o8, mean, scale, torch.float32, 70)
    assert got.shape == (2, 70, 2, 64)
    assert torch.equal(got, fp8_heads.restore_heads(o8[:, :70].contiguous(), mean, scale, torch.float32))


def test_the_output_restored_as_the_reference_restores_it():
    b, h, s, d = 1, 2, 150, 64
    g = torch.Generator().manual_seed(1)
    o8 = (torch.randn(b, s, h, d, generator=g) * 100).clamp(-448, 448).to(E4M3)
    mean, scale = torch.randn(b, h, 1, d, generator=g), torch.rand(b, h, d, generator=g) + 0.01
    want = restore_values(o8.transpose(1, 2), mean, scale, torch.float32)
    assert torch.equal(fp8_heads.restore_heads(o8, mean, scale, torch.float32).transpose(1, 2), want)
    got = fp8_heads.restore_heads(o8, mean, scale, BF16).transpose(1, 2)
    assert got.dtype == BF16 and got.transpose(1, 2).is_contiguous()
    assert float(((got.float() - want) / want.abs().clamp_min(1e-30)).abs().max()) <= 2 ** -7


class _FakeTensor:
    """A cuDNN frontend tensor: its name, dims, strides and type, set as the graph API sets them."""

    def __init__(self, name, dim=None, stride=None, data_type=None):
        self.name, self.dim, self.stride, self.data_type, self.output = name, dim, stride, data_type, False

    def set_output(self, value):
        self.output = value
        return self

    def set_dim(self, dim):
        self.dim = tuple(dim)
        return self

    def set_stride(self, stride):
        self.stride = tuple(stride)
        return self

    def set_data_type(self, data_type):
        self.data_type = data_type
        return self


class _FakeGraph:
    """cuDNN's FP8 attention as its documentation states it, computed by torch on the CPU: S = q8 k8^T
    times the descales and the scale (padded keys past seq_len_kv masked), P = exp(S - max), 448 P in
    e4m3 (scale_s) times v8, times descale_s and descale_v, over the row's sum, times scale_o, in
    e4m3. With ``refuse_unpadded``, token counts that are not multiples of 64 fail check_support."""

    refuse_unpadded = False

    def __init__(self, **options):
        self.options = options

    def tensor(self, name, dim, stride, data_type):
        return _FakeTensor(name, tuple(dim), tuple(stride), data_type)

    def sdpa_fp8(self, q, k, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o, generate_stats,
                 attn_scale, use_causal_mask, name, use_padding_mask=False, seq_len_q=None, seq_len_kv=None):
        self.io = dict(q=q, k=k, v=v, descale_q=descale_q, descale_k=descale_k, descale_v=descale_v,
                       descale_s=descale_s, scale_s=scale_s, scale_o=scale_o, seq_len_kv=seq_len_kv)
        self.attn_scale, self.causal, self.padding = attn_scale, use_causal_mask, use_padding_mask
        self.io["o"] = _FakeTensor("o")
        return self.io["o"], None, _FakeTensor("amax_s"), _FakeTensor("amax_o")

    def validate(self, *modes):
        pass

    build_operation_graph = create_execution_plans = build_plans = validate

    def check_support(self):
        if self.refuse_unpadded and not self.padding and (self.io["q"].dim[2] % 64 or self.io["k"].dim[2] % 64):
            raise RuntimeError("fake: token counts must be multiples of 64")

    def get_workspace_size(self):
        return 0

    def execute(self, pack, workspace, handle=None):
        def arg(name):
            t = self.io[name]
            return torch.as_strided(pack[t], t.dim, t.stride) if t.dim is not None and len(t.dim) == 4 else pack[t]

        def scalar(name):
            return float(pack[self.io[name]].reshape(()))

        q, k, v = (arg(n).float() for n in "qkv")
        s = q @ k.transpose(-1, -2) * (scalar("descale_q") * scalar("descale_k") * self.attn_scale)
        keys = torch.arange(k.shape[2])
        if self.padding:
            s = s.masked_fill(keys >= int(pack[self.io["seq_len_kv"]].reshape(-1)[0]), float("-inf"))
        if self.causal:
            s = s.masked_fill(keys[None, :] > torch.arange(q.shape[2])[:, None], float("-inf"))
        e = torch.exp(s - s.amax(dim=-1, keepdim=True))
        p8 = (e * scalar("scale_s")).to(E4M3).float()
        # (the descales by division, as the reference divides: the fake's order of operations is its own)
        o = p8 @ v * scalar("descale_v") / (e.sum(dim=-1, keepdim=True) / scalar("descale_s")) * scalar("scale_o")
        o_t = self.io["o"]
        torch.as_strided(pack[o_t], o_t.dim, o_t.stride).copy_(o.clamp(-448, 448).to(E4M3))


@pytest.mark.parametrize("s,s_k,causal,refuse", [(200, 200, False, False), (130, 77, False, True),
                                                 (96, 96, True, True)])
def test_the_cudnn_implementation_hands_cudnn_what_the_reference_computes(monkeypatch, s, s_k, causal, refuse):
    """The cuDNN implementation's every input and its output's restoration, against a frontend that
    computes what cuDNN's documentation states: the reference's bits (fp32 q, k, v), at token counts
    taken as they are and at counts the fake takes only padded (masked)."""
    import types

    from sgdiff.kernels.attention_fp8 import attention_fp8_reference
    from sgdiff.kernels.cudnn import attention_fp8 as cudnn_fp8

    fake = types.SimpleNamespace(
        data_type=types.SimpleNamespace(FP8_E4M3="e4m3", FLOAT="float", INT32="int32"),
        heur_mode=types.SimpleNamespace(A="A", FALLBACK="FALLBACK"), pygraph=_FakeGraph,
        set_stream=lambda handle, stream: None)
    monkeypatch.setattr(_FakeGraph, "refuse_unpadded", refuse)
    monkeypatch.setattr(cudnn_fp8, "frontend", lambda: fake)
    monkeypatch.setattr(cudnn_fp8, "_handle", lambda device: "handle")
    monkeypatch.setattr(cudnn_fp8, "_stream", lambda device: 0)
    monkeypatch.setattr(cudnn_fp8, "_plans", {})
    q, k, v = (t.float() for t in _qkv(2, 2, s, s_k, 64))  # fp32: no bf16 rounding (the interpreter truncates)
    got = cudnn_fp8.bind(q, k, v, causal, None)(q, k, v, causal, None)
    want = attention_fp8_reference(q, k, v, causal, None)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want), float((got - want).abs().max())
    (plan,) = cudnn_fp8._plans.values()
    assert plan.rows == ((cudnn_fp8.padded(s), cudnn_fp8.padded(s_k)) if refuse and s % 64 else (s, s_k))


def test_each_graph_a_geometry_may_run_as_hands_cudnn_the_same_attention(monkeypatch):
    """Token counts that are no multiples of 128 get two graphs (as they are, and padded, masked),
    either of which first sight may keep: both give the reference's bits; a multiple of 128 gets one."""
    import types

    from sgdiff.kernels.attention_fp8 import attention_fp8_reference
    from sgdiff.kernels.cudnn import attention_fp8 as cudnn_fp8

    fake = types.SimpleNamespace(
        data_type=types.SimpleNamespace(FP8_E4M3="e4m3", FLOAT="float", INT32="int32"),
        heur_mode=types.SimpleNamespace(A="A", FALLBACK="FALLBACK"), pygraph=_FakeGraph,
        set_stream=lambda handle, stream: None)
    monkeypatch.setattr(cudnn_fp8, "frontend", lambda: fake)
    monkeypatch.setattr(cudnn_fp8, "_handle", lambda device: "handle")
    monkeypatch.setattr(cudnn_fp8, "_stream", lambda device: 0)
    q, k, v = (t.float() for t in _qkv(1, 2, 200, 77, 64))
    want = attention_fp8_reference(q, k, v, False, None)
    plans = cudnn_fp8.geometries(q.device, 1, 2, 200, 77, 64, False, 64 ** -0.5)
    assert [p.rows for p in plans] == [(200, 77), (256, 128)]
    for plan in plans:
        assert torch.equal(cudnn_fp8.attend(plan, q, k, v), want)
    assert [p.rows for p in cudnn_fp8.geometries(q.device, 1, 2, 256, 128, 64, False, 0.125)] == [(256, 128)]
