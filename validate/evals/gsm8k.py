"""GSM8K (Cobbe et al. 2021, arXiv:2110.14168; data: openai/grade-school-math, MIT): loading, prompts and
answer extraction.

Gold answers are the number after ``####`` in the dataset's solution. Model answers are extracted two ways:

- ``strict``: the number right after the *first* ``####`` marker. A model that goes on to invent another
  question and answer is scored on its first answer only.
- ``flexible``: the last number anywhere in the output (lm-eval-harness's "flexible-extract" idea).

Both read the answer after a reasoning model's thinking (validate.reasoning), never the thinking, and both
first drop the markdown emphasis chat models put around a final answer (``#### **70000**``, ``*7*``, ``__7__``):
the strict figure is the rule above on what remains. On answers without such markup the figures are
lm-eval-harness's strict-match and flexible-extract.

Numbers are normalised: thousands separators and currency signs dropped, a trailing period dropped, ``+``
dropped, decimals with only zeros after the point made integral (``5.00`` -> ``5``), ``-0`` -> ``0``.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from validate.errors import InputError

# A number: optional sign, optional currency sign, digits with optional thousands separators, optional decimals.
_NUM = r"[-+−]?\s?[$€£]?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+−]?\s?[$€£]?\s?\.\d+"
_NUM_RE = re.compile(_NUM)
# the whole number after the marker: never the prefix of "5/2", "12,34" or "1.2.3" (more digits through . , /)
_MARKER_RE = re.compile(r"####\s*(" + _NUM + r")(?![\d.,/]*\d)")
# Emphasis markers that open before a number or close after one (never the '**' of "2**3", between two digits)
_EMPHASIS_RE = re.compile(r"(?<![\w*])(?:\*{1,2}|_{1,2})(?=[-+−$€£.\d])|(?<=[\d.%])(?:\*{1,2}|_{1,2})(?![\w*])")


def strip_emphasis(text: str) -> str:
    """``text`` without markdown bold or italic markers around numbers: ``#### **70,000**.`` -> ``#### 70,000.``."""
    return _EMPHASIS_RE.sub("", text)


def normalize_number(raw: str) -> str | None:
    """Canonical text of a number as written in an answer, or None when it holds no digits.

    >>> normalize_number("$1,234.50")
    '1234.5'
    >>> normalize_number("-7.00")
    '-7'
    """
    s = raw.strip().replace("−", "-").replace(",", "")
    s = re.sub(r"[$€£\s]", "", s).rstrip(".")
    if s.startswith("+"):
        s = s[1:]
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", s):
        return None
    neg = s.startswith("-")
    s = s.lstrip("-")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    s = s.lstrip("0") or "0"
    if s.startswith("."):
        s = "0" + s
    return "-" + s if neg and s != "0" else s


def extract_answer(text: str, mode: Literal["strict", "flexible"] = "strict") -> str | None:
    """The model's final answer in ``text`` as a normalised number, or None when none is found.

    Args:
        text: the answer to score (a reasoning model's answer after its thinking: validate.reasoning).
        mode: ``strict`` = the number after the first ``####``; ``flexible`` = the last number in the text.
    Raises:
        ValueError: unknown mode.
    """
    if mode in ("strict", "flexible"):
        text = strip_emphasis(text)
    if mode == "strict":
        m = _MARKER_RE.search(text)
        return normalize_number(m.group(1)) if m else None
    if mode == "flexible":
        found = _NUM_RE.findall(text)
        for raw in reversed(found):
            n = normalize_number(raw)
            if n is not None:
                return n
        return None
    raise ValueError(f"unknown extraction mode {mode!r}")


@dataclass(frozen=True)
class Question:
    id: str  # "test-<line index>"
    question: str
    gold: str  # normalised number
    solution: str


def load_split(path: Path, split: str) -> list[Question]:
    """Read a GSM8K jsonl file. Raises InputError naming the file and line of a malformed entry."""
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            gold = normalize_number(row["answer"].split("####")[-1])
            if gold is None:
                raise ValueError("no number after ####")
        except (json.JSONDecodeError, KeyError, ValueError, AttributeError) as e:
            raise InputError(f"{path}:{i + 1}: malformed GSM8K entry: {e}") from None
        out.append(Question(f"{split}-{i}", row["question"], gold, row["answer"]))
    return out


SYSTEM = ("Solve the math word problem step by step. "
          "End with a final line of the form '#### <number>' holding only the numeric answer.")


def _clean_solution(sol: str) -> str:
    """Drop the dataset's calculator annotations ``<<6*2=12>>``."""
    return re.sub(r"<<[^>]*>>", "", sol)


def fewshot_exemplars(train: list[Question], k: int, seed: int) -> list[Question]:
    """``k`` train questions chosen by ``seed`` (fixed for a record: part of the prompt hash)."""
    return random.Random(seed).sample(train, k) if k else []


def build_messages(q: Question, exemplars: list[Question]) -> list[dict[str, str]]:
    """Chain-of-thought chat prompt: system instruction, exemplars as user/assistant turns, the question."""
    msgs = [{"role": "system", "content": SYSTEM}]
    for ex in exemplars:
        msgs.append({"role": "user", "content": ex.question})
        msgs.append({"role": "assistant", "content": _clean_solution(ex.solution)})
    msgs.append({"role": "user", "content": q.question})
    return msgs


def sample(questions: list[Question], n: int | None, seed: int) -> list[Question]:
    """A fixed seeded sample of ``n`` questions in dataset order (all when n is None or >= len)."""
    if n is None or n >= len(questions):
        return list(questions)
    idx = sorted(random.Random(seed).sample(range(len(questions)), n))
    return [questions[i] for i in idx]
