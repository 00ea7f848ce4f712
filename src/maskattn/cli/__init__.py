"""The ``maskattn`` command line: ``train``, ``grid``, ``eval``, ``predict``, ``translate``, ``bench``, ``viz`` (``masks``,
``attention``, ``localness``), ``list``, ``demo`` — one module per command group:

* :mod:`.training`  — ``train`` (with no arguments: the embedded default job, the synthetic order task, MTSA vs
  multi-head attention; multi-process data-parallel: ``torchrun --nproc_per_node N -m maskattn.cli train --config …``);
* :mod:`.grid`      — ``grid run``, ``grid table``, ``grid cost`` (settings × seeds as one job, and its tables);
* :mod:`.inference` — ``eval``, ``predict``, ``translate``;
* :mod:`.bench`     — ``bench``;
* :mod:`.viz`       — ``viz masks``, ``viz attention``, ``viz localness``;
* :mod:`.info`      — ``list``, ``demo``.

Errors: a mistake the user can fix — a :class:`~maskattn.errors.MaskattnError` (raised deliberately, by the
checks of arguments, configurations and files) or an ``OSError`` about one of the user's files (printed with its
path) — is one line on stderr, ``error: …``, and exit code 2. Any other exception is a bug: it propagates with its
traceback (exit code 1). Every command reads its input lines with :mod:`maskattn.data.text` (``\\n`` only, one
output per input line).
"""

from __future__ import annotations

from .app import app
from . import training, grid, inference, viz, bench, info  # noqa: F401  (registers the commands, in this order)
from . import grid_analysis  # noqa: F401,E402  (grid compare, grid plot)

__all__ = ["app"]
