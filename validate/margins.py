"""The two highest values the server saw at each greedy token, and whether a parting of two answers is rounding.

Asking: a greedy request asks for the top two of each output token (OpenAI chat ``logprobs: true, top_logprobs:
2``; completions ``logprobs: 2``) with ``return_tokens_as_token_ids`` (vLLM then names each token
``"token_id:<id>"``; a server that ignores it names it by its text). :func:`chat_steps` and
:func:`completion_steps` read a streamed chunk's ``logprobs`` into *steps*, one per token:
``[token, value, token, value]``, the highest value first, the token an id (int) where the server gave one, else
its text, values rounded to :data:`DECIMALS` decimals (None where not finite). A server that ignores ``logprobs``
gives none, and the answer is kept without them.

What the values are: vLLM's ``--logprobs-mode`` (vllm/config/model.py ``LogprobsMode``, default ``raw_logprobs``):
``raw_logprobs`` / ``processed_logprobs`` are log-softmax values, ``raw_logits`` the model's logits and
``processed_logits`` the logits after the sampling processors (penalties, logit bias): for a greedy request, the
very values its argmax compared (vllm/v1/sample/sampler.py ``Sampler.sample``, the all-greedy branch). A record's
items name the mode they were asked under (``logprobs_mode``, :func:`mode_of`); the serve configurations that
want partings classified set ``--logprobs-mode processed_logits``.

The rule (:func:`classify`): two greedy answers to one prompt share every token before their first token apart,
so at that token each side's top two are the values its argmax compared; the *margin* is top1 - top2 (log-softmax
subtracts one constant from every logit, so a logprob margin equals the logit margin). vLLM's lm_head computes
the logits in the model's dtype, bf16 here, and each logit is rounded to bf16 once it is computed: the exact value
moves by up to half a bf16 step, and a kernel that sums in another order can land a logit on the neighbouring
bf16 value. Two logits whose gap is at most two steps can therefore swap order by that rounding alone; a wider
gap cannot. So a parting is a **near-tie** when on both sides the margin is at most ``2 * ulp_bf16(z)``, with
``ulp_bf16(z) = 2 ** (floor(log2 |z|) - 7)`` (bfloat16 keeps 8 significant bits, 7 stored: the spacing of
bf16 values in the binade of ``z``; IEEE 754-2019 sec. 3.3's spacing of a binary format with p = 8) and ``|z|``
the larger magnitude of the side's two values, plus the request's ``presence_penalty`` (the processed value is the
bf16 logit less the penalty, whose own binade may be one higher). Else it is **clear**: the logits at that
token moved by more than the last rounding can explain. A clear parting is a finding to look at, not proof of a
fault: rounding differences in earlier layers add up and can move a logit by many steps. Classification needs the
logits' magnitude, so only the logit modes classify; a record in a logprob mode, or whose mode is unknown (a
server this engine did not launch), shows the margins and classifies nothing, saying why; so does a request with a
frequency or repetition penalty (its processed logit is the bf16 logit scaled or shifted by an amount not kept).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Values asked for per token: the chosen token and its runner-up.
TOP = 2
#: Decimals kept of each value: bf16 logits of magnitude >= 1 lie on steps >= 2**-7, so rounding at 1e-5 moves
#: none by more than a small share of a step, and the record stays small.
DECIMALS = 5
#: vLLM's ``--logprobs-mode`` values (vllm/config/model.py ``LogprobsMode``) and its default.
MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
DEFAULT_MODE = "raw_logprobs"
#: The modes whose values are logits (their magnitude sets the bf16 step): the ones that classify.
LOGIT_MODES = ("raw_logits", "processed_logits")
#: bfloat16's significand bits after the leading one.
BF16_MANTISSA_BITS = 7
#: A near-tie's margin at most this many bf16 steps (module docstring).
NEAR_TIE_ULPS = 2
_ID_PREFIX = "token_id:"


def token_of(tok: Any) -> int | str:
    """A token as vLLM names it in logprobs: ``"token_id:<n>"`` (``return_tokens_as_token_ids``) -> n, any other
    text as it is. Raises ValueError for a token that is not text."""
    if not isinstance(tok, str):
        raise ValueError(f"a logprobs token must be text, not {type(tok).__name__}")
    if tok.startswith(_ID_PREFIX) and tok[len(_ID_PREFIX):].isdigit():
        return int(tok[len(_ID_PREFIX):])
    return tok


def _value(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"a logprobs value must be a number, not {v!r}")
    return round(float(v), DECIMALS) if math.isfinite(v) else None


def step_of(pairs: list[tuple[Any, Any]]) -> list:
    """``[token, value, token, value]`` of the :data:`TOP` highest of ``pairs`` ((token, value) as the server
    listed them), the highest first; fewer where fewer were listed. Raises ValueError for a malformed pair."""
    got = sorted(((token_of(t), _value(v)) for t, v in pairs),
                 key=lambda p: -math.inf if p[1] is None else p[1], reverse=True)[:TOP]
    return [x for p in got for x in p]


def chat_steps(logprobs: Any) -> list[list]:
    """The steps of a chat chunk's ``choices[i].logprobs`` (``{"content": [{"token", "logprob", "top_logprobs":
    [{"token", "logprob"}, ...]}, ...]}``), one per token; a token without ``top_logprobs`` gives its own value
    alone. Raises ValueError for another shape."""
    if logprobs is None:
        return []
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        raise ValueError("chat logprobs without a content list")
    out = []
    for e in content:
        if not isinstance(e, dict):
            raise ValueError("a chat logprobs entry is not an object")
        top = e.get("top_logprobs") or ([{"token": e.get("token"), "logprob": e.get("logprob")}]
                                        if e.get("logprob") is not None else [])
        out.append(step_of([(t.get("token"), t.get("logprob")) for t in top if isinstance(t, dict)]))
    return out


def completion_steps(logprobs: Any) -> list[list]:
    """The steps of a completions chunk's ``choices[i].logprobs`` (``{"tokens", "token_logprobs",
    "top_logprobs": [{token: value, ...} | None, ...]}``), one per token. Raises ValueError for another shape."""
    if logprobs is None:
        return []
    tops = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(tops, list):
        raise ValueError("completion logprobs without a top_logprobs list")
    return [step_of(list(t.items())) if isinstance(t, dict) else [] for t in tops]


def mode_of(extra_args: list[str], launched: bool) -> str | None:
    """The ``--logprobs-mode`` a server was started with: the flag's value in ``extra_args`` (``--flag value`` or
    ``--flag=value``; vLLM takes the last), vLLM's default where it is absent, None where the server was not
    launched by this engine (``launched`` False: its flags are unknown). Raises ValueError for a value vLLM does
    not know."""
    if not launched:
        return None
    mode = DEFAULT_MODE
    args = list(extra_args)
    for i, a in enumerate(args):
        if a == "--logprobs-mode" and i + 1 < len(args):
            mode = args[i + 1]
        elif a.startswith("--logprobs-mode="):
            mode = a.split("=", 1)[1]
    if mode not in MODES:
        raise ValueError(f"--logprobs-mode {mode!r}: vLLM knows {', '.join(MODES)}")
    return mode


def ulp_bf16(z: float) -> float:
    """The spacing of bfloat16 values at ``z``: ``2 ** (floor(log2 |z|) - 7)`` (module docstring); for ``z`` = 0,
    the spacing of the smallest normal binade, ``2 ** -133``. Raises ValueError for a value that is not finite."""
    if not math.isfinite(z):
        raise ValueError(f"no bf16 step at {z!r}")
    if z == 0:
        return 2.0 ** (-126 - BF16_MANTISSA_BITS)
    return 2.0 ** (math.floor(math.log2(abs(z))) - BF16_MANTISSA_BITS)


def margin(step: list | None) -> float | None:
    """top1 - top2 of a step, None where it holds fewer than two finite values."""
    if not step or len(step) < 4 or step[1] is None or step[3] is None:
        return None
    return round(step[1] - step[3], DECIMALS)


def bound(step: list, presence_penalty: float = 0.0) -> float | None:
    """The widest margin bf16 rounding can flip at a step (logit values): ``NEAR_TIE_ULPS * ulp_bf16(max |z| +
    |presence_penalty|)``; None where the step holds fewer than two finite values."""
    if margin(step) is None:
        return None
    return NEAR_TIE_ULPS * ulp_bf16(max(abs(step[1]), abs(step[3])) + abs(presence_penalty))


NEAR_TIE = "near-tie"
CLEAR = "clear"


@dataclass
class Parting:
    """Two answers' first token apart, with each side's top two there.

    ``index``: the token (0-based); ``cand`` / ``base``: the side's step (:func:`step_of`; None where it has no
    token or no top two there); ``margins``: (cand, base) top1 - top2 in the values' unit; ``bounds``: (cand,
    base) the near-tie bound (:func:`bound`) where the mode classifies; ``kind``: :data:`NEAR_TIE`,
    :data:`CLEAR` or None (not classified, ``why`` says why)."""

    index: int
    cand: list | None
    base: list | None
    margins: tuple[float | None, float | None]
    bounds: tuple[float | None, float | None] = (None, None)
    kind: str | None = None
    why: str | None = None

    @property
    def largest_margin(self) -> float | None:
        """The larger of the two sides' margins, None where neither has one."""
        ms = [m for m in self.margins if m is not None]
        return max(ms) if ms else None

    def describe(self, names: tuple[str, str] = ("the candidate", "the baseline")) -> str:
        """One line for the notes: the token, each side's top two with its margin (and bound), and the kind or
        why it is not classified; ``names``: what the two sides are called."""
        def side(name: str, step: list | None, m: float | None, b: float | None) -> str:
            if not step:
                return f"{name}: no top two"
            pairs = ", ".join(f"{step[k]!r} {step[k + 1]:g}" if step[k + 1] is not None else f"{step[k]!r} -"
                              for k in range(0, len(step) - 1, 2))
            return f"{name}: {pairs}" + (f" (margin {m:g}" + (f", bound {b:g}" if b is not None else "") + ")"
                                          if m is not None else "")

        sides = "; ".join(side(n, st, m, b) for n, st, m, b in zip(names, (self.cand, self.base), self.margins,
                                                                   self.bounds))
        return f"token {self.index}: {sides}; " + (self.kind if self.kind else f"not classified: {self.why}")


def _step_at(top2: Any, token_ids: Any, i: int) -> list | None:
    """An item's step at token ``i``: only where its steps are one per token id (else they cannot be placed)."""
    if not isinstance(top2, list) or not isinstance(token_ids, list) or len(top2) != len(token_ids):
        return None
    s = top2[i] if 0 <= i < len(top2) else None
    return s if isinstance(s, list) and s else None


def _penalties(gen: dict) -> tuple[float, str | None]:
    """(presence penalty, why not classifiable) of a request's generation parameters."""
    for k in ("frequency_penalty", "repetition_penalty"):
        v = gen.get(k)
        if v not in (None, 0, 0.0) and not (k == "repetition_penalty" and v == 1):
            return 0.0, f"its {k} moves each logit by an amount the record does not keep"
    p = gen.get("presence_penalty") or 0.0
    return (float(p), None) if isinstance(p, (int, float)) and not isinstance(p, bool) else (0.0, "its presence "
                                                                                            "penalty is no number")


def classify(index: int, cand: dict, base: dict) -> Parting:
    """The parting at token ``index`` of two answers (``cand``, ``base``: each ``{"top2", "token_ids",
    "logprobs_mode", "gen"}`` of an item): each side's top two there, their margins and, where both sides' values
    are logits of one mode, near-tie or clear by the module docstring's rule (a near-tie needs both sides within
    the bound)."""
    sc = _step_at(cand.get("top2"), cand.get("token_ids"), index)
    sb = _step_at(base.get("top2"), base.get("token_ids"), index)
    out = Parting(index, sc, sb, (margin(sc), margin(sb)))
    modes = {cand.get("logprobs_mode"), base.get("logprobs_mode")}
    if sc is None or sb is None:
        out.why = "no top two at that token on " + ("either side" if sc is None and sb is None else
                                                    "the candidate's side" if sc is None else "the baseline's side")
    elif None in out.margins:
        out.why = "fewer than two finite values at that token"
    elif None in modes:
        out.why = "the values' mode is unknown (a server this engine did not launch)"
    elif len(modes) > 1:
        out.why = f"the two sides' values are in other modes ({', '.join(sorted(modes))})"
    elif modes.pop() not in LOGIT_MODES:
        out.why = "the values are logprobs: the logits' magnitude, which sets the bf16 step, is not kept"
    else:
        pen, why = _penalties(cand.get("gen") or {})
        why = why or _penalties(base.get("gen") or {})[1]
        if why:
            out.why = why
        else:
            out.bounds = (bound(sc, pen), bound(sb, pen))
            near = all(m <= b for m, b in zip(out.margins, out.bounds))
            out.kind = NEAR_TIE if near else CLEAR
    return out
