"""A report edited as the account manager asks ("make the risks section shorter and mention
the renewal"): only what the instruction asks changes, sections written by hand stay.

With a model (`update_report`, the `briefs` role): one structured call given the account's
data, the report's sections, the hand-edited ones and the instruction; its answer lists the
sections it changed, each in full. Validated: known section names, each once, text not
empty; one repair round naming the problems. A changed hand-edited section the instruction
does not name is not applied (the revision lists it as `ignored`). A model that fails (or
whose answer is still invalid) hands the instruction to the rule editor below.

Without one (the rule editor): the instruction must name the sections it changes (`## `
names, or "summary", "metrics", "questions", "risk", "next step") in a clause that asks for a
change (a clause that keeps a section, "leave the risks as I wrote them", names none), and
ask for one or more of these, applied in this order to each named section:

| asked | done |
|---|---|
| shorter, shorten, condense, concise, trim, cut | keep the first half of its bullets (or sentences; a table's rows), at least one |
| remove / drop / delete … about WORDS | drop the bullets or sentences containing WORDS |
| mention / add / include / note WHAT | add one sentence from the account data: the renewal date, ARR, tier, owner, industry, employees, or a usage metric named by its words (current and limit) |

Anything else is refused with what the rule editor understands (`EditRefused`): nothing is
guessed. Every figure it adds is one of the account data's, as written there (no day
count, no share of a limit: as in the data-only report, nothing derived).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import msgspec

from services.enricher.briefs.writer import system, validated
from services.enricher.reports.document import number
from shared import account_reports
from shared import events as ev
from shared.llm import LLMClient, Recorder

ALIASES = {"summary": "Executive Summary", "executive summary": "Executive Summary", "metrics": "Key Metrics",
           "key metrics": "Key Metrics", "questions": "Key Questions", "key questions": "Key Questions",
           "risk": "Risks", "risks": "Risks", "next step": "Next Steps", "next steps": "Next Steps",
           "situation": "Situation", "complication": "Complication", "resolution": "Resolution",
           "evidence": "Evidence"}
NAMES = re.compile(r"\b(" + "|".join(sorted(map(re.escape, ALIASES), key=len, reverse=True)) + r")\b", re.IGNORECASE)
# An instruction's clauses: what each asks of the sections it names. A colon does not end a
# clause ("Risks: shorter" names Risks).
CLAUSES = re.compile(r"[,;.!?]+|\s+(?:and|then|but|while|although|though|except|so)\s+", re.IGNORECASE)
# From a keep word on, the clause names what is to stay ("shorten the risks without losing the
# renewal"); from a word of context on, what it only refers to ("… given the situation").
KEEP = re.compile(r"\b(?:leave|keep|don't|do\s+not|never|not|without|unchanged|untouched|alone|as\s+(?:I|we)\s+wrote)\b",
                  re.IGNORECASE)
CONTEXT = re.compile(r"\b(?:given|considering|in\s+light\s+of|based\s+on|because\s+of|due\s+to)\b", re.IGNORECASE)
VERBS = re.compile(r"\b(?:make|shorten|shorter|condense|concise|trim|cut|tighten|remove|drop|delete|omit|mention|add|"
                   r"include|note|state|rewrite|rephrase|reword|expand|update|change|replace|simplify|fix|edit|"
                   r"clarify|improve|summari[sz]e)\b", re.IGNORECASE)
SHORTER = re.compile(r"\b(shorter|shorten|condense|concise|trim|cut|tighten)\b", re.IGNORECASE)
CLAUSE_END = r"(?=\s+(?:and|then|but)\s+|[,.;!]|\Z)"
# What to mention runs to the end of the sentence: "the ARR, the tier and the renewal"
# (split into its facts by `_facts`, up to a clause asking for something else).
MENTION = re.compile(r"\b(?:mention|add|include|note|state)\s+(.{1,200}?)(?=[.;!?]|\Z)", re.IGNORECASE)
ARTICLE = re.compile(r"^(?:the|its|their|a|an|also)\s+", re.IGNORECASE)
REMOVE = re.compile(r"\b(?:remove|drop|delete|omit)\s+(?:the\s+|any\s+|every\s+)?(?:sentences?|lines?|bullets?|"
                    r"parts?|mentions?|points?)?\s*(?:about|on|of|mentioning|that\s+mention)\s+(?:the\s+)?(.{1,80}?)"
                    + CLAUSE_END, re.IGNORECASE)
WHERE = re.compile(r"\s+(?:from|in|of|to|into)\s+(?:the\s+)?(?:" + NAMES.pattern[3:-3] + r")(?:\s+sections?)?\s*\Z",
                   re.IGNORECASE)
FILLER = re.compile(r"\b(?:sections?|to|in|into|the|of|a|an)\b", re.IGNORECASE)
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
BULLET = re.compile(r"^\s*(?:[-*+]|\d{1,2}[.)])\s+")
UNDERSTOOD = ("without a model the rule editor understands: name the section (e.g. \"the risks section\") "
              "and ask to make it shorter, to remove the sentences about some words, or to mention the renewal, "
              "the ARR, the tier, the owner, the industry, the employees or a usage metric by name")


class EditRefused(Exception):
    """The instruction asks for what this editor cannot do (the reason says what it can)."""


class InvalidEdit(EditRefused):
    """The model's edit did not validate, even after a repair round."""

    def __init__(self, problems: str):
        super().__init__(f"the model's edit is not valid: {problems}")


class SectionText(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    text: str


class UpdateReport(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    sections: list[SectionText]


def _plain(instruction: str) -> str:
    """Typographic apostrophes as typed on phones and Macs ("don’t") read as plain ones."""
    return instruction.replace("\u2019", "'").replace("\u2018", "'")


def named(instruction: str) -> list[str]:
    """The sections the instruction asks to change, in the order it names them, each once.
    A section counts when its clause asks for a change (an editing verb) before any keep
    word ("leave the risks as I wrote them", "don't touch the summary") or word of context
    ("… given the situation"); a clause that names sections without a verb lends them to the
    next clause that has a verb and names none ("the summary is too long; cut it") or, after
    one, takes its verb ("shorten the risks, and the summary too")."""
    found: list[str] = []
    pending: list[str] = []
    asked = False
    for clause in CLAUSES.split(_plain(instruction)):
        stops = [found.start() for found in (KEEP.search(clause), CONTEXT.search(clause)) if found]
        active = clause[:min(stops)] if stops else clause
        names = [ALIASES[m.group(1).casefold()] for m in NAMES.finditer(active)]
        if VERBS.search(active):
            found += names or pending
            pending, asked = [], True
        elif names:
            if asked and active == clause:
                found += names
            else:
                pending = names
    return list(dict.fromkeys(found))


# --- the rule editor ----------------------------------------------------------------------------


def _units(text: str) -> tuple[list[str], str]:
    """The section as units to keep or drop: its bullet lines (or table rows), else its
    sentences; and how to join them again."""
    lines = [line for line in text.splitlines() if line.strip()]
    if any(BULLET.match(line) or line.lstrip().startswith("|") for line in lines):
        return lines, "\n"
    return [s for s in SENTENCE.split(text.strip()) if s], " "


def shorter(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and all(line.lstrip().startswith("|") for line in lines):  # a table: its header, half its rows
        head, rows = lines[:2], lines[2:]
        if len(rows) < 2:
            raise EditRefused("the table has one row: nothing to shorten")
        return "\n".join(head + rows[:math.ceil(len(rows) / 2)])
    units, joiner = _units(text)
    if len(units) < 2:
        raise EditRefused("the section is one sentence: nothing to shorten without a model")
    return joiner.join(units[:math.ceil(len(units) / 2)])


def remove(text: str, words: str) -> str:
    units, joiner = _units(text)
    kept = [u for u in units if words.casefold() not in u.casefold()]
    if len(kept) == len(units):
        raise EditRefused(f"no sentence of the section mentions {words!r}")
    if not kept or all(u.lstrip().startswith("|") for u in kept) and len(kept) <= 2:
        raise EditRefused(f"every sentence of the section mentions {words!r}: it would be left empty")
    return joiner.join(kept)


# Words that name no metric in particular ("the account's usage per month").
GENERIC = frozenset({"the", "and", "account", "accounts", "usage", "used", "use", "per", "month", "monthly",
                     "total", "number", "count", "plan", "limit", "limits", "current"})


def _metric(account: ev.Account, what: str) -> ev.Metric | None:
    """The usage metric `what` names by its distinctive words ("storage size" → storage)."""
    words = set(re.findall(r"[a-z]{3,}", what.casefold())) - GENERIC
    scored = [(len(words & set(re.findall(r"[a-z]{3,}", f"{m.metric} {m.unit}".casefold()))), m) for m in account.usage]
    best = max(scored, key=lambda pair: pair[0], default=(0, None))
    return best[1] if best[0] else None


# What "mention WHAT" may add: the words that ask for it, what the account holds of it (None
# or empty: nothing on record), and the sentence that states it, as the data has it.
FACTS: tuple[tuple[tuple[str, ...], str, Callable[[ev.Account], Any], Callable[[ev.Account], str]], ...] = (
    (("renew", "contract end"), "renewal date", lambda a: a.renewal_date,
     lambda a: f"The renewal is on {a.renewal_date}."),
    # ARR 0 is none given (a pasted text without one), not a real ARR.
    (("arr", "revenue", "contract value"), "ARR", lambda a: a.arr, lambda a: f"ARR is {number(a.arr)} {a.currency}."),
    (("tier", "plan"), "tier", lambda a: a.tier, lambda a: f"The account is on the {a.tier} tier."),
    (("owner", "account manager"), "owner", lambda a: a.owner, lambda a: f"The account manager is {a.owner}."),
    (("industry", "sector"), "industry", lambda a: a.industry, lambda a: f"The customer works in {a.industry}."),
    (("employee", "headcount", "size"), "employee count", lambda a: a.employees,
     lambda a: f"The customer has {number(a.employees)} employees."),
)


def _asks_for(key: str, words: tuple[str, ...]) -> bool:
    # At a word's start: "renew" in "renewal", never "arr" in "carrier" nor "size" in "batch_size".
    return any(re.search(rf"(?<![a-z0-9_]){re.escape(w)}", key) for w in words)


def fact(inputs: ev.ReportInputs, what: str) -> str:
    """One sentence of the account data about `what`, or EditRefused."""
    account, key = inputs.account, what.casefold()
    if (metric := _metric(account, what)) is not None:
        return _metric_sentence(metric)
    for words, name, held, sentence in FACTS:
        if _asks_for(key, words):
            if held(account) in (None, "", 0):
                raise EditRefused(f"the account has no {name} on record")
            return sentence(account)
    raise EditRefused(f"nothing in the account data matches {what!r}")


def _metric_sentence(metric: ev.Metric) -> str:
    unit = f" {metric.unit}" if metric.unit else ""
    if metric.limit is not None:
        return f"{metric.metric}: {number(metric.current)} of {number(metric.limit)}{unit}."
    return f"{metric.metric}: {number(metric.current)}{unit}."


def mention(text: str, sentence: str) -> str:
    if sentence in text:
        return text
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and lines[-1].lstrip().startswith("|"):  # after a table: a paragraph of its own
        return f"{text.rstrip()}\n\n{sentence}"
    if any(BULLET.match(line) for line in lines):
        return text.rstrip() + f"\n- {sentence}"
    return f"{text.rstrip()} {sentence}".strip()


def _without_place(words: str) -> str:
    """"comparable from the risks section" → "comparable": the clause's words, not where."""
    return WHERE.sub("", words).strip()


def _facts(phrase: str) -> list[str]:
    """The facts a "mention …" phrase lists ("the ARR and the renewal in the summary" → ARR,
    renewal), up to a part asking for something else ("… then shorten the risks"); a part
    naming a section only ("add to the risks section") is no fact."""
    out = []
    for part in re.split(r"\s*,\s*(?:and\s+)?|\s+(?:and|&|then)\s+", phrase.strip()):
        if VERBS.search(part) or KEEP.search(part):
            break
        part = ARTICLE.sub("", _without_place(part).strip())
        if FILLER.sub("", NAMES.sub("", part)).strip():
            out.append(part)
    return out


def by_rule(sections: dict[str, str], instruction: str, inputs: ev.ReportInputs) -> dict[str, str]:
    """The sections the instruction names, changed as it asks (EditRefused: it cannot be done)."""
    instruction = _plain(instruction)
    targets = named(instruction)
    if not targets:
        raise EditRefused(f"the instruction names no section; {UNDERSTOOD}")
    wants_shorter = bool(SHORTER.search(instruction))
    removals = [_without_place(m.group(1)) for m in REMOVE.finditer(instruction)]
    mentions = [what for m in MENTION.finditer(instruction) for what in _facts(m.group(1))]
    if not (wants_shorter or removals or mentions):
        raise EditRefused(UNDERSTOOD)
    changes: dict[str, str] = {}
    for name in targets:
        if name not in sections:
            raise EditRefused(f"the report has no {name} section")
        text = sections[name]
        if wants_shorter:
            text = shorter(text)
        for words in removals:
            text = remove(text, words)
        for what in mentions:
            text = mention(text, fact(inputs, what))
        if text != sections[name]:
            changes[name] = text
    if not changes:
        raise EditRefused("the instruction changes nothing in the sections it names")
    return changes


# --- with a model -------------------------------------------------------------------------------


def problems(reply: UpdateReport) -> list[str]:
    names = [account_reports.canonical(s.name) or s.name for s in reply.sections]
    found = [f"{s.name!r} is not a section of the report" for s in reply.sections
             if account_reports.canonical(s.name) is None]
    found += [f"{n} is given more than once" for n in dict.fromkeys(names) if names.count(n) > 1]
    found += [f"{s.name} has no text" for s in reply.sections if not s.text.strip()]
    if not reply.sections:
        found.append("no section changed")
    return found


async def with_llm(llm: LLMClient, site_name: str, data: str, sections: dict[str, str], hand_edited: list[str],
                   instruction: str, record: Recorder) -> dict[str, str]:
    """The sections the model changed (validated), or msgspec / LLM errors, EditRefused."""
    report = "\n\n".join(f"## {name}\n\n{text}" for name, text in sections.items())
    hand = ", ".join(hand_edited) or "none"
    messages = [system("report_editor", site_name),
                {"role": "user", "content": f"Account data:\n{data}\n\nThe report:\n{report}\n\n"
                                            f"Sections written by hand: {hand}\n\nInstruction: {instruction}"}]
    reply = await validated(llm, record, messages, UpdateReport, problems, "edit",
                            "Give each changed section once, by its exact name, in full.", InvalidEdit)
    return {account_reports.canonical(s.name): s.text.strip() for s in reply.sections}


def keep_hand_edits(changes: dict[str, str], hand_edited: list[str], instruction: str
                    ) -> tuple[dict[str, str], list[str]]:
    """(the changes to apply, the hand-edited sections left as they are): a hand edit changes
    only when the instruction names its section."""
    asked_for = set(named(instruction))
    ignored = [name for name in changes if name in hand_edited and name not in asked_for]
    return {n: t for n, t in changes.items() if n not in ignored}, ignored
