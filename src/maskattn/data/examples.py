"""The three kinds of example the toolkit trains on: a labelled sentence, a labelled sentence pair (NLI)
and a tagged token sequence. Tokens are already split; labels are strings until a model maps them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TextExample", "PairExample", "TaggedExample", "Example"]


@dataclass(frozen=True)
class TextExample:
    """A sentence (``tokens``) with one class ``label``."""

    tokens: tuple[str, ...]
    label: str

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PairExample:
    """A premise / hypothesis pair with one class ``label`` (natural language inference)."""

    premise: tuple[str, ...]
    hypothesis: tuple[str, ...]
    label: str

    def __len__(self) -> int:
        return max(len(self.premise), len(self.hypothesis))


@dataclass(frozen=True)
class TaggedExample:
    """A token sequence with one tag per token (e.g. BIO chunks)."""

    tokens: tuple[str, ...]
    tags: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.tokens)


Example = TextExample | PairExample | TaggedExample
