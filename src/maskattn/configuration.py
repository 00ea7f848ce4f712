"""The old name of :mod:`maskattn.sections` (renamed in 0.2: a *config* is the run configuration and its
sections); importing it warns, and it re-exports the sections' names until :data:`maskattn.errors.REMOVED_IN`."""

from __future__ import annotations

from .errors import warn_renamed
from .sections import *  # noqa: F403 (the old module's names, as they were)
from .sections import __all__  # noqa: F401

# stacklevel 3 names the importing code: Python's warnings skip the import machinery's frames
warn_renamed("the module maskattn.configuration", "maskattn.sections", stacklevel=3)
