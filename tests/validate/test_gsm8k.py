"""GSM8K answer extraction and sampling."""
from __future__ import annotations

import pytest

from validate.evals.gsm8k import build_messages, extract_answer, normalize_number, sample, Question


@pytest.mark.parametrize("text,strict,flexible", [
    ("She pays 3 + 4 = 7 dollars.\n#### 7", "7", "7"),
    # a marker followed by an invented follow-up question: strict keeps the first answer
    ("So 12 eggs.\n#### 12\n\nQuestion: Tom has 5 cars... #### 99", "12", "99"),
    ("The total is 1,234,567 apples. #### 1,234,567", "1234567", "1234567"),
    ("It costs $1,250.50.\n#### $1,250.50", "1250.5", "1250.5"),
    ("The temperature fell to -8 degrees.\n#### -8", "-8", "-8"),
    ("He has 5.00 left.\n#### 5.00.", "5", "5"),
    ("The answer is 0.5", None, "0.5"),
    ("I do not know.", None, None),
    ("#### twelve", None, None),
    ("Two steps: 3 then 14.\nThe answer is 14.", None, "14"),
    ("#### +3", "3", "3"),
    ("#### .75", "0.75", "0.75"),
    ("#### -0", "0", "0"),
    # strict never scores the prefix of a malformed number (flexible takes the last clean number it finds)
    ("#### 5/2", None, "2"),
    ("#### 12,34", None, "34"),
    ("#### 1.2.3", None, "0.3"),
    # markdown emphasis around the final answer, as chat models write it: the strict rule reads what remains
    ("The total is **70,000**.\n#### **70000**", "70000", "70000"),
    ("#### **$1,250.50**.", "1250.5", "1250.5"),
    ("#### *-8*", "-8", "-8"),
    ("#### __12__", "12", "12"),
    # never the '**' of a power, nor an underscore inside a name or a number
    ("2**3 = 8, so 2**3", None, "3"),
    ("#### 5_000", "5", "0"),
])
def test_extract(text, strict, flexible):
    assert extract_answer(text, "strict") == strict
    assert extract_answer(text, "flexible") == flexible


def test_normalize():
    assert normalize_number("$ 1,000") == "1000"
    assert normalize_number("007") == "7"
    assert normalize_number("abc") is None


def test_unknown_mode():
    with pytest.raises(ValueError):
        extract_answer("1", "loose")


def test_sample_is_fixed_and_ordered():
    qs = [Question(f"test-{i}", "q", "1", "s") for i in range(100)]
    a, b = sample(qs, 10, 1234), sample(qs, 10, 1234)
    assert [q.id for q in a] == [q.id for q in b]
    assert [int(q.id[5:]) for q in a] == sorted(int(q.id[5:]) for q in a)
    assert sample(qs, None, 1) == qs and len(sample(qs, 200, 1)) == 100


def test_prompt_strips_calculator_annotations():
    ex = Question("train-0", "How many?", "18", "9 * 2 = <<9*2=18>>18\n#### 18")
    msgs = build_messages(Question("test-0", "Q?", "1", ""), [ex])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == "9 * 2 = 18\n#### 18"
