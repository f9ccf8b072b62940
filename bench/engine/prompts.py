"""Texts of a chosen length in tokens, for the engine's tokenizer.

The words are the vocabulary's own whole-word tokens (`▁` followed by 4-9 lowercase letters),
so a text of n words is n tokens, give or take none (measured: 1,000 words, 1,000 tokens, with
`/tokenize`). Seeded: the same seed gives the same text, a prefix shared between calls is a
prefix the engine can serve from its cache, and another seed gives a text that shares none.
"""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path

_WHOLE_WORD = re.compile("\u2581[a-z]{4,9}")


@functools.lru_cache(maxsize=4)
def words(vocab: Path) -> tuple[str, ...]:
    """The whole-word tokens of a GGUF vocabulary (the model's or the sdist's vocab file)."""
    import gguf

    tokens = gguf.GGUFReader(vocab).fields["tokenizer.ggml.tokens"].contents()
    return tuple(sorted({t[1:] for t in tokens if _WHOLE_WORD.fullmatch(t)}))


def text(vocab: Path, tokens: int, seed: int) -> str:
    """About `tokens` tokens of seeded words."""
    rng = random.Random(seed)
    pool = words(vocab)
    return " ".join(rng.choice(pool) for _ in range(tokens))
