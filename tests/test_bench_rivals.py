"""bench/rivals.py compared with rivals of one's choosing: an A/B of two sgdiff variants with no
Inductor compile (the gemm family on and off), and a usage error for a rival that is one of ours."""
import json

import pytest


def test_rivals_of_ones_choosing(tmp_path):
    from bench import rivals

    assert rivals.main(["--models", "flux", "--size", "tiny", "--device", "cpu", "--dtype", "float32",
                        "--rounds", "2", "--repeats", "1", "--ours", "sgdiff_cudagraph_gemm",
                        "--rivals", "sgdiff_cudagraph_nogemm", "--out", str(tmp_path)]) == 0
    case = json.loads((tmp_path / "rivals.json").read_text())["cases"][0]
    assert set(case["steps"]) == {"sgdiff_cudagraph_gemm", "sgdiff_cudagraph_nogemm"}
    assert set(case["ratios"]["sgdiff_cudagraph_gemm"]) == {"sgdiff_cudagraph_nogemm"}
    assert case["inductor_best"] is None and case["equal"] == {"sgdiff_cudagraph_gemm": True}
    report = (tmp_path / "rivals.md").read_text()
    assert "| model | sgdiff variant | timing | sgdiff_cudagraph_nogemm | sgdiff | / sgdiff_cudagraph_nogemm (range) | equal |" in report
    mid, low, high = case["ratios"]["sgdiff_cudagraph_gemm"]["sgdiff_cudagraph_nogemm"]["ms"]
    assert "| flux (tiny) | sgdiff_cudagraph_gemm | synchronized |" in report and f"**{mid:.3f}** ({low:.3f}-{high:.3f})" in report
    assert "Inductor" not in report.split("\n", 1)[1].split("|", 1)[1]  # no Inductor column
    with pytest.raises(SystemExit):
        rivals.main(["--ours", "sgdiff_default", "--rivals", "sgdiff_default"])  # a rival among ours
    with pytest.raises(SystemExit):
        rivals.main(["--rivals", "cublas"])  # no such variant
