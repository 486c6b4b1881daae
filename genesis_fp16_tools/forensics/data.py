"""Text that ships with Python: the help topics of ``pydoc_data.topics``.

Byte-level, ASCII vocabulary (128); other characters become '?'. No
downloads. Everything is drawn with an explicit ``torch.Generator``.
"""

from __future__ import annotations

import functools

import torch

VOCAB_SIZE = 128
_UNKNOWN = ord("?")


@functools.lru_cache(maxsize=1)
def corpus_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def encode(text: str) -> torch.Tensor:
    return torch.tensor([c if c < VOCAB_SIZE else _UNKNOWN for c in text.encode("utf-8")], dtype=torch.long)


def decode(tokens: torch.Tensor) -> str:
    return bytes(int(t) for t in tokens.flatten()).decode("ascii", errors="replace")


@functools.lru_cache(maxsize=1)
def corpus_tokens() -> torch.Tensor:
    return encode(corpus_text())


def split(part: str) -> torch.Tensor:
    """``train`` is the first 90% of the corpus, ``heldout`` the rest."""
    toks = corpus_tokens()
    cut = int(0.9 * len(toks))
    if part == "train":
        return toks[:cut]
    if part == "heldout":
        return toks[cut:]
    raise ValueError(f"unknown split {part!r}: expected 'train' or 'heldout'")


def sample_windows(part: str, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``batch`` random windows of ``length`` tokens, ``[batch, length]``."""
    toks = split(part)
    starts = torch.randint(0, len(toks) - length - 1, (batch,), generator=generator)
    return torch.stack([toks[s : s + length] for s in starts.tolist()])
