"""The exceptions maskattn raises for mistakes a user can fix: a bad configuration value, a malformed data
file, an unusable checkpoint, a run folder that is taken, an input a command refuses.

The command line prints these as one line (``error: …``, exit code 2); any other exception is a bug and
propagates with its traceback. Every class whose cause is a wrong value also derives from ``ValueError``, so
``except ValueError`` keeps working for code written before this hierarchy existed.

==========================  ==========================================================================
class                       raised when
==========================  ==========================================================================
``MaskattnError``           base class; never raised itself
``ArgumentError``           an argument (of a function, module, option or command) outside what it accepts
``ArgumentTypeError``       an argument of the wrong type (also a ``TypeError``)
``ConfigError``             a configuration key or value is invalid (``--set``, YAML, ``from_dict``)
``DataError``               a data or input file is missing, malformed or not UTF-8 (names file:line)
``CheckpointError``         a checkpoint is missing, corrupt, not maskattn's or does not fit the model
``RunFolderError``          a run folder is held by another process, or holds a run that would be replaced
``InputError``              an input a command refuses (e.g. a sentence too long to draw)
``MemoryLimitError``        a batch whose estimated memory exceeds the budget (also an ``InputError``; the
                            message gives the estimate, the budget and how to change either)
``BackendError``            an explicitly named attention backend cannot run a call (the message gives
                            every backend's reasons and what ``backend="auto"`` runs)
``DivergenceError``         the training loss stopped being finite (also a ``FloatingPointError``)
==========================  ==========================================================================

``Interrupted`` is not a mistake: it is the ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM on the command line) that
the interrupted code re-raises once it has said what it kept, so that the command does not say it again.
"""

from __future__ import annotations

import warnings

__all__ = ["MaskattnError", "ArgumentError", "ArgumentTypeError", "ConfigError", "DataError", "CheckpointError", "RunFolderError", "InputError",
           "MemoryLimitError",
           "BackendError", "DivergenceError", "Interrupted", "UnverifiedCheckpointWarning", "RenamedWarning", "warn_renamed", "renamed_attribute",
           "REMOVED_IN"]

#: the release that drops the old spellings of renamed names (they warn until then)
REMOVED_IN = "0.3"


class MaskattnError(Exception):
    """A mistake the user can fix; the message says what was wrong and what was expected."""


class ArgumentError(MaskattnError, ValueError):
    """An argument outside what a function, module, option or command accepts (the message names the argument,
    the value received and what is accepted)."""


class ArgumentTypeError(MaskattnError, TypeError):
    """An argument of the wrong type (the message names it, the type received and what is accepted)."""


class ConfigError(MaskattnError, ValueError):
    """An invalid configuration key or value (the message names ``section.key`` and the allowed range)."""


class DataError(MaskattnError, ValueError):
    """A data or input file that cannot be read as asked (the message names the file and line)."""


class CheckpointError(MaskattnError, ValueError):
    """A checkpoint file that is missing, damaged, not a maskattn checkpoint, or of another model."""


class RunFolderError(MaskattnError):
    """A run folder another process holds, or one whose finished run a new run would replace."""


class InputError(MaskattnError, ValueError):
    """An input a command refuses (the message names the limit and how to change it)."""


class MemoryLimitError(InputError):
    """A batch whose estimated memory (:func:`maskattn.device.attention_memory_bytes`) exceeds the budget
    (:func:`maskattn.device.memory_budget`): refused before it is built, with the estimate and what to change."""


class BackendError(ArgumentError):
    """A backend named explicitly (``backend="flex"``, …) that cannot run a call, with every backend's reasons."""


class DivergenceError(MaskattnError, FloatingPointError):
    """The training loss became NaN or infinite."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM, re-raised by the code it stopped after that code has said what it kept (the trainer: the
    step, and what there is to resume); the command line adds nothing but the exit code."""


class UnverifiedCheckpointWarning(UserWarning):
    """A checkpoint written before checksums existed: its contents load but cannot be verified."""


class RenamedWarning(DeprecationWarning):
    """An old name of something maskattn renamed (:func:`warn_renamed`); the command line prints it as a
    ``warning:`` line (Python hides ``DeprecationWarning`` outside ``__main__`` by default)."""


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """A :class:`RenamedWarning` (a ``DeprecationWarning``) that ``old`` is now called ``new``; the old name keeps
    working until :data:`REMOVED_IN`."""
    warnings.warn(f"{old} is now {new}; the old name will be removed in {REMOVED_IN}", RenamedWarning,
                  stacklevel=stacklevel)


class renamed_attribute:
    """A class attribute's old name: reading ``Owner.<old>`` warns (:func:`warn_renamed`) and returns
    ``Owner.<new>``. Use as ``OLD = renamed_attribute("NEW")`` in the class body."""

    def __init__(self, new: str):
        self.new = new
        self.old = new

    def __set_name__(self, owner, name: str) -> None:
        self.old = name

    def __get__(self, obj, owner):
        warn_renamed(f"{owner.__name__}.{self.old}", f"{owner.__name__}.{self.new}")
        return getattr(owner, self.new)
