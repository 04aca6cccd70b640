"""Real English text as token ids, for prompts of exact lengths (prefill, soak).

Filler or shuffled text prefills faster than real text (the seeds measured it), so prompts are windows of a
token pool built from GSM8K train problems and solutions read from the data directory.
"""
from __future__ import annotations

import random

from validate.client import OpenAIClient, ServerError
from validate.data import require_file
from validate.evals import gsm8k as g

_CHARS_PER_CALL = 200_000  # keep each /tokenize request moderate
_MAX_CHARS_PER_TOKEN = 32  # fewer ids than one per this many characters: the server is no tokenizer

#: The single-stream decode prompt of probe and BetterBench (answered with ignore_eos, so its length is the
#: request's max_tokens whatever the model says).
ESSAY = "Write a long, detailed essay on the history of the printing press and how it changed Europe."


class TextPool:
    """A pool of at least ``min_tokens`` token ids of real text, tokenized by the server under test."""

    def __init__(self, ids: list[int]):
        if not ids:
            raise ValueError("empty text pool")
        self.ids = ids

    @classmethod
    async def build(cls, client: OpenAIClient, data_dir, min_tokens: int, start: int = 0) -> "TextPool":
        """Tokenize GSM8K train text from problem ``start`` on until ``min_tokens`` ids are collected.

        Raises:
            InputError: the data directory has no gsm8k/train.jsonl.
            ServerError: /tokenize fails, or gives fewer than one id per :data:`_MAX_CHARS_PER_TOKEN` characters.
        """
        train = g.load_split(require_file(data_dir, "gsm8k/train.jsonl"), "train")
        ids: list[int] = []
        i = start
        while len(ids) < min_tokens:
            chunk, size = [], 0
            while size < _CHARS_PER_CALL and len(chunk) < len(train):
                q = train[i % len(train)]
                text = q.question + "\n" + q.solution + "\n\n"
                chunk.append(text)
                size += len(text)
                i += 1
            got = await client.tokenize("".join(chunk))
            if len(got) < size // _MAX_CHARS_PER_TOKEN:  # English text is ~4 characters a token
                raise ServerError(f"/tokenize gave {len(got)} token ids for {size:,} characters of text: not a "
                                  "tokenizer (the text pool would never fill)")
            ids += got
        return cls(ids)

    def window(self, n: int, rng: random.Random) -> list[int]:
        """``n`` consecutive ids from a random offset (wrapping around). Raises ValueError when n > pool size."""
        return self.window_at(n, rng.randrange(len(self.ids)))

    def window_at(self, n: int, start: int) -> list[int]:
        """``n`` consecutive ids from offset ``start`` (wrapping around). Raises ValueError when n > pool size."""
        if n > len(self.ids):
            raise ValueError(f"window of {n} tokens from a pool of {len(self.ids)}")
        k = start % len(self.ids)
        out = self.ids[k:k + n]
        return out + self.ids[: n - len(out)]
