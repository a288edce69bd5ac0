"""fxpasses.layouts: a norm that only sgdiff's convolutions read writes channels-last, and those
convolutions take it as eager's contiguous map — counted exactly on Flux's VAE decoder, near misses
left alone, outputs equal to eager (the references on the CPU; the kernels' bits against cuDNN:
tests/gpu/test_vae_gpu.py)."""
import pytest
import torch
import torch.nn.functional as F

from sgdiff import zoo
from sgdiff.fxpasses import layouts, manager

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def on_the_cpu(monkeypatch):
    """The backend's pass run on CPU graphs too; what it did to each graph: [(graph, count)]."""
    seen = []

    def run(gm):
        assert layouts.channels_last_into_convolutions(gm) == 0  # CPU tensors: cuDNN is not there
        count = layouts.channels_last_into_convolutions(gm, devices=("cpu",))
        seen.append((count, _flags(gm)))  # before the ops are lowered to their runners
        return count

    monkeypatch.setattr(manager, "channels_last_into_convolutions", run)
    return seen


def _flags(gm):
    """(producers writing channels-last, consumers reading it as contiguous), by op name."""
    out = ([], [])
    for node in gm.graph.nodes:
        if node.op != "call_function" or not str(node.target).startswith("sgdiff."):
            continue
        schema = node.target._schema.arguments
        values = dict(zip([a.name for a in schema], node.args))
        name = node.target._schema.name.split("::")[1]
        if values.get("channels_last"):
            out[0].append(name)
            assert node.meta["val"].is_contiguous(memory_format=torch.channels_last), node
        if values.get("conv_as_contiguous"):
            out[1].append(name)
    return sorted(out[0]), sorted(out[1])


def test_fluxs_resnet_blocks_read_channels_last_maps(on_the_cpu):
    """Tiny Flux VAE, bf16: each ResNet block's norm1 + SiLU feeds conv1 (in conv_group_norm),
    whose norm2 + SiLU feeds conv2 (in conv_residual): 2 x 4 producers, 2 x 4 consumers; the
    decoder's last norm + SiLU feeds ``conv_out``, which becomes a biased_conv. On CUDA only by
    default."""
    vae = zoo._flux_vae("tiny").to(torch.bfloat16).eval().requires_grad_(False)
    z = torch.randn(1, 4, 8, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        got = torch.compile(vae.decode, backend="sgdiff")(z, return_dict=False)[0]
        want = vae.decode(z, return_dict=False)[0]
    assert got.stride() == want.stride() and torch.equal(got, want)
    [(count, flags)] = on_the_cpu
    assert count == 9
    assert flags == (["conv_group_norm"] * 4 + ["group_norm"] * 5,
                     ["biased_conv"] + ["conv_group_norm"] * 4 + ["conv_residual"] * 4)


class Misses(torch.nn.Module):
    """One norm for each case: read by an sgdiff convolution alone (a site); read by it and
    returned too; read by a convolution without a bias (nothing for a pass to add); a float32
    one. And an upsampled map read by a biased convolution alone (a site), one read by a
    depthwise convolution (not cuDNN's)."""

    def __init__(self):
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.GroupNorm(4, 8) for _ in range(4))
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(8, 8, 3, padding=1, bias=i != 2) for i in range(4))
        self.up, self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x):
        up = self.up(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        depthwise = self.depthwise(F.interpolate(x * 2, scale_factor=2.0, mode="nearest"))
        h = [F.silu(n(x)) for n in self.norms[:3]]
        site = self.convs[0](h[0]) + x
        returned = self.convs[1](h[1]) + x
        plain = self.convs[2](h[2])
        norm, conv, x32 = self.norms[3], self.convs[3], x.float()
        h32 = F.silu(F.group_norm(x32, 4, norm.weight.float(), norm.bias.float(), norm.eps))
        wide = F.conv2d(h32, conv.weight.float(), conv.bias.float(), padding=1) + x32
        return site, returned, h[1], plain, wide, up, depthwise


def test_only_a_map_no_one_else_reads_changes_layout(on_the_cpu):
    model = Misses().to(torch.bfloat16).eval()
    x = torch.randn(1, 8, 6, 6, dtype=torch.bfloat16)
    with torch.no_grad():
        got, want = torch.compile(model, backend="sgdiff")(x), model(x)
    assert all(g.stride() == w.stride() and torch.equal(g, w) for g, w in zip(got, want))
    [(count, flags)] = on_the_cpu
    assert count == 2 and flags == (["group_norm", "upsample_nearest"], ["biased_conv", "conv_residual"])


def test_dynamic_shapes_keep_their_layouts(on_the_cpu):
    """Compiled with dynamic shapes: no map changes layout (nothing is guarded), the outputs eager's."""
    norm, conv = torch.nn.GroupNorm(4, 8), torch.nn.Conv2d(8, 8, 3, padding=1)
    model = torch.nn.Sequential(norm, torch.nn.SiLU(), conv).to(torch.bfloat16).eval()
    compiled = torch.compile(model, backend="sgdiff")
    for size in (6, 7):
        x = torch.randn(1, 8, size, size, dtype=torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 2)
        torch._dynamo.mark_dynamic(x, 3)
        with torch.no_grad():
            got, want = compiled(x), model(x)
        assert got.stride() == want.stride() and torch.equal(got, want)
    assert on_the_cpu and all(count == 0 for count, _ in on_the_cpu)
