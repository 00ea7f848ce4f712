"""The torch device a command, a run or a function asks for by name — one meaning everywhere: ``auto`` (CUDA
when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N`` (docs/design.md §4) — and the memory a batch may
take on it: :func:`attention_memory_bytes` estimates a batch's peak, :func:`memory_budget` is what may be spent
(a share of the memory available now, or ``MASKATTN_MEMORY_LIMIT``), :func:`check_memory` refuses a batch over it
before it is built (training, ``predict`` / ``eval`` and ``viz`` all ask it)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from .errors import ConfigError, MemoryLimitError

__all__ = ["resolve_device", "DEVICE_NAMES", "MEMORY_LIMIT_ENV", "MEMORY_FRACTION", "attention_memory_bytes",
           "memory_limits", "available_memory_bytes", "memory_budget", "check_memory", "format_bytes",
           "is_out_of_memory", "out_of_memory_error"]

#: what a device option accepts (``cuda:N`` for any N)
DEVICE_NAMES = ("auto", "cpu", "cuda", "cuda:N")


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``; an unknown name, or CUDA
    on a machine without it, raises :class:`ConfigError`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"unknown device {name!r}; expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} was asked for but CUDA is not available; use cpu")
    return torch.device(name)


#: environment variable that sets the memory budget by hand: bytes with an optional unit (``8G``, ``512MiB``), or
#: ``none`` for no check
MEMORY_LIMIT_ENV = "MASKATTN_MEMORY_LIMIT"

#: the share of the memory available when a batch is planned that it may take (the rest: the process, other jobs)
MEMORY_FRACTION = 0.8

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def format_bytes(count: float) -> str:
    """``count`` bytes as ``1.2 GiB`` / ``340 MiB`` / ``12 KiB`` / ``512 bytes`` (never "0 MiB" for a small
    budget)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}" if unit == "GiB" else f"{count / size:.0f} {unit}"
    return f"{count:.0f} bytes"


def attention_memory_bytes(batch: int, length: int, *, heads: int, layers: int, width: int, training: bool = False,
                           element_size: int = 4, score_features: int = 1) -> int:
    """An upper estimate of the peak memory of one forward (with ``training``: and backward) pass of ``layers``
    attention sublayers of ``heads`` heads and model width ``width`` over a ``(batch, length)`` input.

    The quadratic term is what kills a machine: the attention scores, ``batch × heads × length² × score_features``
    values of ``element_size`` bytes per sublayer (``score_features``: 1 for scalar attention; the per-head width
    for the explicit n×n×d maps of MTSA's reference math). Inference holds about four such tensors at a time
    (scores, weights, a temporary); training may keep two per sublayer for backward plus two for the one being
    differentiated. The linear term counts the activations (8 per layer in inference, 16 per layer in training,
    ``batch × length × width`` each). The fused kernels keep less than this; the estimate errs on the safe side."""
    scores = batch * heads * length * length * score_features * element_size
    activations = batch * length * width * element_size
    if training:
        return (2 * layers + 2) * scores + 16 * max(layers, 1) * activations
    return (4 if layers else 0) * scores + 8 * max(layers, 1) * activations


#: the cgroup v2 hierarchy (``/sys/fs/cgroup/unified`` on hybrid systems) and the v1 memory controller's mount
CGROUP_V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
#: this process's cgroups (``0::/path`` for v2, ``N:memory:/path`` for v1)
PROC_CGROUP = Path("/proc/self/cgroup")
#: a v1 ``memory.limit_in_bytes`` at or above this means no limit (the kernel writes 2^63 rounded to a page)
_NO_V1_LIMIT = 2**60


def _read_int(path: Path) -> int | None:
    """The integer a kernel file holds (``None``: missing, unreadable, or not a number, as ``max``)."""
    try:
        return int(path.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stat(path: Path, key: str) -> int:
    """The entry ``key`` of a cgroup's ``memory.stat`` (0 when absent)."""
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy: ``"v2"`` and ``"v1"`` (the memory controller's)."""
    paths: dict[str, str] = {}
    try:
        lines = PROC_CGROUP.read_text(encoding="utf-8").splitlines()
    except OSError:
        return paths
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            paths["v2"] = path
        elif "memory" in controllers.split(","):
            paths["v1"] = path
    return paths


def _ancestors(root: Path, path: str) -> list[Path]:
    """The cgroup folder of ``path`` under ``root`` and every folder above it up to ``root`` (each one's limit
    applies), those that exist. Inside a container the path may name a folder that is not mounted there: then
    the folders above it that are (``root`` itself: the container's own cgroup) still count."""
    folder = root / path.strip("/")
    found = []
    while True:
        if folder.is_dir():
            found.append(folder)
        if folder == root or root not in folder.parents:
            return found
        folder = folder.parent


def _cgroup_room() -> list[tuple[str, int]]:
    """What this process's cgroups still allow: for each limited cgroup (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) its limit minus what its processes use, page cache that can be reclaimed
    (``inactive_file``) not counted as used."""
    room = []
    paths = _cgroup_paths()
    if "v2" in paths:
        for root in CGROUP_V2_ROOTS:
            if (root / "cgroup.controllers").is_file():
                for folder in _ancestors(root, paths["v2"]):
                    limit = _read_int(folder / "memory.max")
                    if limit is not None:
                        used = (_read_int(folder / "memory.current") or 0) - _stat(folder / "memory.stat",
                                                                                   "inactive_file")
                        room.append((f"the cgroup limit {folder / 'memory.max'}", limit - max(0, used)))
                break
    if "v1" in paths:
        for folder in _ancestors(CGROUP_V1_MEMORY, paths["v1"]):
            limit = _read_int(folder / "memory.limit_in_bytes")
            if limit is not None and limit < _NO_V1_LIMIT:
                used = (_read_int(folder / "memory.usage_in_bytes") or 0) - _stat(folder / "memory.stat",
                                                                                  "total_inactive_file")
                room.append((f"the cgroup limit {folder / 'memory.limit_in_bytes'}", limit - max(0, used)))
    return room


def _address_space_room() -> list[tuple[str, int]]:
    """What ``RLIMIT_AS`` (``ulimit -v``) still allows: the limit minus this process's address space now."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return []
        size = int(Path("/proc/self/statm").read_text(encoding="ascii").split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError, IndexError):
        return []
    return [("the address-space limit (ulimit -v, RLIMIT_AS)", limit - size)]


def _meminfo_available() -> list[tuple[str, int]]:
    """``MemAvailable`` of ``/proc/meminfo`` (Linux), else the free physical pages of ``os.sysconf``."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return [("MemAvailable", int(line.split()[1]) * 1024)]
    except (OSError, ValueError, IndexError):
        pass
    try:
        return [("the free physical memory", int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE")))]
    except (AttributeError, ValueError, OSError):
        return []


def memory_limits(device: torch.device | str = "cpu") -> list[tuple[str, int]]:
    """What may still be allocated on ``device`` under each limit that applies, as ``(limit, bytes)``: CUDA's free
    memory; on the CPU ``MemAvailable`` (or the free physical pages), what ``RLIMIT_AS`` / ``ulimit -v`` leaves
    (the limit minus the address space in use) and what each cgroup of this process leaves (v2 ``memory.max``
    minus ``memory.current``, v1 ``memory.limit_in_bytes`` minus ``memory.usage_in_bytes``, reclaimable page
    cache not counted as used: Slurm's ``--mem``, a container's limit). Empty when none can be read."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return [("the GPU's free memory", int(torch.cuda.mem_get_info(device)[0]))]
        except (RuntimeError, AssertionError):
            return []
    return [(name, max(0, room)) for name, room in
            _meminfo_available() + _address_space_room() + _cgroup_room()]


def available_memory_bytes(device: torch.device | str = "cpu") -> int | None:
    """Memory that can still be allocated on ``device``: the smallest of :func:`memory_limits`; ``None`` when
    unknown."""
    limits = memory_limits(device)
    return min(room for _, room in limits) if limits else None


def _parse_limit(text: str) -> int | None:
    """The value of ``MASKATTN_MEMORY_LIMIT``: bytes with an optional unit, or ``none`` / ``off`` (no check)."""
    value = text.strip().lower()
    if value in ("none", "off", "unlimited"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    if match is None or match.group(2) not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigError(f"{MEMORY_LIMIT_ENV}={text!r} is not a memory size; expected bytes with an optional unit "
                          "(e.g. 8G, 512MiB, 2000000000) or 'none' (no check)")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def memory_budget(device: torch.device | str = "cpu") -> int | None:
    """The most bytes one batch may take on ``device``: ``MASKATTN_MEMORY_LIMIT`` when set (``none``: no limit),
    else :data:`MEMORY_FRACTION` of :func:`available_memory_bytes`; ``None`` when there is no limit or the
    available memory cannot be read."""
    text = os.environ.get(MEMORY_LIMIT_ENV)
    if text is not None and text.strip():
        return _parse_limit(text)
    available = available_memory_bytes(device)
    return None if available is None else int(available * MEMORY_FRACTION)


def _budget_source(device: torch.device | str) -> str:
    """Where :func:`memory_budget` comes from, for messages: the environment variable, or the share of the limit
    that binds (``80 % of the 2.1 GiB MemAvailable leaves``)."""
    if os.environ.get(MEMORY_LIMIT_ENV, "").strip():
        return MEMORY_LIMIT_ENV
    limits = memory_limits(device)
    if not limits:
        return "the memory available is unknown"
    name, room = min(limits, key=lambda limit: limit[1])
    return f"{MEMORY_FRACTION:.0%} of the {format_bytes(room)} that {name} leaves now"


def check_memory(estimate: int, *, what: str, advice: str, device: torch.device | str = "cpu") -> None:
    """Refuse (:class:`~maskattn.errors.MemoryLimitError`) a batch whose ``estimate`` (from
    :func:`attention_memory_bytes`) exceeds :func:`memory_budget`: the message says ``what`` was planned, the
    estimate, the budget and ``advice`` (what to lower), and how to change the budget."""
    budget = memory_budget(device)
    if budget is None or estimate <= budget:
        return
    raise MemoryLimitError(f"{what} would need about {format_bytes(estimate)}, more than the "
                           f"{format_bytes(budget)} budget ({_budget_source(device)}); {advice}, or set "
                           f"{MEMORY_LIMIT_ENV} (e.g. {MEMORY_LIMIT_ENV}=64G, or 'none' to skip this check)")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: ``torch.OutOfMemoryError`` (CUDA), the CPU allocator's
    ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory", "not enough memory") or Python's
    ``MemoryError``."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    message = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        text in message for text in ("out of memory", "can't allocate memory", "not enough memory",
                                     "defaultcpuallocator"))


def out_of_memory_error(exc: BaseException) -> MemoryLimitError:
    """The :class:`~maskattn.errors.MemoryLimitError` for an allocation that failed although the batches were
    estimated to fit (:func:`is_out_of_memory`; ``torch.OutOfMemoryError`` is the GPU's, anything else the
    CPU's): what failed (the first line of ``exc``), the budget, and what to change — one line, where the
    allocator would print a traceback."""
    device = "cuda" if isinstance(exc, torch.OutOfMemoryError) and torch.cuda.is_available() else "cpu"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    budget = memory_budget(device)
    planned = (f"the batches were planned within a {format_bytes(budget)} budget ({_budget_source(device)})"
               if budget is not None else f"no memory budget was set ({MEMORY_LIMIT_ENV}=none)")
    return MemoryLimitError(f"out of memory ({first}); {planned}, more than this machine could give: lower the "
                            "batch size, the beam or the lengths, or set a smaller budget so that batches are cut "
                            f"or refused before they are built ({MEMORY_LIMIT_ENV}, e.g. {MEMORY_LIMIT_ENV}=2G)")
