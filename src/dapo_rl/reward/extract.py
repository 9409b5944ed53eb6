"""Final-answer extraction, answer cleaning and hedge detection for the math verifier.

Three steps turn a model response into a comparable answer string:

1. :func:`extract_final_answer` finds the *last* final answer: the last "Answer:" line (DAPO's prompt template;
   also "**Answer:**", "Final Answer: The final answer is ...", GSM8K's "#### 42") or the last ``\\boxed{...}`` / ``\\fbox{...}``,
   whichever comes later in the text. Boxes that end the response one after another ("\\boxed{1} and
   \\boxed{2}") are read together as one list answer. Only the last answer counts, so an earlier right answer
   followed by a wrong one is wrong. A response cut inside its last box ("... \\boxed{1") or right after its
   command ("... \\boxed") has no final answer, whatever boxes came before (:func:`has_open_final_box`).
   A long response with neither gives the last number or math span of its last sentences
   (:func:`fallback_final_answer`); a reference solution is read by :func:`gold_final_answer`.
2. :func:`clean_answer` strips presentation: Markdown, math delimiters, ``\\text{}`` wrappers, units,
   trailing punctuation, thousands separators, "x =" assignments, zero padding, "27.0" -> "27" and so on, and
   reads Python syntax (``2**10``, ``2*pi``, ``sqrt(2)``) and scale words ("5 million") as the numbers they mean.
   :func:`choice_letter` reads "B) 12" as the option letter B.
3. :func:`is_hedged` flags answers that offer several candidates ("540 or 541", "either 3 or 4",
   "540, 541" for a single-valued ground truth); the verifier scores those as wrong.

Pure string code: no sympy, no ``eval``; model output is never executed.
"""

from __future__ import annotations

import re

__all__ = [
    "BOX_COMMANDS",
    "choice_letter",
    "clean_answer",
    "extract_final_answer",
    "fallback_final_answer",
    "find_boxed",
    "gold_final_answer",
    "has_open_final_box",
    "has_top_level_equation",
    "is_hedged",
    "is_multi_valued",
    "looks_like_prose",
    "split_top_level",
]

BOX_COMMANDS: tuple[str, ...] = ("boxed", "fbox")
"""LaTeX commands whose argument is read as the final answer."""

_ANSWER_ANCHOR = re.compile(
    r"(?i)(?:answer\s*(?:\*\*|__)?\s*:|final\s+answer\s+is\b\s*:?|(?<!#)####(?!#)(?=[ \t]*[-+$\\\d.]))"
)
"""An answer anchor: "Answer:" (any case, also "**Answer**:"), Minerva's "The final answer is", or GSM8K's
``#### 42`` (four hashes followed on their line by a number or math, so a Markdown heading "#### Step 2" is not
one)."""

_BOX_START = re.compile(r"\\(?:" + "|".join(BOX_COMMANDS) + r")\b\s*")

_MAX_MERGE_SEPARATOR_CHARS = 60
"""Two boxes are read as one list answer only when at most this much text separates them."""


# --- locating answers ------------------------------------------------------------------------------------


def _brace_pairs(text: str) -> dict[int, int]:
    """Map each ``{`` that is closed to its ``}`` in one pass (escaped ``\\{`` / ``\\}`` do not count).

    One stack pass keeps box finding linear even for degenerate text ("\\boxed{" repeated without end).
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def find_boxed(text: str) -> list[tuple[int, int, str]]:
    """All ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, outermost only, in order of appearance.

    Args:
        text: any string.

    Returns:
        ``(start, end, content)`` per box: ``text[start:end]`` is the whole command, ``content`` its argument
        (nested braces kept). ``\\boxed 5`` (no braces) gives the next token. A box without its closing brace
        (a truncated response) is skipped.
    """
    boxes: list[tuple[int, int, str]] = []
    pairs: dict[int, int] | None = None
    pos = 0
    while True:
        match = _BOX_START.search(text, pos)
        if match is None:
            return boxes
        start, after = match.start(), match.end()
        if after < len(text) and text[after] == "{":
            if pairs is None:
                pairs = _brace_pairs(text)
            close = pairs.get(after)
            if close is None:
                pos = after
                continue
            boxes.append((start, close + 1, text[after + 1 : close]))
            pos = close + 1
        else:
            # "\boxed 5": the argument is the next token, only after whitespace ("\boxedx" is not a box).
            token = re.match(r"[^\s$}]+", text[after:])
            if token is None or after == match.start() + len(match.group(0).rstrip()):
                pos = after
                continue
            boxes.append((start, after + token.end(), token.group(0)))
            pos = after + token.end()


def _last_open_box(text: str, after: int) -> int | None:
    """Start of the last ``\\boxed{`` / ``\\fbox{`` at or past ``after`` whose brace is never closed (a response cut
    at the length limit: "... \\boxed{1", "\\boxed{\\frac{1}{2"), or of a box command that ends the text before
    its argument ("... \\boxed", "\\boxed ", "\\fbox": cut right after the command), or ``None``. One pass over the
    text from ``after`` on (usually just what follows the last box), and only when a box starts there."""
    tail = text[after:]
    bare = [m.start() for m in _BOX_START.finditer(tail) if m.end() == len(tail)]  # `\s*` took what follows
    if bare:
        return after + bare[-1]  # nothing can follow the text's end: it is the last box
    starts = [(m.start(), m.end()) for m in _BOX_START.finditer(tail) if tail.startswith("{", m.end())]
    if not starts:
        return None
    pairs = _brace_pairs(tail)
    open_starts = [start for start, brace in starts if brace not in pairs]
    return after + open_starts[-1] if open_starts else None


def _answer_line(text: str) -> tuple[int, int, str] | None:
    """The last answer anchor's content: ``(anchor_start, content_end, content)`` or ``None``.

    The content is the rest of the anchor's line; when that is empty (``"Answer:\\n540"``) it is the next
    non-empty line, and a display block opened there (``$$``, ``\\[``) runs to its closing delimiter. An anchor
    opened by a square bracket (``[answer: 42]``, ``[Final Answer: 42]``, any case) ends at its closing bracket
    (:func:`_inside_bracket`).
    """
    last = None
    for match in _ANSWER_ANCHOR.finditer(text):
        if match.group(0) == "####" and _is_heading(text, match.end()):
            continue
        last = match
    if last is None:
        return None
    found = _anchor_content(text, last)
    line_start = text.rfind("\n", 0, last.start()) + 1
    if _BRACKET_LEAD.search(text, line_start, last.start()):
        return found[0], found[1], _inside_bracket(found[2])
    return found


_BRACKET_LEAD = re.compile(r"(?i)(?<!\\)\[[ \t*_]*(?:final[ \t]+)?\Z")
"""A ``[`` (not the display-math ``\\[``) right before an answer anchor, "final" allowed between."""


def _inside_bracket(content: str) -> str:
    """The answer of ``[answer: ...]``: ``content`` up to the bracket that closes the lead-in's ``[``.

    A content ending in ``]`` (after trailing spaces and ``.``) loses that last ``]``, so an interval survives
    (``"[0, 1)]"`` -> ``"[0, 1)"``); otherwise it ends at its first ``]`` that no ``[`` of its own opened
    (``"42] and more"`` -> ``"42"``). Without such a ``]`` (a truncated response) it is returned whole.
    """
    trimmed = content.rstrip(" \t\r.")
    if trimmed.endswith("]"):
        return trimmed[:-1]
    depth = 0
    for i, ch in enumerate(content):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                return content[:i]
    return content


def _anchor_content(text: str, last: re.Match[str]) -> tuple[int, int, str]:
    """``(anchor_start, content_end, content)`` of the anchor ``last`` (see :func:`_answer_line`)."""
    start = last.end()
    line_end = text.find("\n", start)
    line_end = len(text) if line_end == -1 else line_end
    while text[start:line_end].strip(" \t\r*_") == "" and line_end < len(text):
        start = line_end + 1
        line_end = text.find("\n", start)
        line_end = len(text) if line_end == -1 else line_end
    lead = re.match(r"[ \t*_]*", text[start:])
    start += lead.end() if lead else 0
    for opener, closer in (("$$", "$$"), ("\\[", "\\]")):
        if text.startswith(opener, start):
            close = text.find(closer, start + len(opener))
            if close != -1:
                end = text.find("\n", close + len(closer))
                end = len(text) if end == -1 else end
                return last.start(), end, text[start:end]
    line_end = text.find("\n", start)
    end = len(text) if line_end == -1 else line_end
    return last.start(), end, text[start:end]


def _is_heading(text: str, start: int) -> bool:
    """Whether the line after a ``####`` at ``start`` reads as a Markdown heading ("#### 1. Find the area",
    "#### 2. Verify", "#### 3) Check"): GSM8K's marker is followed by the answer alone, so any word of two or more
    letters outside a LaTeX command makes it a heading."""
    end = text.find("\n", start)
    line = re.sub(r"\\[A-Za-z]+", " ", text[start : len(text) if end == -1 else end])
    return re.search(r"[A-Za-z]{2,}", line) is not None


def _merge_separator(between: str) -> str | None:
    """How two boxes separated by ``between`` join: ``", "`` or ``" or "``, or ``None`` (not one answer).

    Boxes join when only punctuation, spacing or math delimiters separate them, or a short phrase ending in
    "and"/"or" ("\\boxed{1} and \\boxed{2}", "\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}").
    """
    if len(between) > _MAX_MERGE_SEPARATOR_CHARS:
        return None
    plain = re.sub(r"\\(?:text|textbf|mbox|mathrm|textnormal)\s*\{([^{}]*)\}", r" \1 ", between)
    plain = re.sub(r"\\(?:quad|qquad|[,;:! ()\[\]])", " ", plain)
    plain = re.sub(r"[A-Za-z](?:_\{?\w+\}?)?\s*=\s*$", " ", plain.rstrip(" $"))  # "and y_2 = \\boxed{..}"
    if re.search(r"[^\sA-Za-z,;.:$()]", plain):
        return None
    if "\\" in plain:
        return None
    words = re.findall(r"[A-Za-z]+", plain)
    if not words:
        return ", "
    if len(words) <= 4 and words[-1].lower() in ("and", "or"):
        return " or " if "or" in (w.lower() for w in words) else ", "
    return None


def _last_boxes(text: str) -> tuple[int, int, str] | None:
    """The last box, joined with the boxes right before it that form one list answer (see module doc)."""
    boxes = find_boxed(text)
    if not boxes:
        return None
    start, end, content = boxes[-1]
    parts = [content.strip()]
    joiners: list[str] = []
    for prev_start, prev_end, prev_content in reversed(boxes[:-1]):
        joiner = _merge_separator(text[prev_end:start])
        if joiner is None:
            break
        parts.append(prev_content.strip())
        joiners.append(joiner)
        start = prev_start
    parts.reverse()
    joiners.reverse()
    if len(parts) == 1:
        return start, end, parts[0]
    distinct = list(dict.fromkeys(re.sub(r"\s+", "", p) for p in parts))
    if len(distinct) == 1:
        return start, end, parts[-1]
    joined = parts[0]
    for joiner, part in zip(joiners, parts[1:]):
        joined += joiner + part
    return start, end, joined


def _unboxed(text: str) -> str:
    """``text`` with every box removed (what an answer line says besides its boxes)."""
    out = []
    pos = 0
    for start, end, _content in find_boxed(text):
        out.append(text[pos:start])
        pos = end
    out.append(text[pos:])
    return " ".join(out)


def extract_final_answer(text: str, *, cut_at_open_box: bool = True) -> str | None:
    """Return the final answer of a response: the later of its last "Answer:" line and its last box.

    Args:
        text: the decoded response (or a ground-truth solution holding ``\\boxed{}``).
        cut_at_open_box: read a box left open at the end as a response cut at the length limit (below); False for
            a reference solution, which is never cut (:func:`gold_final_answer`).

    Returns:
        The raw (uncleaned) answer text, or ``None`` when the text has neither an answer anchor nor a box, or
        ends inside an open box.

        * Answer anchors: ``Answer:`` in any case (also inside "Final Answer:", "**Answer:**", "**Answer**:"),
          "The final answer is" and GSM8K's ``#### 42`` (not a Markdown heading such as "#### Step 2"); the
          content is the rest of that line (see :func:`_answer_line`).
        * Boxes: ``\\boxed{..}`` and ``\\fbox{..}`` with balanced, possibly nested braces. Consecutive boxes
          at the end ("\\boxed{1}, \\boxed{2}") are joined into ``"1, 2"`` ("... or ..." when joined by
          "or"); identical repeats collapse to one.
        * A box left open after the last complete box and the last answer line ("... \\boxed{12} is wrong, the
          answer is \\boxed{1", a response cut at the length limit) means no final answer: ``None``
          (:func:`has_open_final_box`).
        * When the last box lies inside the last answer line ("Answer: \\boxed{5}.") the box is returned,
          unless the rest of the line says "or"/"either" ("Answer: \\boxed{1} or 2"): then the whole line,
          so the hedge stays visible.

    Raises:
        TypeError: if ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    line = _answer_line(text)
    box = _last_boxes(text)
    if cut_at_open_box and _open_final_box(text, line, box):
        return None  # cut inside its last box: no final answer (has_open_final_box)
    if box is None:
        return None if line is None else line[2]
    if line is None:
        return box[2]
    line_start, line_end, line_text = line
    box_start, _box_end, box_text = box
    if box_start >= line_end:
        return box_text
    if box_start >= line_start:
        # "Answer: \\boxed{5}." reads the box; a line that hedges around its box ("\\boxed{1} or 2") stays whole.
        if _HEDGE_WORD.search(_unboxed(line_text)):
            return line_text
        return box_text
    # The answer line comes after the box; an answer line that is only prose around nothing keeps priority.
    return line_text


def has_open_final_box(text: str) -> bool:
    """Whether the response's last answer is a box that never closes: a ``\\boxed{`` without its ``}`` (or a
    ``\\boxed`` / ``\\fbox`` that ends the text, its argument never written) after the last complete box and the last
    "Answer:" line, as in a response cut at the length limit.

    Such a response has no final answer (:func:`extract_final_answer` returns ``None``, and the verifier's
    ``lenient`` fallback does not read one either): the earlier, complete box is not its answer ("... so
    \\boxed{12} is wrong, actually the answer is \\boxed{1" is not 12), and the cut box may have gone on
    ("\\boxed{1" of a "\\boxed{125}"). An "Answer:" line after the open box still counts ("\\boxed{1\\n\\nAnswer:
    12" answers 12). DAPO keeps truncated samples, so training scores many such responses.
    Source: marin-community/marin PR #9163 (an unterminated last box let an earlier box win).
    """
    return _open_final_box(text, _answer_line(text), _last_boxes(text))


def _open_final_box(text: str, line: tuple[int, int, str] | None, box: tuple[int, int, str] | None) -> bool:
    """:func:`has_open_final_box` given ``text``'s last answer line and last box."""
    after = max(line[0] + 1 if line is not None else 0, box[0] + 1 if box is not None else 0)
    return _last_open_box(text, after) is not None


_CHAT_TOKEN = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|end_of_text|start_header_id)\|>|</s>")
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\$(.+?)\$|\\\((.+?)\\\)", re.DOTALL)
_NUMBER_TOKEN = re.compile(
    r"(?<![\w.])[+-]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][+-]?\d{1,3}(?!\w|\.\d))?(?:[ \t]+\d+\s*/\s*\d+(?!\d|\.\d))?"
    r"(?:\s*/\s*\d+)?(?:\s*%)?"
)
"""A number in prose: ``1,234.5``, ``1.5e-7``, ``3/4``, a mixed number ``1 1/4``, ``15%``."""
_GROUP_SEPARATOR = re.compile(r"(?<=\d)(?:\{,\}|\\[,!]\s*)(?=\d{3}(?!\d))")
"""TeX thousands separators between digit groups: ``9{,}500``, ``9\\,500``, ``9\\!500``."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_LIST_GAP = re.compile(r"(?i)\s*(?:[,;]|\s(?:and|or|either)\s|,\s*(?:and|or)\s)\s*")

FALLBACK_WINDOW_CHARS = 600
"""The fallback reads only this many characters at the end of a response."""

FALLBACK_SENTENCES = 3
"""... and only its last this-many sentences."""


def fallback_final_answer(text: str) -> str | None:
    """The answer a response without "Answer:" or ``\\boxed{}`` ends on, or ``None``.

    What Math-Verify does for such responses (its last-expression fallback), narrowed to the end of the text: a
    chat-template token the model went on to emit (``<|im_start|>user``, ``<|im_end|>``, ...) ends the response,
    "I hope it is correct." is dropped, then among the last :data:`FALLBACK_SENTENCES` sentences of the last
    :data:`FALLBACK_WINDOW_CHARS` characters the last one holding a math span (``$..$``, ``\\(..\\)``,
    ``$$..$$``, ``\\[..\\]``) or a number gives its last such candidate ("... the system is $(7, 6)$." ->
    ``"(7, 6)"``; "... increases by 100%." -> ``"100%"``). Candidates listed right before it come with it
    ("1, 2, 3" -> ``"1, 2, 3"``; "3 or 4" -> ``"3 or 4"``), so the hedge rule still sees a list of guesses.
    A window that would start inside ``$...$`` starts after it, so a ``$`` is never read half-open. TeX thousands
    separators (``9{,}500``, ``1\\,250``) join their digit groups first, and a mixed number ("1 1/4") is one
    candidate.

    Args:
        text: the decoded response.

    Returns:
        The raw candidate text, or ``None`` when the end of the response holds no number and no math.
    """
    chat = _CHAT_TOKEN.search(text)
    body = text[: chat.start()] if chat else text
    body = _GROUP_SEPARATOR.sub(",", body)  # "$9{,}500." -> "$9,500.": one number, not "9" and "500"
    hope = body.rfind("I hope it is correct", max(0, len(body) - 2 * FALLBACK_WINDOW_CHARS))
    if hope != -1:
        body = body[:hope]
    if len(body) > FALLBACK_WINDOW_CHARS:
        cut = len(body) - FALLBACK_WINDOW_CHARS
        if len(re.findall(r"(?<!\\)\$", body[:cut])) % 2:  # the cut falls inside $...$: start after it closes
            close = body.find("$", cut)
            cut = len(body) if close == -1 else close + 1
        body = body[cut:]
    sentences = [s for s in _SENTENCE_END.split(body) if s.strip()]
    for sentence in reversed(sentences[-FALLBACK_SENTENCES:]):
        candidates: list[tuple[int, int, str]] = []
        for span in _MATH_SPAN.finditer(sentence):
            content = next(g for g in span.groups() if g is not None)
            candidates.append((span.start(), span.end(), content.strip()))
        outside = _MATH_SPAN.sub(lambda m: " " * len(m.group(0)), sentence)
        for number in _NUMBER_TOKEN.finditer(outside):
            candidates.append((number.start(), number.end(), number.group(0).strip()))
        if not candidates:
            continue
        candidates.sort()
        # The last candidate, with the candidates listed right before it ("1, 2 or 3"): a list stays a list.
        run = [candidates[-1]]
        joiner = ", "
        for cand in reversed(candidates[:-1]):
            between = sentence[cand[1] : run[0][0]]
            if not _LIST_GAP.fullmatch(between):
                break
            if _HEDGE_WORD.search(between):
                joiner = " or "
            run.insert(0, cand)
        return joiner.join(c[2] for c in run)
    return None


def gold_final_answer(text: str) -> str:
    """The answer a reference solution states.

    Boxes at the end of a ground truth that only symbols separate ("$\\boxed{35 cm} ++++++ \\boxed{4}$") are
    the parts of one answer and are joined with ``", "``; otherwise the gold reads like a response
    (:func:`extract_final_answer`: the last "Answer:" line or last box, "\\boxed{1} no ... \\boxed{2}" -> "2"),
    and a text with neither is the answer itself. Both verdicts are Math-Verify's on its own test pairs.
    """
    boxes = find_boxed(text)
    run = boxes[-1:]
    for prev in reversed(boxes[:-1]):
        if re.search(r"[A-Za-z]", text[prev[1] : run[0][0]].replace("\\", "")):
            break
        run.insert(0, prev)
    parts = list(dict.fromkeys(content.strip() for _s, _e, content in run))
    if len(parts) > 1:
        return ", ".join(parts)
    return extract_final_answer(text, cut_at_open_box=False) or text


# --- cleaning -------------------------------------------------------------------------------------------

_UNWRAP_COMMANDS = (
    "boxed",
    "fbox",
    "text",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "texttt",
    "mbox",
    "mathrm",
    "mathbf",
    "mathit",
    "mathtt",
    "mathsf",
    "operatorname",
    "emph",
    "bm",
    "boldsymbol",
)
_UNWRAP_START = re.compile(r"\\(?:" + "|".join(_UNWRAP_COMMANDS) + r")\s*\{")

_UNITS = (
    "degrees?",
    "radians?",
    "rad",
    "cm",
    "mm",
    "km",
    "meters?",
    "metres?",
    "centimeters?",
    "kilometers?",
    "millimeters?",
    "inch(?:es)?",
    "feet",
    "foot",
    "ft",
    "yards?",
    "yd",
    "miles?",
    "mi",
    "mph",
    "kph",
    "km/h",
    "m/s",
    "ft/s",
    "hours?",
    "hrs?",
    "minutes?",
    "mins?",
    "seconds?",
    "secs?",
    "days?",
    "weeks?",
    "months?",
    "years?",
    "dollars?",
    "cents?",
    "euros?",
    "pounds?",
    "lbs?",
    "ounces?",
    "oz",
    "kg",
    "grams?",
    "kilograms?",
    "liters?",
    "litres?",
    "ml",
    "mL",
    "gallons?",
    "units?",
    "sq\\.?\\s*units?",
    "square\\s+units?",
    "cubic\\s+units?",
    "points?",
    "ways?",
    "people",
    "persons?",
    "students?",
    "times",
    "percent",
    "pct",
)
_UNIT_WORDS = r"(?:(?:square|sq\.?|cubic)\s+)?(?:" + "|".join(_UNITS) + r")(?:\s*\^\s*\{?[23]\}?)?"
_TRAILING_UNIT = re.compile(r"(?:(?<=[\d})])|(?<=\\pi))\s*" + _UNIT_WORDS + r"\s*$", re.IGNORECASE)
"""A unit word after a number, a closing bracket or ``\\pi`` ("5 cm", "\\frac{\\pi}{2} rad", "2\\pi rad")."""
_TRAILING_LETTER_UNIT = re.compile(r"^([+-]?[\d.,]+)\s*(?:m|s|h|g|L)(?:\s*\^\s*\{?[23]\}?)?\s*$")
"""One-letter units only after a plain number ("5 m", "3 s"); "a + m" and "x + 2 h" keep theirs."""
_MATH_WORDS = frozenset(
    {"pi", "tau", "phi", "theta", "alpha", "beta", "gamma", "infty", "inf", "sqrt", "ln", "log", "exp"}
)
_ATTACHED_UNIT = re.compile(r"(?<=\d)(?:cm|mm|km|kg|ft|mph|cm\^2|m\^2|cm\^3)\s*$")
_TRAILING_WORDS = re.compile(r"(?<=\d)\s+(?:[A-Za-z]{2,}\.?\s*){1,3}$")
_SCALE_WORDS = {"hundred": 2, "thousand": 3, "million": 6, "billion": 9, "trillion": 12}
"""Words that multiply the number before them ("5 million" is 5000000): never dropped as a unit."""
_SCALABLE_NUMBER = re.compile(r"[+-]?(?:(?:[1-9]\d{0,2}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)")
_TRAILING_DEGREE = re.compile(r"\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\circ|\\degree)\s*(?:[CF]\b)?\s*$")
_DEGREE_ANYWHERE = re.compile(r"\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree)")
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc|arcsin|arccos|arctan)")
_PERCENT = re.compile(r"\s*(?:\\%|%|\\text\{\s*\\?%\s*\}|\bpercent(?:age)?\b|\bpct\b)\s*$", re.IGNORECASE)

_INT = re.compile(r"[+-]?\d+")
_INT_FLOAT = re.compile(r"([+-]?\d+)\.0*")
_THOUSANDS = re.compile(r"[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")
_SIMPLE_LHS = re.compile(
    r"\s*(?:[A-Za-z](?:_\{?\w+\}?)?'*(?:\([A-Za-z0-9, ]*\))?|\\[A-Za-z]+\s*[A-Za-z]{0,4}|[A-Za-z]{1,4}|"
    r"\(\s*[A-Za-z](?:_\{?\w+\}?)?(?:\s*,\s*[A-Za-z](?:_\{?\w+\}?)?)+\s*\))\s*"
)
_RELATION_CHARS = "<>!=:"
_LEADING_PHRASE = re.compile(
    r"(?i)^\s*(?:(?:so|thus|therefore|hence)\s*,?\s*)?(?:the\s+)?(?:final\s+)?answer\b\s*(?:is\b)?\s*:?\s*"
)
_PROSE_VERB = re.compile(r"(?i)(?<![A-Za-z\\])(?:is|are|equals|was|will\s+be)(?![A-Za-z])")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}(?![A-Za-z])")
_HOPE = re.compile(r"(?i)\s*\.?\s*I hope it is correct\.?.*$", re.DOTALL)


def _unwrap_commands(s: str) -> str:
    """Replace ``\\text{x}``, ``\\boxed{x}``, ``\\mathrm{x}``, ... by ``x`` (balanced braces, all of them)."""
    for _ in range(50):
        match = _UNWRAP_START.search(s)
        if match is None:
            return s
        open_index = match.end() - 1
        close = _brace_pairs(s).get(open_index)
        if close is None:
            return s[: match.start()] + s[open_index + 1 :]
        s = s[: match.start()] + s[open_index + 1 : close] + s[close + 1 :]
    return s


def looks_like_prose(s: str) -> bool:
    """Two or more words of 3+ letters outside LaTeX commands: a sentence rather than an expression."""
    return len(_PROSE_WORD.findall(s)) >= 2


def _strip_prose_head(s: str) -> str:
    """Sentence to value: "The volume of $V$ is 120" -> "120": keep what follows the last "is"/"are"/"equals" of a
    sentence, when that holds no word of 3+ letters other than "and" and scale words ("the roots are 3 and -2" ->
    "3 and -2", "the population is 5 million" -> "5 million")."""
    if not _PROSE_WORD.search(s):
        return s
    verbs = list(_PROSE_VERB.finditer(s))
    if not verbs:
        return s
    head, tail = s[: verbs[-1].start()], s[verbs[-1].end() :].strip()
    value_words = {"and", *_SCALE_WORDS}
    if (
        not tail
        or not re.search(r"[A-Za-z]", head)
        or any(w.lower().removesuffix("s") not in value_words for w in _PROSE_WORD.findall(tail))
    ):
        return s
    if _HEDGE_WORD.search(head):
        return s  # "3 or 4 is ..." keeps its hedge visible
    return tail


_EXPLANATION = re.compile(
    r"(?i)\s*(?:\((?=[^()]*(?<![\\A-Za-z])[A-Za-z]{3,})[^()]*\)\s*$"
    r"|[,;:]?\s+(?:because|since|as|which|where|given|from|by|so|when|if|after)\b.*$)"
)


def _strip_explanation(s: str) -> str:
    """Drop a remark after the answer: "540 (since 3 + 537 = 540)" -> "540"; "540 because ..." -> "540"."""
    match = _EXPLANATION.search(s)
    if match is None or match.start() == 0:
        return s
    head = s[: match.start()]
    if looks_like_prose(head) or not head.strip():
        return s
    return head


def _strip_markdown(s: str) -> str:
    """Drop Markdown bold, emphasis markers, a heading or quote marker and backticks; a Python power ``2**10`` is
    read as one first (:func:`_python_powers`), so it is never taken for bold."""
    s = _python_powers(s)
    s = re.sub(r"\*\*(.+?)\*\*", r"\1", s)
    s = re.sub(r"(?<![\w\\])__(.+?)__(?!\w)", r"\1", s)
    s = s.strip()
    s = re.sub(r"^(?:[*_#>]+\s*)+", "", s)
    s = re.sub(r"(?:\s*[*_]+)+$", "", s)
    s = s.strip()
    if len(s) >= 2 and s[0] == "`" and s[-1] == "`":
        s = s.strip("`").strip()
    return s


_POWER_STARS = re.compile(r"(?<=[\w)\]}.])\*\*(?=[\w(.])|(?<=[\w)\]}.])[ \t]+\*\*[ \t]+(?=[-+\w(.])")
"""A Python power ``**`` between two operands, written tight (``2**10``, ``x**(n+1)``) or spaced on both sides
(``2 ** 10``). Markdown bold never has an operand on both sides with the same spacing: ``**42**``, ``B)** 12``."""
_EXPONENT_TOKEN = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+|[A-Za-z_]\w*)")


def _python_powers(s: str) -> str:
    """Python / sympy powers as LaTeX ones, the exponent braced: ``2**10`` -> ``2^{10}``, ``x**(n+1)`` ->
    ``x^{(n+1)}``, ``2 ** -1`` -> ``2^{-1}``, ``e**sqrt(2)`` -> ``e^{sqrt(2)}``.

    Run before Markdown bold is stripped, which would otherwise read ``2**3 + 2**2`` as bold "3 + 2" and answer
    ``23 + 22``. A ``**`` without an operand on each side (``**42**``) is left to the bold rule. An exponent that
    is neither a number, a name nor a bracketed group leaves the rest of the string as it is.
    """
    if "**" not in s:
        return s
    out: list[str] = []
    pos = 0
    for _ in range(s.count("**")):
        match = _POWER_STARS.search(s, pos)
        if match is None:
            break
        i = match.end()
        if i < len(s) and s[i] == "(":
            end = _closing_paren(s, i)
        else:
            token = _EXPONENT_TOKEN.match(s, i)
            if token is None:
                break
            end = token.end()
            if end < len(s) and s[end] == "(" and s[i].isalpha():  # a function call: "sqrt(2)"
                end = _closing_paren(s, end)
        if end is None:
            break
        out.append(s[pos : match.start()] + "^{" + s[i:end] + "}")
        pos = end
    out.append(s[pos:])
    return "".join(out)


def _closing_paren(s: str, open_index: int) -> int | None:
    """Index just past the ``)`` that closes the ``(`` at ``open_index``, or ``None`` when it is never closed."""
    depth = 0
    for j in range(open_index, len(s)):
        if s[j] == "(":
            depth += 1
        elif s[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


_PYTHON_PI = re.compile(r"(?<![A-Za-z])pi(?![A-Za-z])")
_PYTHON_SQRT = re.compile(r"(?<![A-Za-z])sqrt\s*\(")
_PYTHON_FUNCTIONS = {
    "sin": "\\sin",
    "cos": "\\cos",
    "tan": "\\tan",
    "cot": "\\cot",
    "sec": "\\sec",
    "csc": "\\csc",
    "asin": "\\arcsin",
    "acos": "\\arccos",
    "atan": "\\arctan",
    "arcsin": "\\arcsin",
    "arccos": "\\arccos",
    "arctan": "\\arctan",
    "sinh": "\\sinh",
    "cosh": "\\cosh",
    "tanh": "\\tanh",
    "ln": "\\ln",
    "log": "\\ln",
}
"""Python / sympy function names and the LaTeX commands they mean (sympy's ``log`` is the natural logarithm, as
``math.log`` is; LaTeX's ``\\log`` is base 10 for Math-Verify)."""
_PYTHON_FUNCTION = re.compile(
    r"(?<![A-Za-z])(" + "|".join(sorted(_PYTHON_FUNCTIONS, key=len, reverse=True)) + r")\s*(?=\()"
)
_PYTHON_EXP = re.compile(r"(?<![A-Za-z])exp\s*\(")
_PYTHON_INFINITY = re.compile(r"(?<![A-Za-z])oo(?![A-Za-z])")
_PYTHON_WORDS = ("pi", "sqrt", "exp", "oo", *_PYTHON_FUNCTIONS)


def _python_call(s: str, pattern: re.Pattern[str], opener: str) -> str:
    """Each call ``name(arg)`` matched by ``pattern`` (which ends at its ``(``) as ``opener + arg + "}"``:
    ``sqrt(2)`` -> ``\\sqrt{2}``, ``exp(x)`` -> ``e^{x}``; a call never closed is left as written."""
    pos = 0
    for _ in range(s.count("(")):
        match = pattern.search(s, pos)
        if match is None:
            break
        end = _closing_paren(s, match.end() - 1)
        if end is None:
            break
        s = s[: match.start()] + opener + s[match.end() : end - 1] + "}" + s[end:]
        pos = match.start() + len(opener)
    return s


def _python_syntax(s: str) -> str:
    """Plain-text mathematics in Python / sympy syntax as LaTeX: ``pi`` -> ``\\pi``, ``sqrt(x)`` -> ``\\sqrt{x}``
    (``2*pi``, ``pi/2``, ``sqrt(2)/2``, ``2*sqrt(3)``), functions as their commands (``sin(x)*2`` -> ``\\sin(x)*2``,
    ``asin(x)`` -> ``\\arcsin(x)``, ``ln(2)`` and ``log(2)`` -> ``\\ln(2)``, ``exp(x)`` -> ``e^{x}``) and ``oo``
    -> ``\\infty``, so that the LaTeX parser does not read ``pi`` as p times i or ``sin`` as s i n. Only text
    without a backslash is read this way (LaTeX already says what it means); ``*`` and powers
    (:func:`_python_powers`) are read by both.

    Golds written for sympy rather than LaTeX (``sin(x)*2``, ``ln(2)``, ``sqrt(2)/2``, ``x**2``, ``pi/4``) so match
    ``2\\sin x``, ``\\ln 2``, ``\\frac{\\sqrt{2}}{2}``, ``x^2``, ``\\frac{\\pi}{4}`` (scitix/sieval PR #90). String
    rewriting only: neither side ever reaches sympy's ``parse_expr`` / ``sympify``, only the LaTeX parser."""
    if "\\" in s or not any(word in s for word in _PYTHON_WORDS):
        return s
    s = _PYTHON_PI.sub(r"\\pi", s)
    s = _PYTHON_INFINITY.sub(r"\\infty", s)
    s = _PYTHON_FUNCTION.sub(lambda m: _PYTHON_FUNCTIONS[m.group(1)], s)
    s = _python_call(s, _PYTHON_SQRT, "\\sqrt{")
    return _python_call(s, _PYTHON_EXP, "e^{")


_FRACTION_ARGS = re.compile(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_GROUPED_DIGITS = re.compile(r"[+-]?[1-9]\d{0,2}(?:(?:,| )\d{3})+(?:\.\d+)?")


def _fraction_thousands(s: str) -> str:
    """Thousands separators inside a ``\\frac``'s numerator or denominator removed: ``\\frac{1,000}{3}`` ->
    ``\\frac{1000}{3}`` (also ``1{,}000``, ``1\\,000``, ``\\text{1,000}`` once those are cleaned to ``1,000``,
    and ``1 000``). Only an argument that is one number grouped in threes: ``\\frac{1,5}{3}`` stays."""
    if "frac" not in s:
        return s

    def one(arg: str) -> str:
        return arg.replace(",", "").replace(" ", "") if _GROUPED_DIGITS.fullmatch(arg.strip()) else arg

    return _FRACTION_ARGS.sub(lambda m: f"\\frac{{{one(m.group(1))}}}{{{one(m.group(2))}}}", s)


def _strip_math_delimiters(s: str) -> str:
    s = s.replace("\\$", "")
    s = re.sub(r"(?<!\\)\$", "", s)
    for delim in ("\\(", "\\)", "\\[", "\\]"):
        s = s.replace(delim, " ")
    return s


def _latex_spacing(s: str) -> str:
    s = re.sub(r"\\[dtc]frac", r"\\frac", s)
    s = s.replace("{,}", ",")
    s = re.sub(r",\\!\s*", ",", s)  # "11,\\! 111" is a thousands separator
    s = re.sub(r"\\[!,;: ]", "", s)
    s = s.replace('\\"', "").replace('"', "")
    s = re.sub(r"\\q?quad\b", " ", s)
    s = re.sub(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])\s*", "", s)
    s = re.sub(r"\\displaystyle\b\s*", "", s)
    s = s.replace("~", " ")
    return s


def _strip_units(s: str) -> str:
    """Degrees, percent signs and trailing unit words dropped ("10 degrees", "5 cm", "\\frac{\\pi}{2} rad");
    a scale word multiplies a plain number instead ("5 million dollars" -> "5000000", :func:`_scale`), and after
    anything else it stays (never dropped: "5 million" is not 5)."""
    if not _TRIG.search(s):
        s = _DEGREE_ANYWHERE.sub("", s)
    s = _TRAILING_DEGREE.sub("", s)
    s = _PERCENT.sub("", s)
    for _ in range(3):
        new = _TRAILING_UNIT.sub("", s)
        new = _TRAILING_LETTER_UNIT.sub(r"\1", new)
        new = _ATTACHED_UNIT.sub("", new)
        if new == s:
            break
        s = new
    words = _TRAILING_WORDS.search(s)
    if (
        words
        and not re.search(r"(?i)\b(?:and|or|to|of|is|for|either)\b", words.group(0))
        and not _MATH_WORDS.intersection(w.lower().rstrip(".") for w in words.group(0).split())
    ):
        names = [w.lower().rstrip(".") for w in words.group(0).split()]
        scales = [_SCALE_WORDS.get(w.removesuffix("s")) for w in names]
        if not any(scales):
            return s[: words.start()]
        if scales[0] and not any(scales[1:]) and _SCALABLE_NUMBER.fullmatch(s[: words.start()]):
            # "5 million (dollars)" -> "5000000"; a scale word after anything else stays, so never 5 == 5 million
            return _scale(s[: words.start()], scales[0])
    return s


def _scale(number: str, exponent: int) -> str:
    """``number`` (digits, optional sign, thousands separators and decimals) times ``10**exponent``, written out:
    ``("2.5", 6)`` -> ``"2500000"``, ``("1,500", 3)`` -> ``"1500000"``, ``(".5", 2)`` -> ``"50"``. Decimal string
    arithmetic: exact, no float rounding."""
    sign = "-" if number.startswith("-") else ""
    whole, _, frac = number.lstrip("+-").replace(",", "").partition(".")
    digits = whole + frac.ljust(exponent, "0")
    whole, frac = digits[: len(whole) + exponent], digits[len(whole) + exponent :]
    whole = whole.lstrip("0") or "0"
    return sign + whole + ("." + frac if frac.strip("0") else "")


def _strip_trailing_punct(s: str) -> str:
    """Drop trailing ``.``, ``,``, ``;`` and ``!``; a ``!`` right after a digit, letter or bracket is a factorial;
    a ``...`` that ends a list ("1, 3, 5, ...", "1; 3; 5...") is its ellipsis and stays."""
    s = s.rstrip()
    if s.endswith("...") and len(split_top_level(s[:-3])) > 1:
        return s
    while s and s[-1] in ".,;!":
        if s[-2:] in ("\\!", "\\,", "\\;"):
            break
        if s[-1] == "!" and len(s) > 1 and (s[-2].isalnum() or s[-2] in ")]}"):
            break
        s = s[:-1].rstrip()
    return s


def _top_level_relations(s: str) -> list[tuple[int, int, str]]:
    """Positions of top-level ``=`` (not ``<=``, ``>=``, ``!=``, ``==``), ``\\in`` and ``\\approx``."""
    found: list[tuple[int, int, str]] = []
    depth = 0
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\":
            command = re.match(r"\\([A-Za-z]+)", s[i:])
            if command:
                if depth == 0 and command.group(1) in ("in", "approx"):
                    found.append((i, i + command.end(), command.group(1)))
                i += command.end()
            else:
                i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "=" and depth == 0:
            prev = s[i - 1] if i else ""
            nxt = s[i + 1] if i + 1 < len(s) else ""
            if prev not in _RELATION_CHARS and nxt != "=":
                found.append((i, i + 1, "="))
        i += 1
    return found


def last_right_hand_side(s: str) -> str:
    """What follows the last top-level ``=`` of ``s`` (``"12 + 5 = 17"`` -> ``"17"``), or ``s`` without one."""
    equals = [end for _start, end, kind in _top_level_relations(s) if kind == "="]
    return s[equals[-1] :].strip() if equals else s


def has_top_level_equation(s: str) -> bool:
    """Whether ``s`` has an ``=`` or ``\\in`` outside brackets (``"2x+4y-3=0"``; not ``"\\sum_{k=0}^n k"``)."""
    return any(kind != "approx" for _s, _e, kind in _top_level_relations(s))


def _strip_assignment_one(s: str) -> str:
    relations = _top_level_relations(s)
    if not relations:
        return s
    first_start, first_end, first_kind = relations[0]
    if not _SIMPLE_LHS.fullmatch(s[:first_start]):
        return s
    if first_kind == "approx":
        return s[first_end:].strip()
    # "x = 5+5+1 = 7 = 11" -> "11"; "x = 1/3 \approx 0.33" -> "1/3" (the exact value before an approximation).
    eqs = [r for r in relations if r[2] in ("=", "in")]
    approx = [r for r in relations if r[2] == "approx" and r[0] > first_start]
    last_eq_end = eqs[-1][1]
    tail = s[last_eq_end:]
    if approx and approx[0][0] > last_eq_end:
        tail = s[last_eq_end : approx[0][0]]
    return tail.strip()


_LIST_SEPARATOR = re.compile(r"\s*(?:[,;]|(?<![A-Za-z\\])(?:and|or)(?![A-Za-z]))\s*")


def _split_keep_separators(s: str) -> list[str]:
    """Top-level split at ``,``, ``;``, "and", "or"; odd items are the separators themselves."""
    items: list[str] = []
    depth = 0
    start = 0
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            sep = _LIST_SEPARATOR.match(s, i)
            if sep and sep.group(0).strip():
                items.extend([s[start:i], sep.group(0)])
                start = i = sep.end()
                continue
        i += 1
    items.append(s[start:])
    return items


def _strip_assignment(s: str) -> str:
    items = _split_keep_separators(s)
    if len(items) == 1:
        return _strip_assignment_one(s)
    parts = items[0::2]
    if not any(_top_level_relations(p) for p in parts):
        return s
    stripped = [_strip_assignment_one(p) if _top_level_relations(p) else p.strip() for p in parts]
    if not all(stripped):
        return s
    out = stripped[0]
    for sep, part in zip(items[1::2], stripped[1:]):
        out += sep + part
    return out


def _normalize_number(s: str) -> str:
    compact = s.strip()
    if _THOUSANDS.fullmatch(compact):
        compact = compact.replace(",", "")
        s = compact
    float_int = _INT_FLOAT.fullmatch(compact)
    if float_int:
        compact = float_int.group(1)
    if _INT.fullmatch(compact):
        # Digit strings, not int(): no limit on length, no cost on a 5000-digit "answer".
        sign = "-" if compact[0] == "-" else ""
        digits = compact.lstrip("+-").lstrip("0") or "0"
        return ("" if digits == "0" else sign) + digits
    return s


_MIXED_NUMBER = re.compile(
    r"([+-]?)\s*(\d+)(?:[ \t]+(\d+)\s*/\s*(\d+)"
    r"|\s*\\frac\s*(?:\{\s*(\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d)))"
)


def _mixed_to_fraction(s: str) -> str:
    """A mixed number as one fraction: ``"1 1/4"`` / ``"1\\frac{1}{4}"`` -> ``"\\frac{5}{4}"``, ``"-2 1/2"`` -> ``"-\\frac{5}{2}"``.

    Read this way everywhere (the fast path and Math-Verify see the same fraction): a whole number followed by
    a proper fraction (0 < numerator < denominator), as the whole answer or a whole list element. ``"2 5/4"``
    (improper) and ``"2 \\cdot \\frac{1}{4}"`` are left as written.
    """

    def one(part: str) -> str:
        match = _MIXED_NUMBER.fullmatch(part.strip())
        if match is None:
            return part
        sign, whole, num, den = match.group(1), int(match.group(2)), match.group(3), match.group(4)
        if num is None:
            num, den = match.group(5) or match.group(6), match.group(7) or match.group(8)
        n, d = int(num), int(den)
        if not 0 < n < d or len(match.group(2)) > 12:
            return part
        return f"{'-' if sign == '-' else ''}\\frac{{{whole * d + n}}}{{{d}}}"

    if "/" not in s and "frac" not in s:
        return s
    parts = split_top_level(s)
    if len(parts) == 1:
        return one(s)
    new = [one(p) for p in parts]
    return s if new == parts else ", ".join(new)


def clean_answer(ans: str, *, strip_assignment: bool = True) -> str:
    """Strip presentation from an extracted answer so that equal answers become equal strings.

    Applied repeatedly until nothing changes: Markdown (``**540**``, ``__540__``, leading/trailing ``*``,
    backticks); "The final answer is" and "I hope it is correct."; math delimiters ``$..$``, ``$$..$$``,
    ``\\(..\\)``, ``\\[..\\]`` and currency ``\\$``; wrappers ``\\boxed``, ``\\fbox``, ``\\text``,
    ``\\textbf``, ``\\mathrm``, ``\\mbox`` (kept content); ``\\dfrac``/``\\tfrac``/``\\cfrac`` -> ``\\frac``;
    TeX spacing ``\\!``, ``\\,``, ``\\;``, ``\\quad``, ``~`` and ``\\left``/``\\right``; ``{,}`` -> ``,``;
    Python powers ``2**10`` -> ``2^{10}`` (before bold is stripped: :func:`_python_powers`) and, in text without
    a backslash, ``pi`` -> ``\\pi`` and ``sqrt(2)`` -> ``\\sqrt{2}`` (:func:`_python_syntax`); thousands
    separators in a fraction's numerator or denominator (``\\frac{1,000}{3}`` -> ``\\frac{1000}{3}``, not
    ``\\frac{1,5}{3}``: :func:`_fraction_thousands`);
    degrees (``^\\circ``, ``°``), percent signs, trailing unit words ("10 degrees", "5 cm", "64 square
    inches", "\\frac{\\pi}{2} rad"); a scale word times a plain number ("5 million" -> "5000000", never dropped:
    :func:`_strip_units`); trailing ``.``, ``,``, ``;``, ``!`` (not the ``...`` ending a list);
    a leading assignment ``x =``, ``f(x) =``, ``(p, q) =``,
    ``x \\in`` (the last right-hand side is kept, an ``\\approx`` tail dropped); thousands separators of a
    plain number ("1,000" -> "1000", not "(1,2)" nor "1, 2"); zero padding ("025" -> "25") and float-typed
    integers ("27.0" -> "27"); a multiple-choice letter in parentheses "(C)" -> "C"; mixed numbers ("1 1/4",
    ``2\\frac{1}{4}``) -> one fraction (:func:`_mixed_to_fraction`). Unicode minus ``−`` is read as ``-``.

    Args:
        ans: the raw answer, e.g. from :func:`extract_final_answer`, or a ground truth.
        strip_assignment: drop a leading "x =" (turn off when the reference answer is itself an equation).

    Returns:
        The cleaned answer, whitespace-trimmed (inner spaces kept).

    Raises:
        TypeError: if ``ans`` is not a ``str``.
    """
    if not isinstance(ans, str):
        raise TypeError(f"ans must be str, got {type(ans).__name__}")
    s = ans.replace("\u2212", "-").replace("\u00a0", " ").replace("\u2009", " ").replace("\u202f", " ")
    s = s.replace("\\mathrm{e}", "e").replace("\\mathrm{i}", "i")
    s = _HOPE.sub("", s)
    for _ in range(6):
        previous = s
        s = _strip_markdown(s)
        s = _LEADING_PHRASE.sub("", s)
        s = _strip_math_delimiters(s)
        s = _unwrap_commands(s)
        s = _strip_explanation(s)
        s = _strip_prose_head(s)
        s = _latex_spacing(s)
        s = _python_syntax(s)
        s = re.sub(r"\s+", " ", s).strip()
        s = _fraction_thousands(s)
        s = _strip_trailing_punct(s)
        s = _strip_units(s)
        s = _strip_trailing_punct(s)
        if strip_assignment:
            s = _strip_assignment(s)
        s = re.sub(r"^\(\s*([A-Z])\s*\)$", r"\1", s)
        s = _normalize_number(s).strip()
        s = _mixed_to_fraction(s)
        if s == previous:
            break
    return s


_CHOICE_WITH_TEXT = re.compile(
    r"\(\s*([A-Z])\s*\)(?:\s*[:.\-\u2013\u2014]?[*_\s]*)(\S.*)"
    r"|([A-Z])(?:\s*[:)]|\.(?=\s)|\s*[-\u2013\u2014](?=\s))[*_\s]*(\S.*)",
    re.DOTALL,
)


def choice_letter(ans: str) -> str | None:
    """The option letter of a multiple-choice answer written with its option's text, else ``None``.

    Args:
        ans: the cleaned answer (:func:`clean_answer`).

    Returns:
        The capital letter when ``ans`` is a letter followed by ``:``, ``)``, ``.`` (then a space) or ``-`` (then a
        space), or a letter in parentheses, and then the option's text: ``"B: 12"``, ``"B) 12"``, ``"(B) 12"``
        (from ``\\text{(B) } 12``), ``"B. twelve"``, ``"B - 12"`` -> ``"B"``. ``None`` for anything else, a bare
        ``"B"`` included (it already compares as written), for a number (``"12."`` is no letter) and for text that
        names another candidate (``"B) 12 or C) 13"``, ``"(C) and (D)"``: a hedge, left to :func:`is_hedged`).

    The verifier reads an answer this way only against a ground truth that is one capital letter.
    """
    match = _CHOICE_WITH_TEXT.fullmatch(ans.strip())
    if match is None:
        return None
    letter, text = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    if _HEDGE_WORD.search(text) or _OTHER_CHOICE.search(text):
        return None
    return letter


_OTHER_CHOICE = re.compile(r"\(\s*[A-Z]\s*\)|(?<![A-Za-z\\])[A-Z](?:\s*[:)]|\.\s|\s*$)")
"""Another option letter in an option's text: ``(D)``, ``C)``, ``C:``, ``C. ``, or a lone capital at its end."""


# --- hedges ---------------------------------------------------------------------------------------------


def split_top_level(s: str, separators: tuple[str, ...] = (",", ";")) -> list[str]:
    """Split ``s`` at separators outside brackets: ``"(1,2), [0,1)"`` -> ``["(1,2)", "[0,1)"]``.

    Every ``(``, ``[``, ``{`` opens and every ``)``, ``]``, ``}`` closes a level, so half-open intervals
    nest correctly. Parts are stripped; empty parts are kept (callers decide).
    """
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s):
            current.append(s[i : i + 2])
            if s[i + 1] in "{}":
                depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if depth <= 0 and ch in separators:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current).strip())
    return parts


_CONJUNCTION = re.compile(r"(?i)(?<![A-Za-z\\])(?:and|or|either)(?![A-Za-z])")
_HEDGE_WORD = re.compile(r"(?i)(?<![A-Za-z\\])(?:or|either)(?![A-Za-z])")
_PLUS_MINUS = re.compile(r"\\pm|\\mp|±|∓")


def is_multi_valued(answer: str) -> bool:
    """Whether a (cleaned) reference answer holds several values: a list, tuple, set, interval or ``\\pm``.

    True when it has a comma or semicolon anywhere, the words "and"/"or", or ``\\pm``/``\\mp``.
    """
    return bool("," in answer or ";" in answer or _CONJUNCTION.search(answer) or _PLUS_MINUS.search(answer))


def is_hedged(ans: str, ground_truth: str | None = None) -> bool:
    """Whether an answer hedges between several candidates, which the verifier scores as wrong.

    Hedges: the words "or" / "either" ("540 or 541", "either 3 or 4"); "and" or top-level commas/semicolons
    joining different values ("540 and 541", "540, 541"); ``\\pm``. Repeating one value ("5, 5") is not a
    hedge, and neither is a single tuple or interval ("(1, 2)", "[0, 1)").

    When the ground truth itself holds several values (:func:`is_multi_valued`: a list, tuple, set, "a or
    b", ``\\pm``), nothing counts as a hedge: listing values is then the expected form, and equivalence is
    left to the comparison.

    Args:
        ans: the cleaned answer (:func:`clean_answer`).
        ground_truth: the cleaned ground truth, or ``None`` to judge the answer alone (as single-valued).

    Returns:
        ``True`` if the answer offers more than one candidate for a single-valued ground truth.
    """
    if ground_truth is not None and is_multi_valued(ground_truth):
        return False
    if _PLUS_MINUS.search(ans):
        return True
    if _HEDGE_WORD.search(ans):
        return True
    parts = split_top_level(ans, separators=(",", ";"))
    pieces: list[str] = []
    for part in parts:
        pieces.extend(p for p in re.split(r"(?i)(?<![A-Za-z\\])and(?![A-Za-z])", part))
    distinct = {re.sub(r"\s+", "", p) for p in pieces if p.strip()}
    return len(distinct) > 1


def nesting_depth(s: str) -> int:
    """How deep the brackets ``( [ {`` of `s` nest (unbalanced closers are not checked): ``"f((x))"`` -> 2.
    Inputs nested deeper than a verifier's limit are refused before any parser sees them."""
    depth = deepest = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest
