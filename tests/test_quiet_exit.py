"""A test run ends with pytest's summary: no teardown noise from Triton after it (compiling a
Gluon kernel leaves libtriton objects that nanobind reports at interpreter teardown), and the
exit status is pytest's (tests/conftest.py's pytest_sessionfinish)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("passes", [True, False])
def test_a_run_that_compiled_gluon_kernels_ends_with_its_summary(passes, tmp_path):
    tests = ["tests/test_kernels_compile.py::test_launch_compiles_for_sm90"]
    if not passes:
        failing = tmp_path / "test_fails.py"
        failing.write_text("def test_fails():\n    assert False\n")
        tests.append(str(failing))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                          "layer_norm and per or fails", *tests], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=300)
    assert out.returncode == (0 if passes else 1), out.stdout[-2000:] + out.stderr[-2000:]
    assert "nanobind" not in out.stdout + out.stderr, (out.stdout + out.stderr)[-2000:]
    assert ("1 passed" if passes else "1 failed") in out.stdout.rstrip().splitlines()[-1]
