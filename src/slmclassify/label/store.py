"""Where a labelling session keeps its answers: one SQLite file in WAL mode with synchronous=FULL.

Invariants: every call that changes the store has committed (and SQLite has fsynced the WAL) when
it returns, so killing the process (`kill -9`) at any point loses no answer that was acknowledged;
the store records the fingerprint it was created for (task, model, input, sample) and refuses to
be opened for another, naming the keys that differ; answers are kept as an append-only list of
events (answer, skip), and undo marks the latest live event as undone in one statement, so an undo
of a changed answer brings back the one before it. Every event records who gave it (`who`: a team
member's name, "" for the session without a team, `team.py`); what one person's answers are, their
undo and their row versions are theirs alone. Each row has a version per person (`row_version`: it
changes with every answer, skip or undo of that person's on the row); an answer or skip that names
the version it was made on is refused with `StaleAnswer` when it changed since (another tab).
A store of schema 1 (before teams) is upgraded in place on open: its events are the person "".
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

from ..errors import InputError, TaskError

SCHEMA = 2


class StaleAnswer(TaskError):
    """An answer or skip made on a version of the row that is no longer current."""


class LabelStore:
    """Answers and skips, keyed by input row and a hash of the row's text."""

    def __init__(self, conn: sqlite3.Connection, path: Path, fingerprint: dict):
        self._conn = conn
        self._lock = threading.Lock()  # one connection shared by the page's and the refit's threads
        self.path = path
        self.fingerprint = fingerprint

    @classmethod
    def open(cls, path: str | Path, fingerprint: dict) -> LabelStore:
        """Open (or create) the store at `path` for `fingerprint` (a JSON-able dict).

        Raises TaskError when the store was created for another fingerprint, naming what differs.
        """
        path = Path(path)
        if path.is_dir():
            raise InputError(f"label store {path} is a folder; give a file name such as labels.sqlite")
        if not path.parent.is_dir():
            raise InputError(f"the folder of label store {path} does not exist; create it or give another path")
        if path.is_file() and path.stat().st_size == 0:  # SQLite would take it over as a new store
            raise InputError(f"{path} is an empty file, not a label store; give another --store path, or delete it "
                             "to start a new store there")
        try:
            conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                         "row INTEGER NOT NULL, text_hash TEXT NOT NULL, label TEXT, kind TEXT NOT NULL DEFAULT '', "
                         "undone INTEGER NOT NULL DEFAULT 0, at REAL NOT NULL, who TEXT NOT NULL DEFAULT '')")
            stored = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if stored.get("schema") == "1":  # before teams: every event is the one person's ("")
                with conn:
                    conn.execute("BEGIN IMMEDIATE")
                    if "who" not in {row[1] for row in conn.execute("PRAGMA table_info(events)")}:
                        conn.execute("ALTER TABLE events ADD COLUMN who TEXT NOT NULL DEFAULT ''")
                    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA),))
                stored["schema"] = str(SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{path} is not a label store ({exc}); give another --store path") from None
        wanted = json.loads(json.dumps(fingerprint))  # tuples → lists, as they come back from JSON
        if not stored:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT INTO meta VALUES (?, ?)",
                                 [("schema", str(SCHEMA)), ("fingerprint", json.dumps(wanted, sort_keys=True))])
        else:
            if stored.get("schema") != str(SCHEMA):
                conn.close()
                raise InputError(f"{path}: label store schema {stored.get('schema')}, this version reads {SCHEMA}")
            recorded = json.loads(stored["fingerprint"])
            differs = _differences(recorded, wanted)
            if differs:
                conn.close()
                raise TaskError(f"label store {path} was started for another run ({', '.join(differs)} differ"
                                f"{_detail(recorded, wanted, differs)}); use the same input, task, model and "
                                "sample, or another --store path")
        return cls(conn, path, wanted)

    def answer(self, row: int, text_hash: str, label: str, kind: str = "", version: int | None = None,
               who: str = "") -> None:
        """Record `who`'s `label` for `row` (replacing their earlier answer or skip of that row); `kind`:
        why the row was offered (`Pick.kind`), which decides whether it counts in the accuracy estimate;
        `version`: the row's version the answer was made on (`StaleAnswer` if it changed since)."""
        if not isinstance(label, str) or not label:
            raise TaskError(f"an answer needs a label name, got {label!r}")
        self._append(row, text_hash, label, kind, version, who)

    def skip(self, row: int, text_hash: str, version: int | None = None, who: str = "") -> None:
        """Record that `who` skipped `row` (it is not offered to them again, and has no label of theirs)."""
        self._append(row, text_hash, None, version=version, who=who)

    def row_version(self, row: int, who: str = "") -> int:
        """`who`'s version of the row: their events for it plus undos of them (0: never answered)."""
        with self._lock:
            return self._version_of(int(row), who)

    def team(self) -> dict:
        """The team kept by `save_team` ({name: {"role", "token"}}; empty: none)."""
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'team'").fetchone()
        return json.loads(row[0]) if row else {}

    def save_team(self, members: dict) -> None:
        """Keep the team's names, roles and tokens, so that each person's address stays the same."""
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('team', ?)", (json.dumps(members, sort_keys=True),))

    def save_page_address(self, port: int, token: str) -> None:
        """Keep the page's port and token, so that the next start serves the same URL."""
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                   [("page_port", str(int(port))), ("page_token", str(token))])

    @staticmethod
    def page_address(path: str | Path) -> tuple[int, str] | None:
        """The (port, token) a store's last page served, or None (no store, or never served)."""
        path = Path(path)
        if not path.is_file() or path.stat().st_size == 0:
            return None
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('page_port', 'page_token')"))
            finally:
                conn.close()
            return (int(meta["page_port"]), meta["page_token"]) if len(meta) == 2 else None
        except (sqlite3.DatabaseError, KeyError, ValueError):
            return None

    def versions(self) -> dict[tuple[int, str], int]:
        """{(row, who): `row_version`} of every row and person with an event."""
        with self._lock:
            rows = self._conn.execute("SELECT row, who, COUNT(*) + COALESCE(SUM(undone), 0) FROM events "
                                      "GROUP BY row, who").fetchall()
        return {(int(row), who): int(v) for row, who, v in rows}

    def _version_of(self, row: int, who: str = "") -> int:
        count, undone = self._conn.execute("SELECT COUNT(*), COALESCE(SUM(undone), 0) FROM events WHERE row = ? "
                                           "AND who = ?", (row, who)).fetchone()
        return int(count) + int(undone)

    def undo(self, who: str = "") -> int | None:
        """Remove `who`'s latest answer or skip still in force; its row, or None when there is none."""
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            last = self._conn.execute("SELECT seq, row FROM events WHERE undone = 0 AND who = ? ORDER BY seq DESC "
                                      "LIMIT 1", (who,)).fetchone()
            if last is None:
                return None
            self._conn.execute("UPDATE events SET undone = 1 WHERE seq = ?", (last[0],))
            return int(last[1])

    def everyone(self) -> dict[tuple[int, str], tuple[str | None, str, int]]:
        """{(row, who): (label or None for a skip, kind, seq)} of each row's latest live event of each
        person, in one query: what the answers, skips, kinds and the pages' histories are read from."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT e.row, e.who, e.label, e.kind, e.seq FROM events e JOIN (SELECT MAX(seq) AS seq FROM events "
                "WHERE undone = 0 GROUP BY row, who) last ON e.seq = last.seq").fetchall()
        return {(int(row), who): (label, kind, int(seq)) for row, who, label, kind, seq in rows}

    def latest(self, who: str = "") -> dict[int, tuple[str | None, str, int]]:
        """{row: (label or None for a skip, kind, seq)} of `who`'s latest live event of each row."""
        return {row: event for (row, person), event in self.everyone().items() if person == who}

    def answers(self, who: str = "") -> dict[int, str]:
        """{row: label} of the rows whose latest live event of `who`'s is an answer."""
        return {row: label for row, (label, _, _) in self.latest(who).items() if label is not None}

    def skipped(self, who: str = "") -> set[int]:
        """Rows whose latest live event of `who`'s is a skip."""
        return {row for row, (label, _, _) in self.latest(who).items() if label is None}

    def hashes(self) -> dict[int, str]:
        """{row: text hash} of every row with a live event (to check the input has not changed)."""
        with self._lock:
            rows = self._conn.execute("SELECT row, text_hash FROM events WHERE undone = 0 ORDER BY seq").fetchall()
        return {int(row): h for row, h in rows}

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _append(self, row: int, text_hash: str, label: str | None, kind: str = "", version: int | None = None,
                who: str = "") -> None:
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            if version is not None and self._version_of(int(row), who) != int(version):
                raise StaleAnswer(f"row {row} was answered, skipped or undone elsewhere (another tab or person) since "
                                  "this page showed it; the page now shows its current state")
            self._conn.execute("INSERT INTO events (row, text_hash, label, kind, at, who) VALUES (?, ?, ?, ?, ?, ?)",
                               (int(row), str(text_hash), label, str(kind), time.time(), str(who)))



def _differences(recorded: dict, wanted: dict, prefix: str = "") -> list[str]:
    """Dotted names of the keys whose values differ (nested dicts compared key by key); a key a store of
    an earlier version did not record ("labels") is not compared."""
    out = []
    for key in sorted(set(recorded) | set(wanted)):
        if not prefix and key == "labels" and key not in recorded:
            continue
        a, b = recorded.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def _detail(recorded: dict, wanted: dict, keys: list[str]) -> str:
    """'; key: A in the store, B here' for up to three short differences."""
    def get(d, dotted):
        for part in dotted.split("."):
            d = d.get(part) if isinstance(d, dict) else None
        return d

    parts = []
    if "labels" in keys:  # the labels a person can act on, rather than the task's hash
        before, now = get(recorded, "labels") or [], get(wanted, "labels") or []
        gone, new = [x for x in before if x not in now], [x for x in now if x not in before]
        words = [f"the store's labels {', '.join(before)}, this task's {', '.join(now)}"]
        if gone or new:
            words = [f"{'only the store has ' + ', '.join(gone) if gone else ''}"
                     f"{'; ' if gone and new else ''}{'only this task has ' + ', '.join(new) if new else ''}"]
        parts += words
        keys = [k for k in keys if k not in ("labels", "task")]
    for key in keys[:3]:
        a, b = repr(get(recorded, key)), repr(get(wanted, key))
        if len(a) <= 40 and len(b) <= 40:
            parts.append(f"{key}: {a} in the store, {b} here")
    return "; " + "; ".join(parts) if parts else ""
