"""The package layout of using a checkpoint: ``maskattn.inference`` (and ``maskattn.viz`` on top of it) works
without the training toolkit."""

from __future__ import annotations

import subprocess
import sys


def test_inference_and_viz_do_not_import_train():
    code = ("import sys, maskattn.inference, maskattn.viz\n"
            "print(sorted(m for m in sys.modules if m.startswith('maskattn.train')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
