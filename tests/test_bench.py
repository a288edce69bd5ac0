"""The model benchmark runs end to end (tiny config, CPU), so it is ready for the GPU."""
import pytest
import torch

pytest.importorskip("diffusers")


def test_model_benchmark_on_a_tiny_flux(tmp_path):
    from bench import models

    row = models.run_model("flux", "tiny", torch.device("cpu"), torch.float32,
                           ["eager", "sgdiff"], repeats=1, steps=3)
    assert row["sgdiff_lossless_equal"] and row["trajectory_equal"] and row["trajectory_steps"] == 3
    assert row["sgdiff_lossless_best"] == "sgdiff" and row["sgdiff_lossless_ms"] > 0
    assert all(row[f"{v}_{k}"] > 0 for v in ("eager", "sgdiff") for k in ("host_ms", "pipelined_ms"))
    assert row["sgdiff_paired_ms"] > 0 and row["sgdiff_paired_eager_ms"] > 0  # steps alternating with eager's
    models.write_report(dict(gpu="cpu", torch=torch.__version__, triton="-", commit="test", cases=[row]), tmp_path)
    report = (tmp_path / "models.md").read_text()
    assert "flux (tiny, float32)" in report and "Host time of one step" in report
    assert "alternating with eager's" in report


@pytest.mark.parametrize("name", ["flux", "sana", "pixart", "wan", "qwenimage"])
def test_full_configs_run_on_the_meta_device(name):
    """The published sizes the GPU benchmark uses: shapes check out without any memory."""
    from sgdiff import zoo

    model, kwargs = zoo.build(name, "full", dtype=torch.bfloat16, device="meta")
    with torch.no_grad():
        out = model(**kwargs)[0]
    latents = kwargs["hidden_states"]
    assert out.shape[0] == latents.shape[0] and out.device.type == "meta"


def test_each_variant_in_a_process_of_its_own(tmp_path):
    """--isolate: one process per variant, merged into one row per model."""
    from bench import models

    assert models.main(["--models", "flux", "--size", "tiny", "--device", "cpu", "--dtype", "float32", "--variants",
                        "eager,sgdiff", "--isolate", "--repeats", "1", "--steps", "2", "--out", str(tmp_path)]) == 0
    import json

    (row,) = json.loads((tmp_path / "models.json").read_text())["cases"]
    assert row["eager_ms"] > 0 and row["sgdiff_ms"] > 0 and row["sgdiff_lossless_equal"] and row["trajectory_equal"]
