import os

import pytest
import torch

if not torch.cuda.is_available():
    # the Triton kernels run on CPU tensors under Triton's interpreter (docs/design.md §2); set before the first
    # kernel module is imported, which is when Triton reads it
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly on machines without CUDA (they are also deselected by default)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: the torch thread count the test session started with
DEFAULT_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from seed 0 and the session's thread count: a test (or a module fixture) that trains with
    ``train.num_threads`` sets the process's torch threads, which must not change the arithmetic of the tests after
    it (with one thread instead of two, test_seq2seq.py::test_learns_to_copy solves 93 of 100 sequences, not ≥ 95)."""
    torch.set_num_threads(DEFAULT_THREADS)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(DEFAULT_THREADS)


def pytest_runtest_logreport(report):
    """With ``MASKATTN_FAILURE_LOG`` set, each failure's traceback is appended to that file the moment it
    happens: a run stopped by a time limit (the GPU acceptance run, scripts/gpu_check.sh) keeps the tracebacks
    pytest would only have printed at the end."""
    import os

    path = os.environ.get("MASKATTN_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")

