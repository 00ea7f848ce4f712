"""The three kinds of example the toolkit trains on: a labelled sentence, a labelled sentence pair (NLI)
and a tagged token sequence. Tokens are already split; labels are strings until a model maps them. ``line``:
where a file reader found the example (1-based; the first line of a CoNLL sentence), for messages; it takes no
part in comparisons."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TextExample", "PairExample", "TaggedExample", "Example"]


@dataclass(frozen=True)
class TextExample:
    """A sentence (``tokens``) with one class ``label``."""

    tokens: tuple[str, ...]
    label: str
    line: int | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PairExample:
    """A premise / hypothesis pair with one class ``label`` (natural language inference)."""

    premise: tuple[str, ...]
    hypothesis: tuple[str, ...]
    label: str
    line: int | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return max(len(self.premise), len(self.hypothesis))


@dataclass(frozen=True)
class TaggedExample:
    """A token sequence with one tag per token (e.g. BIO chunks)."""

    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    line: int | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.tokens)


Example = TextExample | PairExample | TaggedExample
