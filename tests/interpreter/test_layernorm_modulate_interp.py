"""layernorm_modulate and layer_norm (sgdiff/kernels/triton/layernorm_modulate.py and layer_norm.py)
under Triton's CPU interpreter, against their references.

The interpreter computes fp32 like the GPU (fma, correctly rounded division) but truncates
fp32 -> bf16 and has no approximate rsqrt, so results are compared with a tolerance of the
largest magnitude and exactness is claimed only on the GPU (tests/gpu). Run by
tests/test_triton_interpreter.py with TRITON_INTERPRET=1 (skipped without it).
"""
import itertools

import pytest
import torch

pytest.importorskip("triton")

from sgdiff.kernels.layer_norm import layer_norm_reference  # noqa: E402
from sgdiff.kernels.layernorm_modulate import layernorm_modulate_reference as ref  # noqa: E402
from sgdiff.kernels.triton import layer_norm as tln, layernorm_modulate as tk  # noqa: E402
from sgdiff.kernels.triton import layernorm_channels_first as tcf  # noqa: E402
from tests.interpreter.common import FP32_BF16, assert_within, drawn, ids  # noqa: E402

pytestmark = pytest.mark.interpreter

RTOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}   # of the largest magnitude
TOLERANCES = pytest.mark.parametrize("dtype,rtol", list(RTOL.items()), ids=["float32", "bfloat16"])
SHAPES = [(2, 3, 64), (1, 5, 2240), (2, 2, 516), (1, 1, 1152)]   # [B, S, N]
HEAD_DIMS = [64, 72, 128, 256]

# layernorm_modulate's arguments from x, the weight w, the bias b, a table row's scale and shift
# and a per-token tensor: (x, weight, bias, eps, scale, shift, scale_plus_one)
MODULATE_ARGS = {
    "scale_shift": lambda x, w, b, scale, shift, tok: (x, None, None, 1e-6, scale, shift, True),
    "affine_scale": lambda x, w, b, scale, shift, tok: (x, w, b, 1e-5, scale, None, True),
    "weight_token_scale": lambda x, w, b, scale, shift, tok: (x, w, None, 1e-6, tok, shift, True),
    "affine_token_shift": lambda x, w, b, scale, shift, tok: (x, w, b, 1e-6, scale, tok, False),
    "one_batch": lambda x, w, b, scale, shift, tok: (x[0], None, None, 1e-6, scale[0, 0], shift[0, 0], True),
}

LAYER_NORM_FORMS = ["plain", "affine", "heads_first"]   # layer_norm's (x, weight, bias): script_draws


def script_draws():
    """The former script's random inputs in its order (see tests.interpreter.common.drawn)."""
    torch.manual_seed(0)
    for dtype in RTOL:
        for B, S, N in SHAPES:
            x = torch.randn(B, S, N + 4, dtype=dtype)[..., :N] * 3 + 1   # strided rows
            emb = torch.randn(B, 6 * N, dtype=dtype)
            shift, scale = emb[:, None].chunk(6, dim=-1)[:2]
            per_token = torch.randn(B, S, N, dtype=dtype)
            w, b = torch.randn(N, dtype=dtype), torch.randn(N, dtype=dtype)
            yield ("layernorm_modulate", dtype, (B, S, N)), (x, w, b, scale, shift, per_token)
    for dtype in FP32_BF16:
        x = torch.randn(2, 3, 2240, dtype=dtype) * 3 + 1
        w, b, sc = (torch.randn(2240, dtype=dtype) for _ in range(3))
        yield ("keep_row", dtype), (x, w, b, sc)
    for dtype, D in itertools.product(RTOL, HEAD_DIMS):
        q = torch.randn(2, 7, 3 * D, dtype=dtype).unflatten(-1, (3, D)) * 3 + 1
        yield ("layer_norm", dtype, D), dict(zip(LAYER_NORM_FORMS, [
            (q, None, None), (q, torch.randn(D, dtype=dtype), torch.randn(D, dtype=dtype)),
            (q.transpose(1, 2), torch.randn(D, dtype=dtype), None)]))   # heads-first view: copied
    yield ("layer_norm_rows_of_66",), torch.randn(2, 3, 66)
    # Wan's casts around an fp32 norm: bf16 x read as the fp32 it is cast to, the result cast back
    xb = torch.randn(2, 5, 1540, dtype=torch.bfloat16)[..., :1536] * 3 + 1
    sc, sh = torch.randn(2, 6, 1536).chunk(6, dim=1)[:2]
    wf, bf = torch.randn(1536), torch.randn(1536)
    yield ("wan",), (xb, sc, sh, wf, bf)


def inputs(*case):
    return drawn(script_draws(), case)


def assert_close_contiguous(got, want, rtol):
    assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
    assert_within(got, want, rtol)


@pytest.mark.parametrize("form", list(MODULATE_ARGS))
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@TOLERANCES
def test_layernorm_modulate(dtype, rtol, shape, form):
    args = MODULATE_ARGS[form](*inputs("layernorm_modulate", dtype, shape))
    assert tk.supported_layout(*args), args[0].shape
    assert_close_contiguous(tk.layernorm_modulate(*args), ref(*args), rtol)


@pytest.mark.parametrize("dtype", FP32_BF16, ids=ids)
def test_row_kept_or_read_again_same_bits(dtype, monkeypatch):
    # the row normalized from registers or read again: the same arithmetic, the same bits
    x, w, b, sc = inputs("keep_row", dtype)
    outs = []
    for keep in (True, False):
        monkeypatch.setattr(tk, "_keep_row", lambda *_, keep=keep: keep)
        outs.append(tk.layernorm_modulate(x, w, b, 1e-6, sc, sc, True))
    assert torch.equal(*outs), dtype


def test_keep_row_choice():
    wan = torch.empty(1, 32760, 5120, dtype=torch.float32, device="meta")
    assert tk._keep_row(wan, 32760, 10) and not tk._keep_row(wan.bfloat16(), 32760, 10)
    assert tk._keep_row(wan.bfloat16(), 2048, 5) and not tk._keep_row(wan.bfloat16(), 4608, 6)


# layer_norm: the same kernel without the modulation, over head_dim (per-head QK norm), any rows
# (head_dim <= 128: 16 rows a program, one per warp's lanes; 256: one row a program)
@pytest.mark.parametrize("form", LAYER_NORM_FORMS)
@pytest.mark.parametrize("D", HEAD_DIMS)
@TOLERANCES
def test_layer_norm(dtype, rtol, D, form):
    x, w, b = inputs("layer_norm", dtype, D)[form]
    assert tln.layer_norm_supported_layout(x, w, b, 1e-6)
    assert_close_contiguous(tln.layer_norm(x, w, b, 1e-6), layer_norm_reference(x, w, b, 1e-6), rtol)


WAN_CASES = {   # (op, its arguments from Wan's inputs)
    "modulate_to_bf16": ("layernorm_modulate", lambda xb, sc, sh, wf, bf: (xb, None, None, 1e-6, sc, sh, True,
                                                                           torch.float32, torch.bfloat16)),
    "modulate_fp32": ("layernorm_modulate", lambda xb, sc, sh, wf, bf: (xb, None, None, 1e-6, sc, sh, True,
                                                                        torch.float32, None)),
    "layer_norm_to_bf16": ("layer_norm", lambda xb, sc, sh, wf, bf: (xb, wf, bf, 1e-6, torch.float32, torch.bfloat16)),
    "layer_norm_128_to_bf16": ("layer_norm", lambda xb, sc, sh, wf, bf: (xb[:, :, :128], wf[:128], None, 1e-6,
                                                                         torch.float32, torch.bfloat16)),
}


@pytest.mark.parametrize("case", list(WAN_CASES))
def test_wan_fp32_norm_casts(case):
    op, make_args = WAN_CASES[case]
    if op == "layernorm_modulate":
        fn, ref_fn, supported = tk.layernorm_modulate, ref, tk.supported_layout
    else:
        fn, ref_fn, supported = tln.layer_norm, layer_norm_reference, tln.layer_norm_supported_layout
    args = make_args(*inputs("wan"))
    assert supported(*args)
    got, want = fn(*args), ref_fn(*args)
    assert_close_contiguous(got, want, 2e-5 if want.dtype == torch.float32 else 3e-2)


def test_wan_casts_refused():
    xb, sc, sh, wf, bf = inputs("wan")
    assert not tk.supported_layout(xb, None, None, 1e-6, sc, sh, True, torch.float16, None)      # a narrowing cast
    assert not tk.supported_layout(xb, None, None, 1e-6, sc.bfloat16(), sh.bfloat16(), True, torch.float32, None)
    assert not tln.layer_norm_supported_layout(xb, wf.bfloat16(), None, 1e-6, torch.float32, None)  # params not fp32


def test_refused_layouts():
    # layouts eager would normalize with another ATen kernel are refused
    assert not tln.layer_norm_supported_layout(inputs("layer_norm_rows_of_66"), None, None, 1e-6)   # N % 4 != 0
    torch.manual_seed(0)
    x = torch.randn(2, 3, 66)
    s = torch.randn(2, 1, 66)
    assert not tk.supported_layout(x, None, None, 1e-6, s, s)            # N % 4 != 0
    x = torch.randn(2 * 3 * 64 + 1)[1:].view(2, 3, 64)
    assert not tk.supported_layout(x, None, None, 1e-6, s[..., :64], None)  # misaligned rows
    assert not tk.supported_layout(torch.randn(2, 3, 64), None, None, 1e-6,
                                   torch.randn(2, 1, 64, dtype=torch.bfloat16), None)  # mixed dtypes
    b = torch.randn(64)  # a bias without a weight: eager's bits are not its vectorized kernel's
    assert not tk.supported_layout(torch.randn(2, 3, 64), None, b, 1e-6, s[..., :64], None)
    assert not tln.layer_norm_supported_layout(torch.randn(2, 3, 64), None, b, 1e-6)
    assert not tln.layer_norm_supported_layout(torch.randn(2, 3, 4, 64), None, b, 1e-6)


CHANNELS_FIRST = [  # [B, N, S] stored, read as [B, S, N]; (weight, bias, shift, plus_one, Wan's casts)
    ((2, 64, 7), (False, False, True, True, False)),  # one vector a thread for 16 threads: empty states
    ((1, 1152, 37), (True, True, True, True, False)),  # 3 tiles, the last partial; S not a multiple of 16
    ((2, 516, 20), (True, False, False, False, False)),  # N % 64 != 0
    ((1, 1536, 16), (False, False, True, True, True)),  # bf16 x normalized as the fp32 it is cast to
]


@TOLERANCES
@pytest.mark.parametrize("shape,form", CHANNELS_FIRST, ids=[ids(s) for s, _ in CHANNELS_FIRST])
def test_channels_first_rows_normalized_where_they_lie(shape, form, dtype, rtol):
    """``x = y.transpose(1, 2)`` of a channels-first [B, N, S] tensor: the last dim strided. The
    rows are normalized in place by the channels-first kernel (no copy), the output contiguous."""
    g = torch.Generator().manual_seed(3)
    affine_w, affine_b, has_shift, plus_one, wan = form
    B, N, S = shape
    y = (torch.randn(B, N, S, generator=g) * 3 + 1).to(dtype)
    x = y.transpose(1, 2)
    norm = torch.float32 if wan else dtype
    scale, shift = (torch.randn(B, 1, N, generator=g).to(norm) for _ in range(2))
    w, b = (torch.randn(N, generator=g).to(norm) for _ in range(2))
    args = (x, w if affine_w else None, b if affine_b else None, 1e-6, scale, shift if has_shift else None, plus_one,
            *((torch.float32, dtype) if wan else ()))
    assert x.stride(-1) != 1 and tk.supported_layout(*args) and tcf.supported(x)
    got, want = tk.layernorm_modulate(*args), ref(*args)
    assert got.is_contiguous() and got.shape == want.shape and got.dtype == want.dtype
    assert_within(got, want, rtol)
    assert torch.equal(tk.bind(*args)(*args), got)
    kernel, bound = tcf._layernorm_modulate_cols_kernel, []

    class Recorded:  # the channels-first kernel is what the launch binds, not a copy and the row kernel
        def bind(self, grid, **options):
            bound.append(grid)
            return kernel.bind(grid, **options)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tcf, "_layernorm_modulate_cols_kernel", Recorded())
        assert torch.equal(tk.bind(*args)(*args), got)
    assert bound == [(-(-S // tcf.TOKENS), B)]


def test_channels_first_with_addends_copied_first():
    """With a per-token table's addends the channels-first kernel does not apply (nor where a
    batch entry's offsets pass 32 bits): x is made contiguous by the tiled transpose (not
    Tensor.contiguous), moving x's bits, then normalized."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 64, 7, generator=g).transpose(1, 2)
    table, temb = torch.randn(1, 6, 64, generator=g), torch.randn(2, 7, 6, 64, generator=g)
    wide = table.unsqueeze(0).expand(2, 7, 6, 64)
    args = (x, None, None, 1e-6, wide[:, :, 1], wide[:, :, 0], True, None, None, temb[:, :, 1], temb[:, :, 0])
    assert tk.supported_layout(*args) and not tcf.supported(x, temb[:, :, 1], temb[:, :, 0])
    wide_rows = torch.empty_strided((1, 4, 2 ** 20), (2 ** 33, 1, 2 ** 12), device="meta")  # offsets past 32 bits
    assert tcf.supported(wide_rows[:, :, :2 ** 18]) and not tcf.supported(wide_rows)
    assert_within(tk.layernorm_modulate(*args), ref(*args), 2e-5)
    copy = tk._contiguous_copy(x)
    assert copy is not torch.Tensor.contiguous and torch.equal(copy(x), x.contiguous())
    odd = torch.randn(3, 64, 5, generator=g).transpose(1, 2)  # another geometry: its own copy
    assert torch.equal(tk._contiguous_copy(odd)(odd), odd.contiguous())


@pytest.mark.parametrize("x_dtype", [torch.float32, None], ids=["wan_casts", "fp32_rows"])
def test_addends_summed_in_the_kernel(x_dtype):
    """A per-token adaLN's scale and shift given as the table and embedding views eager summed
    (fp32 table, bf16 embedding): the kernel's sum, widened on load, is eager's fp32 sum; one
    without the other too. The warp-row kernel has no addends: the 4-warp kernel takes them."""
    torch.manual_seed(0)
    B, S, N = 2, 5, 1536
    table, temb = torch.randn(1, 6, N), torch.randn(B, S, 6, N, dtype=torch.bfloat16)
    wide = table.unsqueeze(0).expand(B, S, 6, N)
    x = torch.randn(B, S, N, dtype=torch.bfloat16 if x_dtype else torch.float32) * 3 + 1
    out_dtype = torch.bfloat16 if x_dtype else None
    for scale_add, shift_add in ((temb[:, :, 1], temb[:, :, 0]), (temb[:, :, 1], None), (None, temb[:, :, 0])):
        args = (x, None, None, 1e-6, wide[:, :, 1], wide[:, :, 0], True, x_dtype, out_dtype, scale_add, shift_add)
        assert tk.supported_layout(*args)
        got, want = tk.layernorm_modulate(*args), ref(*args)
        assert_close_contiguous(got, want, 2e-5 if out_dtype is None else 3e-2)
    # the sum must promote to the dtype normalized in: a bf16 sum of a bf16 x's rows is refused
    xb = torch.randn(B, S, N, dtype=torch.bfloat16)
    assert not tk.supported_layout(xb, None, None, 1e-6, wide[:, :, 1], None, True, None, None, temb[:, :, 1])
    assert tk.supported_layout(xb, None, None, 1e-6, temb[:, :, 2], None, True, None, None, temb[:, :, 1])
    assert not tk.supported_layout(x, None, None, 1e-6, wide[:, :, 1], None, True, x_dtype, out_dtype, None,
                                   temb[:, :, 0])  # an addend to no shift
