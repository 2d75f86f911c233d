"""The example's trusted tool: read-only SQL over the orders database (`make_data.py`).

Declared in whale.toml as `runtime.tools.sql`; whale imports it in its tools process, outside
the harness's jail, and a harness calls it as `env.tools.sql(query)` through the broker (which
checks the argument, counts the calls and records each one on the trajectory).

The database is $WHALE_BYO_DATA/orders.db where that is set (the tools process inherits
whale's environment), else data/orders.db beside this file. Read-only four ways: the file is
opened with SQLite's `mode=ro`, the connection is `query_only`, an authorizer allows reading
and nothing else (no ATTACH, PRAGMA, writes or schema changes), and only one statement that
starts with SELECT or WITH is run. A query is also cut off after TIME_S seconds and its
values at LENGTH_LIMIT bytes, and the result is capped at MAX_ROWS rows and MAX_CHARS
characters.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

MAX_ROWS = 50  # rows returned; more are cut and `truncated` is set
MAX_CELL_CHARS = 200  # of one value's text
MAX_CHARS = 4000  # of all the values' text together
MAX_QUERY_CHARS = 4000
TIME_S = 2.0  # a query running longer is interrupted
LENGTH_LIMIT = 1_000_000  # bytes of any one string or blob a query may build

_ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}
_DENIED_FUNCTIONS = {"load_extension"}  # off in Python's sqlite3 anyway
_COMMENT = re.compile(r"--[^\n]*|/\*.*?(\*/|$)", re.S)


def db_path() -> Path:
    """Where the database is: $WHALE_BYO_DATA/orders.db, else data/orders.db beside this file."""
    folder = os.environ.get("WHALE_BYO_DATA")
    return (Path(folder) if folder else Path(__file__).resolve().parent / "data") / "orders.db"


def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None,
               trigger: str | None) -> int:  # fmt: skip
    if action not in _ALLOWED:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _cell(value: Any) -> Any:
    """A value as JSON data: bytes as hex, infinite floats as text, long text cut."""
    if isinstance(value, bytes):
        value = "x'" + value[: MAX_CELL_CHARS // 2].hex() + "'"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str) and len(value) > MAX_CELL_CHARS:
        return value[:MAX_CELL_CHARS] + "..."
    return value


def check_query(query: str) -> str:
    """The query to run, or ValueError saying why it is refused."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError("the query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"the query is over {MAX_QUERY_CHARS} characters")
    text = query.strip().rstrip(";").strip()
    head = _COMMENT.sub(" ", text).lstrip().split(None, 1)
    if not head or head[0].upper() not in ("SELECT", "WITH"):
        raise ValueError("only a single SELECT statement is allowed")
    if not sqlite3.complete_statement(text + "\n;") or ";" in _COMMENT.sub(" ", _strings(text)):
        raise ValueError("only a single SELECT statement is allowed (one statement, no ';' "
                         "inside)")  # fmt: skip
    return text


def _strings(text: str) -> str:
    """`text` with its quoted strings and identifiers blanked (a ';' in them is no statement
    break)."""
    return re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]", "''", text)


def sql(query: str) -> dict:
    """Run one read-only SQLite SELECT on the shop's orders database; returns {"columns",
    "rows", "truncated"}. Tables: customers(id, name, city), products(id, name, category,
    list_price), orders(id, customer_id, product_id, quantity, unit_price, order_date as
    'YYYY-MM-DD'). Revenue is quantity * unit_price. At most 50 rows are returned.

    Anything but one SELECT (or WITH ... SELECT) statement is refused with an error, and so
    is a query that runs past TIME_S seconds.
    """
    text = check_query(query)
    path = db_path()
    if not path.is_file():
        raise FileNotFoundError(f"no database at {path}: run examples/byo/make_data.py")
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=TIME_S)
    try:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, LENGTH_LIMIT)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.execute("PRAGMA query_only = ON")
        conn.set_authorizer(_authorize)
        deadline = time.monotonic() + TIME_S
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            cur = conn.execute(text)
            rows = cur.fetchmany(MAX_ROWS + 1)
        except sqlite3.DatabaseError as e:
            if "interrupted" in str(e):
                raise TimeoutError(f"the query ran past {TIME_S:g} s") from None
            raise ValueError(f"SQL error: {e}") from None
        columns = [d[0] for d in cur.description or ()]
    finally:
        conn.close()
    truncated = len(rows) > MAX_ROWS
    out: list[list[Any]] = []
    chars = 0
    for row in rows[:MAX_ROWS]:
        cells = [_cell(v) for v in row]
        chars += sum(len(str(c)) for c in cells)
        if chars > MAX_CHARS:
            truncated = True
            break
        out.append(cells)
    return {"columns": columns, "rows": out, "truncated": truncated}
