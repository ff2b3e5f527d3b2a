"""Prompt tokenizer shared by the generator's training and the serving process (plain Python, no paddle).

Latin words and digits are one token each, every CJK character is a token of its own, punctuation and
spaces are separators. Token ids come from the vocabulary saved with the model; 0 pads, 1 is unknown.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

PAD_ID = 0
UNK_ID = 1
RESERVED = ("<pad>", "<unk>")

# One CJK ideograph, or a run of letters/digits (any script, so accented words stay whole).
_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W_]+", re.UNICODE)


def clean_text(text: str) -> tuple[str, bool]:
    """Text safe to process: lone surrogates replaced, control characters (except newline/tab) dropped.

    Returns the cleaned text and whether anything changed, so a reply can say it was cleaned.
    """
    repaired = text.encode("utf-8", "replace").decode("utf-8")
    kept = "".join(ch for ch in repaired if ch in "\n\t" or unicodedata.category(ch) != "Cc")
    return kept, kept != text


@dataclass(frozen=True)
class Tokenized:
    ids: list[int]
    used_text: str  # the prompt as the model saw it: the original, cut after the last kept token
    truncated: bool
    total_tokens: int


def words(text: str) -> list[str]:
    return [match.group(0).lower() for match in _TOKEN.finditer(text)]


class Tokenizer:
    def __init__(self, vocabulary: list[str], max_tokens: int):
        if list(vocabulary[: len(RESERVED)]) != list(RESERVED):
            raise ValueError("vocabulary must start with the reserved tokens <pad>, <unk>")
        self.vocabulary = list(vocabulary)
        self.max_tokens = max_tokens
        self._ids = {token: index for index, token in enumerate(self.vocabulary)}

    @classmethod
    def from_texts(cls, texts, max_tokens: int) -> Tokenizer:
        seen = sorted({token for text in texts for token in words(text)})
        return cls(list(RESERVED) + seen, max_tokens)

    def encode(self, text: str) -> Tokenized:
        matches = list(_TOKEN.finditer(text))
        kept = matches[: self.max_tokens]
        truncated = len(matches) > self.max_tokens
        ids = [self._ids.get(match.group(0).lower(), UNK_ID) for match in kept]
        used_text = text[: kept[-1].end()] if truncated and kept else text
        return Tokenized(ids=ids, used_text=used_text, truncated=truncated, total_tokens=len(matches))
