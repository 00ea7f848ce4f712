"""``python -m maskattn.cli``: the ``maskattn`` command (``torchrun … -m maskattn.cli train`` runs it per process)."""

from . import app

if __name__ == "__main__":  # pragma: no cover
    app()
