"""``python -m sgdiff demo`` as a new user meets it: its help, its errors, what it prints on a CPU."""
import subprocess
import sys

import pytest

pytest.importorskip("diffusers")


def _demo(*argv):
    return subprocess.run([sys.executable, "-m", "sgdiff", "demo", *argv], capture_output=True, text=True, timeout=600)


def test_help_names_each_model_and_its_sizes():
    out = " ".join(_demo("--help").stdout.split())  # as one line, whatever argparse's wrapping
    assert "Flux unless told" in out and "sana (SanaTransformer2DModel: tiny, full, blocks2)" in out


def test_an_unknown_size_is_an_error_not_a_fallback():
    out = _demo("--model", "sana", "--size", "small")
    assert out.returncode == 2 and "sana comes in tiny, full, blocks2, not 'small'" in out.stderr


def test_on_the_cpu_it_checks_equality_and_claims_no_speedup():
    from sgdiff import demo

    assert demo._count(512) == "512" and demo._count(81_920) == "81.9 k" and demo._count(12_000_000_000) == "12.0 B"
    out = _demo("--model", "sana", "--repeats", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "output torch.equal to eager: True" in out.stdout
    assert "No speed is measured on the CPU" in out.stdout and "x)" not in out.stdout
    assert " 0.0 M parameters" not in out.stdout
