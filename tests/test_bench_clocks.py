"""bench/clocks.py: what bounds a step (CPU end to end; the gap arithmetic; NVML through a stand-in)."""
import json
import sys
import time

import pytest
import torch

pytest.importorskip("diffusers")


def test_clock_bench_on_a_tiny_flux(tmp_path):
    """bench/clocks.py end to end (CPU, tiny: the CPU ops stand in for kernels, no clock read)."""
    from bench import clocks

    assert clocks.main(["--models", "flux", "--size", "tiny", "--device", "cpu", "--dtype", "float32",
                        "--repeats", "1", "--profiled", "1", "--out", str(tmp_path)]) == 0
    (case,) = json.loads((tmp_path / "clocks.json").read_text())["cases"]
    assert case["tier"] == "lossless" and case["step_ms"] > 0 and "sm_mhz" not in case
    (run,) = case["profiled"]
    assert run["kernels"] > 10 and 0 < run["busy_ms"] <= run["span_ms"]
    assert run["busy_ms"] + run["gap_ms"] == pytest.approx(run["span_ms"], rel=1e-6)
    assert "| flux (tiny) | lossless |" in (tmp_path / "clocks.md").read_text()


def test_gaps_are_what_no_interval_covers():
    from bench.clocks import gaps

    got = gaps([(20, 30, "c"), (0, 10, "a"), (5, 12, "b"), (100, 101, "d"), (29, 29.5, "e")])
    assert got["kernels"] == 5 and got["span_ms"] == pytest.approx(0.101)
    assert got["busy_ms"] == pytest.approx(0.023) and got["gap_ms"] == pytest.approx(0.078)
    assert got["gaps_over_20us"] == 1 and got["longest_gaps"] == [[70.0, "d"], [8.0, "c"]]
    assert gaps([])["kernels"] == 0


@pytest.mark.parametrize("reasons_call", ["nvmlDeviceGetCurrentClocksEventReasons",
                                          "nvmlDeviceGetCurrentClocksThrottleReasons"])
def test_the_clock_sampler_names_the_reasons_the_gpu_slowed(monkeypatch, reasons_call):
    """NVML read through a stand-in: the spread of clocks and power, the reasons OR-ed over the
    samples and named; without NVML, no figures and no error."""
    import types

    from bench.clocks import Sampler

    readings = iter([(1980, 400.0, 0x0), (1605, 699.0, 0x4), (1500, 702.0, 0x4 | 0x20)] * 1000)
    state = {}

    def clock(handle, kind):
        state["now"] = next(readings)
        return state["now"][0]

    nvml = types.SimpleNamespace(
        NVML_CLOCK_SM=1, nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: "gpu",
        nvmlDeviceGetMaxClockInfo=lambda h, k: 1980, nvmlDeviceGetEnforcedPowerLimit=lambda h: 700000,
        nvmlDeviceGetClockInfo=clock, nvmlDeviceGetPowerUsage=lambda h: state["now"][1] * 1e3,
        **{reasons_call: lambda h: state["now"][2]})  # NVML's newer name, or only its older one
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with Sampler(torch.device("cuda", 0), period=0.001) as sampler:
        while len(sampler.samples) < 3:
            time.sleep(0.001)
    got = sampler.summary()
    assert got["sm_mhz"]["max"] == 1980 and got["sm_mhz"]["min"] == 1500
    assert got["power_limit_w"] == 700 and got["sm_mhz_limit"] == 1980
    assert got["throttle_reasons"]["power cap"] >= 0.5 and 0 < got["throttle_reasons"]["thermal (software)"] < 0.5
    assert set(got["throttle_reasons"]) == {"power cap", "thermal (software)"}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with Sampler(torch.device("cuda", 0)) as sampler:
        pass
    assert sampler.summary() == {}
