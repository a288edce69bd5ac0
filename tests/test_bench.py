"""The model benchmark runs end to end (tiny config, CPU), so it is ready for the GPU."""
import json
import pathlib

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


def test_each_variant_in_a_process_of_its_own(tmp_path):
    """--isolate: one process per variant, merged into one row per model."""
    from bench import models

    assert models.main(["--models", "flux", "--size", "tiny", "--device", "cpu", "--dtype", "float32", "--variants",
                        "eager,sgdiff", "--isolate", "--repeats", "1", "--steps", "2", "--out", str(tmp_path)]) == 0
    import json

    (row,) = json.loads((tmp_path / "models.json").read_text())["cases"]
    assert row["eager_ms"] > 0 and row["sgdiff_ms"] > 0 and row["sgdiff_lossless_equal"] and row["trajectory_equal"]


def test_a_variant_whose_process_fails_leaves_its_error_and_the_others_run(monkeypatch):
    """--isolate: a variant's process that fails (Inductor's reduce-overhead once did) is an error
    in the row, not the end of the run."""
    import subprocess
    import types

    from bench import models

    def run(argv, cwd=None):
        variant, out = argv[argv.index("--variants") + 1], argv[argv.index("--out") + 1]
        if variant == "inductor_reduce_overhead":
            return types.SimpleNamespace(returncode=1)
        case = {"model": "sana", f"{variant}_ms": 1.0, f"{variant}_equal": True}
        (pathlib.Path(out) / "models.json").write_text(json.dumps({"cases": [case]}))
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(subprocess, "run", run)
    row = models.run_isolated("sana", ["inductor", "inductor_reduce_overhead", "sgdiff_cudagraph"], [])
    assert row["inductor_ms"] == row["sgdiff_cudagraph_ms"] == 1.0
    assert row["inductor_reduce_overhead_errors"] == ["its process exited with status 1"]
    assert "inductor_best_ms" not in row  # Inductor's best needs both of its variants


def _kernel_case(op, us, note="n"):
    return dict(op=op, shape=[2, 3], dtype="bfloat16", note=note, bitexact=True, mismatches=0, sgdiff_us=us,
                eager_us=2 * us, inductor_us=us, copy_us=us, wall_sgdiff_launcher_us=1.0, wall_sgdiff_us=1.0,
                wall_eager_us=1.0)


def test_examples_picked_by_their_description():
    """--match: only the examples whose description holds the text, of the ops asked for."""
    from bench.kernels import bench_examples

    every = list(bench_examples(["layernorm_modulate"]))
    picked = list(bench_examples(["layernorm_modulate"], match="channels-first"))
    assert len(every) > 1 and [e.label for _, e in picked] == [e.label for _, e in every if "channels-first" in e.label]
    assert len(picked) == 1 and not list(bench_examples(["rope"], match="channels-first"))


def test_partial_kernel_runs_merge_case_by_case(tmp_path):
    """A run of some ops replaces those cases only; every case keeps the commit it ran at."""
    from bench import kernels

    meta = dict(gpu="g", torch="t", triton="tr")
    old = dict(meta, commit="aaa", cases=[_kernel_case("rope", 1.0), _kernel_case("residual_gate", 2.0),
                                          _kernel_case("layernorm_modulate", 3.0)])
    new = dict(meta, commit="bbb", cases=[_kernel_case("residual_gate", 1.5), _kernel_case("modulate", 4.0)])
    merged = kernels.merge_results(old, new)
    assert [(c["op"], c["sgdiff_us"], c["commit"]) for c in merged["cases"]] == [
        ("layernorm_modulate", 3.0, "aaa"), ("modulate", 4.0, "bbb"), ("residual_gate", 1.5, "bbb"),
        ("rope", 1.0, "aaa")]  # in the registry's order of ops
    (tmp_path / "kernels.json").write_text(__import__("json").dumps(old))
    (tmp_path / "new.json").write_text(__import__("json").dumps(new))
    assert kernels.main(["--out", str(tmp_path), "--merge", str(tmp_path / "new.json")]) == 0
    assert "| bbb |" in (tmp_path / "kernels.md").read_text() and "| aaa |" in (tmp_path / "kernels.md").read_text()


def _merged_by_main(main, runs, tmp_path, name):
    """A bench's ``main(["--merge", ...])`` over ``runs`` written as files (earliest first) into
    ``tmp_path/out``: the merged results it wrote to ``<name>.json``."""
    import json

    paths = []
    for i, run in enumerate(runs):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run))
    assert main(["--merge", *map(str, paths), "--out", str(tmp_path / "out")]) == 0
    return json.loads((tmp_path / "out" / f"{name}.json").read_text())


def test_runs_of_another_gpu_merge_tagged_with_it(tmp_path):
    """A run on another GPU replaces its cases only; each case keeps its GPU, the table's title
    names both and each row says which it ran on; runs of one GPU print the commit alone."""
    from bench import kernels

    old = dict(gpu="NVIDIA H200", torch="t", triton="tr", commit="aaa",
               cases=[_kernel_case("rope", 1.0), _kernel_case("modulate", 2.0)])
    new = dict(old, gpu="NVIDIA H100 80GB HBM3", commit="bbb", cases=[_kernel_case("modulate", 1.5)])
    merged = kernels.merge_results(old, new)
    assert merged["gpu"] == "NVIDIA H100 80GB HBM3 / NVIDIA H200"
    assert {c["op"]: (c["gpu"], kernels.run_label(c, merged)) for c in merged["cases"]} == {
        "rope": ("NVIDIA H200", "aaa, H200"), "modulate": ("NVIDIA H100 80GB HBM3", "bbb, H100")}
    alone = kernels.merge_results(old, dict(new, gpu="NVIDIA H200"))
    assert alone["gpu"] == "NVIDIA H200" and kernels.run_label(alone["cases"][0], alone) in ("aaa", "bbb")
    assert kernels.run_header(merged) == "commit, GPU" and kernels.run_header(alone) == "commit"


def test_pipeline_runs_split_over_calls_join_into_one_row(tmp_path):
    """bench/pipelines.py --merge: a pipeline whose Inductor and sgdiff variants ran in two calls
    (each with its own eager) is one row; a run on another GPU or with other warm-up calls
    replaces the row instead of joining it."""
    from bench import pipelines

    def case(**figures):
        return dict(pipeline="wan", size="full", steps=20, warmup_calls=2, **figures)

    meta = dict(torch="t", triton="tr")
    flux = dict(pipeline="flux", size="full", steps=28, warmup_calls=0, eager_s=5.0, inductor_s=3.7, sgdiff_s=3.6)
    runs = [dict(meta, gpu="H200", commit="aaa", cases=[flux]),
            dict(meta, gpu="H100", commit="bbb", cases=[case(eager_s=28.3, inductor_s=23.6, peak_gib=dict(eager=7.3,
                                                                                                        inductor=7.9))]),
            dict(meta, gpu="H100", commit="bbb", cases=[case(eager_s=28.4, sgdiff_s=22.9, sgdiff_equal=True,
                                                             peak_gib=dict(eager=7.3, sgdiff=8.9))])]
    merged = _merged_by_main(pipelines.main, runs, tmp_path, "pipelines")
    wan = merged["cases"][1]
    assert [c["pipeline"] for c in merged["cases"]] == ["flux", "wan"]
    assert (wan["eager_s"], wan["inductor_s"], wan["sgdiff_s"], wan["gpu"]) == (28.4, 23.6, 22.9, "H100")
    assert wan["peak_gib"] == dict(eager=7.3, inductor=7.9, sgdiff=8.9)
    assert "| 7.3 / 7.9 / 8.9 | - | bbb, H100 |" in (tmp_path / "out" / "pipelines.md").read_text()
    other = dict(runs[2], gpu="H200", cases=[case(eager_s=20.0, sgdiff_s=15.0)])
    again = pipelines.merge_runs(merged, other)
    assert "inductor_s" not in again["cases"][1] and again["cases"][1]["gpu"] == "H200"


def test_a_later_run_joining_a_row_keeps_its_own_commit_and_notes(tmp_path):
    """A run of eager and sgdiff at a later commit joins the earlier Inductor figures; the row
    names the later commit (not the one the joined figures came from) and prints its note."""
    from bench import pipelines

    meta = dict(torch="t", triton="tr", gpu="H100")
    row = dict(pipeline="wan", size="full", steps=20, warmup_calls=2)
    runs = [dict(meta, commit="aaa", cases=[dict(row, eager_s=28.3, inductor_s=23.6, sgdiff_s=22.9, commit="aaa")]),
            dict(meta, commit="ccc", cases=[dict(row, eager_s=27.6, sgdiff_s=22.1, note="Inductor from aaa")])]
    merged = _merged_by_main(pipelines.main, runs, tmp_path, "pipelines")
    wan = merged["cases"][0]
    assert (wan["inductor_s"], wan["sgdiff_s"], wan["commit"], wan["note"]) == (23.6, 22.1, "ccc", "Inductor from aaa")
    report = (tmp_path / "out" / "pipelines.md").read_text()
    assert "| ccc |" in report and "- wan (full): Inductor from aaa" in report


def test_runs_compare_with_inductor_case_by_case(tmp_path):
    """--across: for each case that ran more than once, every run's pair, the medians and how
    often sgdiff took no longer than Inductor and than 1.5 copies, launched as shipped and
    plainly; cases that ran once are left out."""
    import json

    from bench import kernels

    meta = dict(gpu="g", torch="t", triton="tr")
    runs = [dict(meta, commit="aaa", cases=[dict(_kernel_case("rope", 1.0), inductor_us=1.1),
                                            dict(_kernel_case("residual_gate", 2.0), inductor_us=1.9, copy_us=1.2),
                                            _kernel_case("modulate", 3.0)]),
            dict(meta, commit="bbb", cases=[dict(_kernel_case("residual_gate", 2.0), inductor_us=2.0,
                                                 sgdiff_plain_us=2.2, copy_us=1.4),
                                            dict(_kernel_case("rope", 1.2), inductor_us=1.0)]),
            dict(meta, commit="ccc", cases=[dict(_kernel_case("residual_gate", 1.8), inductor_us=2.1,
                                                 sgdiff_plain_us=1.9, copy_us=1.0),
                                            dict(_kernel_case("rope", 1.0), note="another", inductor_us=2.0)])]
    rows = kernels.across_runs(runs)
    assert [(r["op"], r["commits"], r["at_or_below_inductor"]) for r in rows] == [
        ("rope", ["aaa", "bbb"], 1), ("residual_gate", ["aaa", "bbb", "ccc"], 2)]  # a tie counts as at or below
    gate = rows[1]
    assert (gate["sgdiff_us"], gate["inductor_us"], gate["sgdiff_median_us"], gate["inductor_median_us"]) == \
        ([2.0, 2.0, 1.8], [1.9, 2.0, 2.1], 2.0, 2.0)
    # over a copy: 2.0 / 1.2 and 1.8 / 1.0 above the bar, 2.0 / 1.4 below; plain in two runs only
    assert gate["copy_ratio_median"] == pytest.approx(2.0 / 1.2) and gate["within_copy_bar"] == 1
    assert (gate["plain_runs"], gate["plain_median_us"], gate["plain_at_or_below_inductor"]) == (2, 2.05, 1)
    assert gate["plain_within_copy_bar"] == 0 and gate["plain_copy_ratio_median"] == pytest.approx((2.2 / 1.4 + 1.9) / 2)
    assert rows[0]["plain_runs"] == 0 and rows[0]["plain_median_us"] is None
    paths = []
    for run in runs:
        paths.append(tmp_path / f"{run['commit']}.json")
        paths[-1].write_text(json.dumps(run))
    assert kernels.main(["--out", str(tmp_path / "out"), "--across", *map(str, paths)]) == 0
    report = (tmp_path / "out" / "kernels-across-runs.md").read_text()
    assert "| residual_gate | 2×3 | bfloat16 | n | aaa, bbb, ccc | 2.000 / 1.900, 2.000 / 2.000, 1.800 / 2.100 | " \
           "2.000 | 2.000 | 2 of 3 | 1.667 | 1 of 3 | 2.050 | 1 of 2 | 1.736 | 0 of 2 | - | - |" in report
    assert "| rope | 2×3 | bfloat16 | n | aaa, bbb | 1.000 / 1.100, 1.200 / 1.000 | 1.100 | 1.050 | 1 of 2 | " \
           "1.000 | 2 of 2 | - | - | - | - | - | - |" in report
    assert "| modulate |" not in report and "another" not in report


def test_across_runs_tells_a_tie_by_inductor_timed_twice(tmp_path):
    """Runs that timed Inductor's chain twice give the gap between its two timings: sgdiff above
    Inductor by no more than that run's gap is within noise, by more is not; runs without the
    second timing count in neither; the table and the report show both."""
    from bench import kernels

    meta = dict(gpu="g", torch="t", triton="tr")
    above_by_less = dict(_kernel_case("residual_gate", 388.0), inductor_us=387.8, inductor_again_us=388.3)  # gap 0.5
    above_by_more = dict(_kernel_case("residual_gate", 389.0), inductor_us=387.8, inductor_again_us=387.6)  # gap 0.2
    below = dict(_kernel_case("residual_gate", 387.0), inductor_us=387.8, inductor_again_us=387.7)  # gap 0.1
    untimed = dict(_kernel_case("residual_gate", 390.0), inductor_us=387.8)
    row, = kernels.across_runs([dict(meta, commit=c, cases=[case]) for c, case in
                                (("a", above_by_less), ("b", above_by_more), ("c", below), ("d", untimed))])
    assert (row["noise_runs"], row["within_noise"]) == (3, 2)
    assert row["noise_median_us"] == pytest.approx(0.2)
    kernels.write_report(dict(meta, commit="c", cases=[above_by_less, untimed]), tmp_path)
    table = [line for line in (tmp_path / "kernels.md").read_text().splitlines() if line.startswith("| residual_gate")]
    assert "| 387.8 | 388.3 | 388.0 |" in table[0] and "| 387.8 | - | 390.0 |" in table[1]
    kernels.write_across_runs([dict(meta, commit=c, cases=[case]) for c, case in (("a", above_by_less), ("d", untimed))],
                              tmp_path)
    assert "| 0.500 | 1 of 1 |" in (tmp_path / "kernels-across-runs.md").read_text()


def test_across_runs_bars_a_convolution_case_on_its_own_kernel():
    """A ‡ case (a convolution and sgdiff's epilogue): the copy ratio takes the epilogue's time,
    launched as shipped and plainly (the plain call's convolution taken off)."""
    from bench import kernels

    meta = dict(gpu="g", torch="t", triton="tr")
    conv = dict(_kernel_case("conv_silu", 100.0), kernel_us=12.0, sgdiff_plain_us=100.5, copy_us=10.0)
    rows = kernels.across_runs([dict(meta, commit="aaa", cases=[conv]), dict(meta, commit="bbb", cases=[conv])])
    assert rows[0]["copy_ratio_median"] == pytest.approx(1.2) and rows[0]["within_copy_bar"] == 2
    assert rows[0]["plain_copy_ratio_median"] == pytest.approx(1.25) and rows[0]["plain_within_copy_bar"] == 2


def test_a_model_run_folds_in_variant_by_variant(tmp_path):
    """A later run of some variants replaces those variants' figures only, each tagged with its commit."""
    import json

    from bench import models

    row = models.run_model("flux", "tiny", torch.device("cpu"), torch.float32, ["eager", "sgdiff"], repeats=1,
                           steps=0)
    meta = dict(gpu="cpu", torch="t", triton="tr")
    old = dict(meta, commit="aaa", cases=[dict(row, model="flux", commit="aaa"), dict(row, model="sana", commit="aaa")])
    new_sana = {k: v for k, v in row.items() if not k.startswith("eager_")}
    new = dict(meta, commit="bbb", cases=[dict(new_sana, model="sana", sgdiff_ms=1.25, commit="bbb")])
    inductor_only = dict(meta, commit="ccc", cases=[dict(model="flux", inductor_ms=2.5, inductor_equal=False,
                                                         inductor_max_diff=0.1, inductor_first_call_s=3.0)])
    for name, run in (("new.json", new), ("ind.json", inductor_only)):
        (tmp_path / name).write_text(json.dumps(run))
    (tmp_path / "models.json").write_text(json.dumps(old))
    assert models.main(["--out", str(tmp_path), "--merge", str(tmp_path / "new.json"), str(tmp_path / "ind.json")]) == 0
    flux, sana = json.loads((tmp_path / "models.json").read_text())["cases"]
    assert (flux["commit"], flux["inductor_commit"], flux["inductor_ms"], flux["sgdiff_ms"]) == \
        ("aaa", "ccc", 2.5, row["sgdiff_ms"])
    assert (sana["commit"], sana["sgdiff_ms"], sana["eager_commit"], sana["eager_ms"]) == \
        ("bbb", 1.25, "aaa", row["eager_ms"])  # eager kept from the earlier run
    assert sana["sgdiff_lossless_ms"] == 1.25  # the headline recomputed
    assert "flux aaa (inductor ccc), sana bbb (eager aaa)" in (tmp_path / "models.md").read_text()


def test_the_copy_ratio_of_an_op_with_a_convolution_is_its_own_kernels(tmp_path):
    """A case that times sgdiff's own kernel (a convolution's epilogue) reports that kernel
    against the copy, marked, while its other columns keep the convolution."""
    from bench import kernels

    conv = dict(_kernel_case("conv_silu", 180.0), copy_us=20.0, kernel_us=30.0)
    kernels.write_report(dict(gpu="g", torch="t", triton="tr", commit="c", cases=[conv, _kernel_case("rope", 2.0)]),
                         tmp_path)
    rows = [line for line in (tmp_path / "kernels.md").read_text().splitlines() if line.startswith("| conv_silu")
            or line.startswith("| rope")]
    assert "| 180.0 |" in rows[0] and "| 1.50 ‡ (30.0) |" in rows[0] and "9.00" not in rows[0]
    assert "| 1.00 |" in rows[1] and "‡" not in rows[1]


def test_the_copy_bar_takes_the_faster_copy(tmp_path):
    """Where a run timed the copy both ways (copy_ and a kernel on the SMs), the table, the
    ratio and the comparison across runs take the faster; runs that timed copy_ alone keep it."""
    from bench import kernels

    slow_memcpy = dict(_kernel_case("residual_gate", 400.0), copy_us=620.0, copy_sm_us=396.0)
    slow_kernel = dict(_kernel_case("rope", 2.0), copy_us=2.0, copy_sm_us=2.5)
    kernels.write_report(dict(gpu="g", torch="t", triton="tr", commit="c", cases=[slow_memcpy, slow_kernel]), tmp_path)
    rows = [line for line in (tmp_path / "kernels.md").read_text().splitlines() if line.startswith("| r")]
    assert "| 396.0 | 1.01 |" in rows[0] and "620.0" not in rows[0]
    assert "| 2.0 | 1.00 |" in rows[1]
    meta = dict(gpu="g", torch="t", triton="tr")
    older = dict(_kernel_case("residual_gate", 400.0), copy_us=620.0)  # before copy_sm_us: the memcpy
    row, = kernels.across_runs([dict(meta, commit="a", cases=[older]), dict(meta, commit="b", cases=[slow_memcpy]),
                                dict(meta, commit="c", cases=[slow_memcpy])])
    assert row["copy_ratio_median"] == pytest.approx(400.0 / 396.0) and row["within_copy_bar"] == 3


def test_tier_bench_on_a_tiny_flux(tmp_path):
    """bench/tiers.py end to end (CPU, tiny), every tier through the per-call switch: its table;
    lossless against itself is inf dB and 0 apart; the PSNR's arithmetic on a known error."""
    import math

    from bench import tiers

    assert tiers.main(["--models", "flux", "--size", "tiny", "--device", "cpu", "--dtype", "float32",
                       "--repeats", "1", "--steps", "2", "--out", str(tmp_path)]) == 0
    cases = json.loads((tmp_path / "tiers.json").read_text())["cases"]
    assert [c["tier"] for c in cases] == ["lossless", "extra-high", "high"]
    lossless = cases[0]
    assert lossless["psnr_db_50"] == math.inf and lossless["max_diff_step"] == 0 and lossless["steps"] == 2
    assert all(c["step_ms"] > 0 and c["lossless_ms"] == lossless["step_ms"] for c in cases)
    assert all(c["step_ms_range"][0] <= c["step_ms"] <= c["step_ms_range"][1] for c in cases)
    # the sites each tier took: lossless's families in every tier, and from extra-high on the two
    # feed-forwards' GEMM + GELU (fp32 here: no attention or FP8 GEMM site, those ops take 16-bit inputs)
    assert lossless["sites"]["modulate"] == 6 and lossless["sites"]["activation"] == 1
    assert all(c["sites"]["activation"] == 3 and c["sites"]["modulate"] == 6 for c in cases[1:])
    assert not {"attention", "fp8_gemm", "int8_attention"} & {f for c in cases for f in c["sites"]}
    ref = torch.tensor([2.0, -1.0, 0.5, 0.0])
    assert tiers.psnr_db(ref + torch.tensor([0.02, 0.0, 0.0, 0.0]), ref) == pytest.approx(10 * math.log10(4 / 1e-4))
    assert "| flux (tiny) | high |" in (tmp_path / "tiers.md").read_text()
    assert "What first sight kept" not in (tmp_path / "tiers.md").read_text()  # no attention site on the CPU


def test_tier_report_names_the_attention_kernels_first_sight_kept(tmp_path):
    from bench import tiers

    case = dict(model="flux", size="full", tier="high", step_ms=90.0, step_ms_range=[89.0, 91.0], lossless_ms=130.0,
                psnr_db_50=40.0, max_diff_step=0.5, steps=50, sites={"int8_attention": 57},
                attention_kernels=[dict(op="attention_int8", q=[1, 24, 4608, 128], chosen="cudnn fp8")])
    tiers.write_report(dict(gpu="H200", torch="2.11", triton="3.6", commit="abc", cases=[case]), tmp_path)
    assert "- flux high: attention_int8 (1, 24, 4608, 128) cudnn fp8" in (tmp_path / "tiers.md").read_text()


def test_pipeline_bench_on_tiny_pipelines(tmp_path):
    """bench/pipelines.py end to end (CPU, tiny Flux, Wan and Sana pipelines, eager and sgdiff): the
    pipelines' outputs and their VAE decodes torch.equal to eager's, the table written."""
    from bench import pipelines

    assert pipelines.main(["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--repeats", "1",
                           "--variants", "eager,sgdiff", "--out", str(tmp_path)]) == 0
    cases = json.loads((tmp_path / "pipelines.json").read_text())["cases"]
    assert [c["pipeline"] for c in cases] == ["flux", "wan", "sana"]
    for c in cases:
        assert c["sgdiff_equal"] is True and c["vae_sgdiff_equal"] is True and c["steps"] == 2
        assert c["eager_s"] > 0 and c["sgdiff_s"] > 0 and c["vae_sgdiff_ms"] > 0
    assert "| wan (tiny) | 2 | 2 |" in (tmp_path / "pipelines.md").read_text()


@pytest.mark.parametrize("name,latents,image", [("flux", (1, 16, 128, 128), (1, 3, 1024, 1024)),
                                                ("wan", (1, 16, 21, 60, 104), (1, 3, 81, 480, 832)),
                                                ("sana", (1, 32, 32, 32), (1, 3, 1024, 1024))])
def test_full_vaes_decode_on_the_meta_device(name, latents, image):
    """The full pipelines' VAEs (bench/pipelines.py): Flux.1-dev's at 1024², Wan 2.1's at 480p x 81
    frames, Sana's DC-AE at 1024², shapes checked without any memory."""
    from sgdiff.zoo import pipelines

    vae = getattr(pipelines, f"_{name}_vae")("full").to("meta")
    with torch.no_grad():
        assert tuple(vae.decode(torch.empty(latents, device="meta"), return_dict=False)[0].shape) == image


def test_small_models_and_their_merge(tmp_path, monkeypatch):
    """bench.small_models on the CPU (tiny configs standing in for blocks2): the fields the
    results promise, and a later run of one case folded in with its own commit."""
    import json

    from bench import small_models
    from sgdiff import zoo

    build = zoo.build
    monkeypatch.setattr(zoo, "build", lambda name, size, **kw: build(name, "tiny", **kw))
    args = ["--device", "cpu", "--dtype", "float32", "--calls", "1", "--rounds", "1"]
    assert small_models.main(args + ["--cases", "flux,sana", "--variants", "eager,sgdiff_default,sgdiff_no_cudagraphs",
                                     "--out", str(tmp_path / "a")]) == 0
    first = json.loads((tmp_path / "a" / "small_models.json").read_text())
    assert [c["model"] for c in first["cases"]] == ["flux", "sana"]
    for c in first["cases"]:
        assert c["equal"] is True and c["eager_ms"] > 0 and c["sgdiff_default_ms"] > 0
        assert c["sgdiff_no_cudagraphs_equal"] is True
    again = dict(first, commit="later", cases=[dict(first["cases"][1], eager_ms=1.0)])
    (tmp_path / "b.json").write_text(json.dumps(again))
    assert small_models.main(["--merge", str(tmp_path / "b.json"), "--out", str(tmp_path / "a")]) == 0
    merged = json.loads((tmp_path / "a" / "small_models.json").read_text())
    assert [(c["model"], c["commit"], c["eager_ms"] == 1.0) for c in merged["cases"]] == [
        ("flux", first["commit"], False), ("sana", "later", True)]
    assert "| sana |" in (tmp_path / "a" / "small_models.md").read_text()


def test_soak_counts_recompiles_and_checks_every_output():
    from bench import soak

    case = soak.run(calls=10, sides=(6, 8), device="cpu")
    assert case["unequal"] == 0 and case["graphs"] == 2 and case["recompiles_after_warm_up"] == 0
    assert len(case["cycles"]) == 5


def test_small_models_gives_each_compiled_variant_a_recompile_budget(monkeypatch):
    """The variants compile the same code and dynamo's recompile limit counts them together:
    run_case raises it to the default for each compiled variant, and only while it runs."""
    from bench import small_models

    seen = []

    def target(x):
        seen.append(torch._dynamo.config.recompile_limit)
        return (x + 1,)

    x = torch.ones(3)
    monkeypatch.setattr(small_models, "build", lambda case, device, dtype: ((lambda fn: fn(x)[0]), target))
    before = torch._dynamo.config.recompile_limit
    row = small_models.run_case("stand-in", ["eager", "sgdiff_default", "sgdiff_no_cudagraphs"],
                                torch.device("cpu"), torch.float32, calls=1, rounds=1)
    assert row["equal"] is True
    assert max(seen) == max(before, 16)  # eager's calls run inside run_case, under the raised limit
    assert torch._dynamo.config.recompile_limit == before


def test_zoo_runs_merge_with_todays_expected_counts(tmp_path):
    """bench/zoo.py --merge: the later run's row replaces the earlier one's, the expected counts
    are read from sgdiff/zoo/sites.py, the coverage counts a model's rewrites up to its total."""
    from bench import zoo as zoo_bench
    from sgdiff.zoo import sites

    def row(model, found, ms):
        return dict(model=model, found=found, expected={}, unexpected={}, equal=True, sgdiff_kernels=3,
                    eager_ms=2 * ms, sgdiff_ms=ms, sgdiff_default_ms=ms, sgdiff_default_vs_eager=0.5)

    meta = dict(gpu="g", torch="t", triton="tr", dtype="bfloat16")
    flux = dict(sites.expected("flux", "bf16", "blocks2"))
    short = dict(flux, qk_norm=flux["qk_norm"] - 2)  # an older run's count
    dit = dict(sites.expected("dit", "bf16", "blocks2"), modulate=1)  # 4 of dit's modulates missing
    runs = [dict(meta, commit="aaa", coverage={}, cases=[row("flux", short, 4.0), row("dit", dit, 1.0)]),
            dict(meta, commit="bbb", coverage={}, cases=[row("flux", flux, 3.0)])]
    merged = _merged_by_main(zoo_bench.main, runs, tmp_path, "zoo")
    by_model = {c["model"]: c for c in merged["cases"]}
    assert by_model["flux"]["commit"] == "bbb" and by_model["flux"]["sgdiff_ms"] == 3.0
    assert by_model["dit"]["commit"] == "aaa" and by_model["dit"]["expected"] == sites.expected("dit", "bf16", "blocks2")
    due = sum(flux.values()) + sum(sites.expected("dit", "bf16", "blocks2").values())
    assert merged["coverage"]["expected"] == due and merged["coverage"]["found"] == due - 4
    assert "| flux |" in (tmp_path / "out" / "zoo.md").read_text()


def test_memory_bench_finds_the_blocks_alive_at_the_peak():
    """bench/memory.py's reading of the allocator's history: the peak, the blocks alive there in
    allocation order, and where each came from (a compiled graph's line by its text)."""
    from bench.memory import origin, peak_blocks

    def alloc(addr, size, frames=()):
        return dict(action="alloc", addr=addr, size=size, frames=list(frames))

    def free(addr, size):
        return dict(action="free_completed", addr=addr, size=size)

    graph = dict(filename="<eval_with_key>.7", line=2, name="forward")
    trace = [alloc(1, 100), alloc(2, 50, [graph]), free(1, 100), alloc(3, 120), alloc(4, 10), free(3, 120),
             alloc(5, 500), free(5, 500)]
    total, blocks = peak_blocks(trace)
    assert total == 50 + 10 + 500 and [b["addr"] for b in blocks] == [2, 4, 5]
    total, blocks = peak_blocks(trace[:6])
    assert total == 180 and [b["addr"] for b in blocks] == [2, 3, 4]
    graphs = {"<eval_with_key>.7": ["def forward(self, x):", "    y = torch.ops.aten.mul.Tensor(x, 2)"]}
    sgdiff_frame = dict(filename="/site/sgdiff/kernels/x.py", line=9, name="launch")
    assert origin([sgdiff_frame, graph], graphs) == \
        "x.py:9:launch <- graph 7:2: y = torch.ops.aten.mul.Tensor(x, 2)"
    assert origin([dict(filename="/usr/lib/python3/threading.py", line=1, name="run")], graphs) == "?"


def test_a_model_whose_eager_differs_from_itself_runs_again_deterministic(monkeypatch):
    """bench/zoo.py: where eager's outputs differ from call to call (atomic adds), the whole case
    runs again with torch's deterministic kernels, the row says so, and the mode is put back."""
    from bench import zoo as zoo_bench

    modes = []

    def run_case(name, variants, *args, **kwargs):
        deterministic = torch.are_deterministic_algorithms_enabled()
        modes.append(deterministic)
        return dict(model=name, eager_equal=deterministic, equal=deterministic)

    monkeypatch.setattr(zoo_bench, "run_case", run_case)
    row = zoo_bench.measure("dit", torch.device("cpu"), 1, 1)
    assert modes == [False, True] and row["deterministic"] and row["equal"]
    assert not torch.are_deterministic_algorithms_enabled()
    modes.clear()
    monkeypatch.setattr(zoo_bench, "run_case", lambda name, *a, **k: dict(model=name, eager_equal=True, equal=True))
    assert "deterministic" not in zoo_bench.measure("dit", torch.device("cpu"), 1, 1)



@pytest.mark.parametrize("name,label", [
    ("nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_bias_TNT", "fp8 gemm"),
    ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("_attention_kernel", "attention"),
    ("_gelu_rows_fp8_kernel", "sgdiff triton"),
    ("_cast_copy_kernel", "sgdiff triton"),
    ("Memset (Device)", "memory"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous namespace)::Op",
     "memory"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous namespace)::silu_kernel", "aten"),
    ("aten::mm", "gemm"), ("aten::add", "aten"), ("some_vendor_kernel", "other"),
])
def test_the_profiles_categories_read_kernel_names(name, label):
    from bench import profile

    assert profile.category(name) == label


def test_profile_bench_runs_end_to_end_on_the_cpu(tmp_path):
    """bench/profile.py (CPU, tiny Flux, two tiers): a case a tier, its time split into categories
    that add up to it, the longest ops listed longest first, and the report's tables."""
    from bench import profile

    assert profile.main(["--models", "flux", "--size", "tiny", "--device", "cpu", "--dtype", "float32",
                         "--tiers", "lossless,high", "--calls", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "profile.json").read_text())
    assert [c["tier"] for c in result["cases"]] == ["lossless", "high"] and result["gpu"] == "cpu"
    for c in result["cases"]:
        assert c["kernel_ms"] > 0 and sum(c["categories"].values()) == pytest.approx(c["kernel_ms"])
        assert c["categories"].get("gemm", 0) > 0
        us = [k["us"] for k in c["kernels"]]
        assert us == sorted(us, reverse=True) and 0 < len(us) <= profile.KEPT
        assert all(k["category"] == profile.category(k["name"]) for k in c["kernels"])
    report = (tmp_path / "profile.md").read_text()
    assert "## flux (tiny), high:" in report and "| category | ms |" in report


def test_rivals_bench_on_a_tiny_flux(tmp_path, monkeypatch):
    """bench/rivals.py end to end (CPU, tiny; the two Inductor variants stood in for by the capture
    alone, whose C++ compiles would take minutes): every variant's steps, sgdiff's ratio per round
    to each rival within the range the rounds give, and its output equal to eager's."""
    from bench import rivals

    variants = dict(rivals.VARIANTS, inductor=dict(backend="aot_eager"),
                    inductor_reduce_overhead=dict(backend="aot_eager"))
    monkeypatch.setattr(rivals, "VARIANTS", variants)
    assert rivals.main(["--models", "flux", "--size", "tiny", "--device", "cpu", "--dtype", "float32",
                        "--rounds", "3", "--repeats", "1", "--ours", "sgdiff_default,sgdiff_cudagraph_gemm",
                        "--out", str(tmp_path)]) == 0
    case = json.loads((tmp_path / "rivals.json").read_text())["cases"][0]
    ours = {"sgdiff_default", "sgdiff_cudagraph_gemm"}
    assert case["equal"] == dict.fromkeys(ours, True) and case["rounds"] == 3
    assert case["inductor_best"] in ("inductor", "inductor_reduce_overhead")
    assert set(case["steps"]) == {"eager", "inductor", "inductor_reduce_overhead"} | ours and set(case["ratios"]) == ours
    for variant, by_rival in case["ratios"].items():
        for rival, by_key in by_rival.items():
            for key, (mid, low, high) in by_key.items():
                assert 0 < low <= mid <= high
                assert key in ("ms", "pipelined_ms") and case["steps"][rival][key] > 0
    assert set(case["first_sight"]) == ours and all(isinstance(s, list) for s in case["first_sight"].values())
    report = (tmp_path / "rivals.md").read_text()
    assert "| flux (tiny) | sgdiff_default | synchronized |" in report
    assert "| flux (tiny) | sgdiff_cudagraph_gemm | pipelined |" in report
    gathered = json.loads((tmp_path / "rivals.json").read_text())
    sites = [dict(op="linear_act", shapes=[], chosen="cute pingpong 128x192 cluster 2x1", us={}),
             dict(op="linear_act", shapes=[], chosen="reference", us={}),
             dict(op="linear_act", shapes=[], chosen="cute pingpong 128x128 cluster 2x1", us={}),
             dict(op="linear", shapes=[], chosen="triton 128x256x64 s3 w8 sub", us={})]
    gathered["cases"].append(dict(gathered["cases"][0], model="sana", commit="0ther",  # a case from another run
                                  first_sight=dict(sgdiff_default=[], sgdiff_cudagraph_gemm=sites)))
    rivals.write_report(gathered, tmp_path)
    report = (tmp_path / "rivals.md").read_text()
    assert "| flux (tiny) | sgdiff_default |" in report and "| sana (tiny, 0ther) | sgdiff_default |" in report
    assert ("- sana (tiny), sgdiff_cudagraph_gemm: linear triton 128x256x64 1; linear_act cute pingpong 2, "
            "reference 1") in report and "flux (tiny), sgdiff_cudagraph_gemm:" not in report  # none met: no line
    with pytest.raises(SystemExit):
        rivals.main(["--ours", "inductor"])  # not an sgdiff variant
