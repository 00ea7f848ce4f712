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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_runtest_logreport(report):
    """With ``MASKATTN_FAILURE_LOG`` set, each failure's traceback is appended to that file the moment it
    happens: a run stopped by a time limit (the GPU acceptance run, scripts/gpu_check.sh) keeps the tracebacks
    pytest would only have printed at the end."""
    import os

    path = os.environ.get("MASKATTN_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
