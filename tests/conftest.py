import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=int(os.environ.get("SGDIFF_HYPOTHESIS_EXAMPLES", "25")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("ci")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # the workers are the parallelism: each of them on torch's default of a thread a core
    # oversubscribes the cores (two workers, two threads each, on CI's two cores)
    torch.set_num_threads(1)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "interpreter: runs under Triton's CPU interpreter (TRITON_INTERPRET=1), "
        "in a process of its own: tests/test_triton_interpreter.py runs them (skipped without it)")
    config.addinivalue_line(
        "markers", "starts_first: minutes long; collected first, so that with pytest-xdist the other "
        "tests run beside it rather than after it")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("starts_first") is None)  # stable: the rest keep their order
    # sgdiff.kernels.triton reads TRITON_INTERPRET at import: the interpreter tests run only in a
    # process started with it (tests/test_triton_interpreter.py starts one)
    if os.environ.get("TRITON_INTERPRET") != "1":
        skip_interpreter = pytest.mark.skip(
            reason="runs under TRITON_INTERPRET=1: tests/test_triton_interpreter.py runs them")
        for item in items:
            if item.get_closest_marker("interpreter") is not None:
                item.add_marker(skip_interpreter)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords or "/gpu/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture
def fresh_dispatch():
    """Kernel choices, verifications and disabled kernels forgotten before and after a test."""
    from sgdiff.kernels import dispatch

    dispatch.reset()
    yield
    dispatch.reset()


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches reset before and after a test (each compile a first one)."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def example_pattern():
    """The user-defined pattern of tests/example_extension.py installed for the test."""
    from tests import example_extension as ext

    ext.install()
    yield ext.OP.load()
    ext.uninstall()


def pytest_sessionfinish(session, exitstatus):
    """Leave without the interpreter's teardown once pytest has reported everything: Triton's
    libtriton (a nanobind module) otherwise prints some hundred 'nanobind: leaked ...' lines at
    teardown, after the summary, for objects the compiler still holds (not sgdiff's)."""
    import atexit
    import sys

    def leave(status=int(exitstatus)):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    if "triton" in sys.modules:
        atexit.register(leave)
