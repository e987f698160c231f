"""Who labels: the team of a labelling session, its tokens, and how several answers to one item
become its gold.

A session without a team is one person (the name "", the page's one token) and behaves as it always
did. With one, each annotator and reviewer has a personal token (kept in the store: the same address
every start) and every answer records who gave it. `overlap` K: an item counts as labelled once K
different annotators answered it, for the first `overlap_share` of the items (by the order their
first answers came in: item i is doubly labelled when fewer than share × (i + 1) of the items before
it were, so the share holds at every moment, whatever the order people work in); the rest need one
answer. A reviewer's answer is final; else the gold is the majority of the answers, else (a tie) no
gold, counted as such (`Consensus`).

Invariants: names are unique across roles and safe to print and to use as a column name; a token is
compared in constant time against every member's (`member_of` never stops at the first match); an
item's overlap need is a pure function of the store's order of first answers (no extra state).
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections import Counter
from pathlib import Path

from ..errors import FieldError
from ..web.guard import matches

ROLES = ("annotator", "reviewer")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
"""A member's name: letters, digits, `_ . @ -`, up to 64 characters (it names a column of the export)."""


@dataclasses.dataclass(frozen=True)
class Member:
    """One person of the team, as the page's guard knows them."""

    name: str
    """"" for the session without a team (its one person)."""
    role: str
    """"annotator" or "reviewer"."""
    token: str


@dataclasses.dataclass(frozen=True)
class TeamSpec:
    """The team a session is started with (`--annotators`, `--reviewers`, `--overlap`,
    `--overlap-share`); empty annotators: one person, as without a team."""

    annotators: tuple[str, ...] = ()
    reviewers: tuple[str, ...] = ()
    overlap: int = 1
    """How many different annotators answer an item of the overlap share."""
    overlap_share: float | None = None
    """The share of items answered `overlap` times (None: all of them when overlap > 1)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "annotators", tuple(self.annotators))
        object.__setattr__(self, "reviewers", tuple(self.reviewers))
        for field, names in (("annotators", self.annotators), ("reviewers", self.reviewers)):
            for name in names:
                if not isinstance(name, str) or not NAME.fullmatch(name):
                    raise FieldError(field, "{field}: {value} is not a name (letters, digits, _ . @ -, up to 64 "
                                     "characters, starting with a letter or digit)", value=repr(name))
        seen = Counter([*self.annotators, *self.reviewers])
        twice = [name for name, count in seen.items() if count > 1]
        if twice:
            raise FieldError("annotators", "{field}: {value} is named twice (a person has one role)",
                             value=twice[0])
        if self.reviewers and not self.annotators:
            raise FieldError("reviewers", "{field} review annotators' answers: give --annotators too")
        if not isinstance(self.overlap, int) or self.overlap < 1:
            raise FieldError("overlap", "{field} must be a positive number of annotators, got {value}",
                             value=self.overlap)
        if self.overlap > max(1, len(self.annotators)):
            raise FieldError("overlap", "{field} {value} needs that many annotators; --annotators names "
                             f"{len(self.annotators)}", value=self.overlap)
        if self.overlap_share is not None and not 0 < self.overlap_share <= 1:
            raise FieldError("overlap_share", "{field} must be in (0, 1], got {value}", value=self.overlap_share)

    @property
    def share(self) -> float:
        """The share of items answered `overlap` times."""
        return 1.0 if self.overlap_share is None else float(self.overlap_share)

    def as_dict(self) -> dict:
        return {"annotators": list(self.annotators), "reviewers": list(self.reviewers), "overlap": self.overlap,
                "overlap_share": self.share}


def read_names(value: str | None) -> tuple[str, ...]:
    """`--annotators alice,bob` or a file of names (one per line, `#` comments): the names, in order."""
    if not value:
        return ()
    path = Path(value)
    text = path.read_text(encoding="utf-8") if path.is_file() else value.replace(",", "\n")
    return tuple(line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip())


class Team:
    """The members with their tokens, and the overlap rule (see the module docstring)."""

    def __init__(self, members: tuple[Member, ...], spec: TeamSpec):
        self.members, self.spec = members, spec
        self.annotators = tuple(m.name for m in members if m.role == "annotator")
        self.reviewers = tuple(m.name for m in members if m.role == "reviewer")

    @classmethod
    def alone(cls, token: str) -> Team:
        """The session without a team: one person, who may do everything."""
        return cls((Member("", "annotator", token),), TeamSpec())

    @classmethod
    def of(cls, spec: TeamSpec, kept: dict[str, dict]) -> Team:
        """The team of `spec`, each member with the token `kept` (the store's) has for them, or a new one."""
        members = []
        for role, names in (("annotator", spec.annotators), ("reviewer", spec.reviewers)):
            for name in names:
                old = kept.get(name) or {}
                members.append(Member(name, role, old.get("token") or secrets.token_urlsafe(16)))
        return cls(tuple(members), spec)

    @property
    def is_team(self) -> bool:
        return bool(self.spec.annotators)

    def kept(self) -> dict[str, dict]:
        """What the store keeps: {name: {"role", "token"}}."""
        return {m.name: {"role": m.role, "token": m.token} for m in self.members}

    def member_of(self, token: str | None) -> Member | None:
        """The member whose token `token` is (compared with every member's, in constant time)."""
        found = None
        for member in self.members:  # every one compared: the time says nothing of which matched
            if matches(token, member.token.encode()):
                found = member
        return found

    def needs(self, order: list[int]) -> dict[int, int]:
        """{item: answers it needs} for items in the order their first answers came in (see the
        module docstring): `overlap` for the overlap share, else 1."""
        k, share = self.spec.overlap, self.spec.share
        out, doubled = {}, 0
        for i, item in enumerate(order):
            if k > 1 and doubled < share * (i + 1) - 1e-9:
                out[item], doubled = k, doubled + 1
            else:
                out[item] = 1
        return out


@dataclasses.dataclass(frozen=True)
class Consensus:
    """An item's gold from its answers: `gold` (None: no gold yet), and `status`: "open" (fewer
    answers than it needs), "reviewed", "unanimous", "majority" or "tie"."""

    gold: object
    status: str

    @property
    def disputed(self) -> bool:
        """Annotators gave different answers and no reviewer has decided."""
        return self.status in ("majority", "tie")


def consensus(answers: list, needed: int, reviewed=None) -> Consensus:
    """The gold of an item answered `answers` (hashable values, one per annotator) that needs
    `needed`, and `reviewed` (a reviewer's answer, or None)."""
    if reviewed is not None:
        return Consensus(reviewed, "reviewed")
    if len(answers) < needed or not answers:
        return Consensus(None, "open")
    counts = Counter(answers).most_common()
    if len(counts) == 1:
        return Consensus(counts[0][0], "unanimous")
    if counts[0][1] > counts[1][1]:
        return Consensus(counts[0][0], "majority")
    return Consensus(None, "tie")

