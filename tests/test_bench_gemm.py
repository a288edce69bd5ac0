"""bench/gemm.py on the CPU: its report from a result as a GPU run writes it, and the candidates it
times (every implementation's configurations), so it is ready for the GPU."""
import pytest
import torch

pytest.importorskip("diffusers")


def test_gemm_report_from_a_result(tmp_path):
    """bench/gemm.py's tables (and plot, where matplotlib is there) from a result as a GPU run
    writes it; the inductor-best field of the model bench needs both Inductor variants."""
    from bench import gemm, models

    case = dict(model="flux", site="ff up + gelu", M=4096, K=3072, N=12288, epilogue="gelu_tanh", bitexact=True,
                cublas_us=443.5, sgdiff_us=459.3, fused_us=519.2, unfused_us=513.7, chosen="reference",
                mismatched=[])
    result = dict(gpu="H200", torch="2.11", triton="3.6", commit="test", sweep=False, cases=[case])
    gemm.write_md(result, tmp_path)
    table = (tmp_path / "gemm.md").read_text()
    assert "| flux | ff up + gelu | 4096 | 3072 | 12288 | gelu_tanh | yes | 443.5 |" in table and "1.011" in table
    assert "| 1.036 |" in table and "| ?; ? | reference |" in table  # plain / cuBLAS; no fastest recorded
    gemm.write_md(dict(result, cases=[dict(case, plain_best="cute pingpong 128x192", fused_best="triton 128x256")]),
                  tmp_path)
    assert "| cute pingpong 128x192; triton 128x256 | reference |" in (tmp_path / "gemm.md").read_text()
    row = models.summarize(dict(inductor_ms=131.2))
    assert "inductor_best_ms" not in row  # reduce-overhead not measured: no best to claim
    assert models.summarize(dict(inductor_ms=131.2, inductor_reduce_overhead_ms=130.7))["inductor_best_ms"] == 130.7


def test_gemm_bench_times_every_implementations_configurations(monkeypatch):
    """bench/gemm.py's candidates: every configuration of every implementation that loads, runs
    on this device and takes the operands, labelled by backend; not the reference, not one that
    is not installed, not a cuBLAS-led variant."""
    from bench import gemm
    from sgdiff.kernels import registry

    class Spec:
        def __init__(self, backend, impl=None, devices=("cpu",)):
            self.backend, self.impl, self.devices = backend, impl, devices

        def supports(self, device_type, dtype_name, capability=None):
            return device_type in self.devices

        def load(self):
            if self.impl is None:
                raise ImportError("no quack")
            return self.impl

    def variants(*args):
        return [("a", "fa"), ("b", "fb"), ("cublas + chain", "fc")]

    specs = [Spec("cute"), Spec("triton", registry.Impl(run=None, variants=variants)),
             Spec("cuda only", registry.Impl(run=None, variants=variants), devices=("cuda",)),
             Spec("refuses", registry.Impl(run=None, variants=variants, supports=lambda *args: False)),
             Spec("untuned", registry.Impl(run=None)), Spec("reference", registry.Impl(run=None, variants=variants))]
    monkeypatch.setattr(registry, "kernel_specs", lambda op: specs)
    assert gemm.implementations("linear", (torch.zeros(2, 8),)) == [("triton a", "fa"), ("triton b", "fb")]
