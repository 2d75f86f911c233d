"""Generate the example's data: a SQLite database of made-up orders and questions over it.

    .venv/bin/python examples/byo/make_data.py                  # into examples/byo/data/
    .venv/bin/python examples/byo/make_data.py --out DIR --seed 0 --questions 60

Writes DIR/orders.db (customers, products, orders) and DIR/questions.jsonl, one question a
line: {"id", "question", "answer", "kind", "params"}, the answer computed by SQL on the
database just written. The same seed writes the same data. DIR defaults to $WHALE_BYO_DATA,
else the data/ folder beside this script (git-ignored: generated data is never committed).
Everything here is made up; any likeness to a real shop is chance.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DB_NAME, QUESTIONS_NAME = "orders.db", "questions.jsonl"

FIRST = ["Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John", "Margaret",
         "Niklaus", "Radia", "Ken", "Sophie", "Tim", "Hedy", "Claude"]  # fmt: skip
LAST = ["Lovelace", "Hopper", "Liskov", "Knuth", "Allen", "Backus", "Hamilton", "Wirth",
        "Perlman", "Thompson", "Wilson", "Lamarr", "Shannon", "Ritchie"]  # fmt: skip
CITIES = ["Lisbon", "Oslo", "Porto", "Turin", "Lyon", "Graz"]
PRODUCTS = [  # name, category, list price
    ("widget", "hardware", 4.50), ("gadget", "hardware", 12.00), ("sprocket", "hardware", 2.75),
    ("gizmo", "electronics", 24.99), ("doohickey", "electronics", 8.40),
    ("thingamajig", "electronics", 15.25), ("notebook", "stationery", 3.20),
    ("pen", "stationery", 1.10), ("stapler", "stationery", 9.95), ("mug", "kitchen", 6.50),
    ("kettle", "kitchen", 29.00), ("teapot", "kitchen", 18.60),
]  # fmt: skip
MONTHS = ["January", "February", "March", "April", "May", "June"]  # of 2026
N_CUSTOMERS, N_ORDERS = 24, 360
START = date(2026, 1, 1)
DAYS = (date(2026, 7, 1) - START).days

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, city TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
                       category TEXT NOT NULL, list_price REAL NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY,
                     customer_id INTEGER NOT NULL REFERENCES customers(id),
                     product_id INTEGER NOT NULL REFERENCES products(id),
                     quantity INTEGER NOT NULL, unit_price REAL NOT NULL,
                     order_date TEXT NOT NULL);
"""


def build_db(path: Path, rng: random.Random) -> None:
    """Write the database: customers in cities, products with list prices, and orders whose
    unit price is the list price or, for about one in six, 10% off."""
    names: list[str] = []
    while len(names) < N_CUSTOMERS:
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        if name not in names:
            names.append(name)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO customers VALUES (?, ?, ?)",
                         [(i + 1, n, rng.choice(CITIES)) for i, n in enumerate(names)])  # fmt: skip
        conn.executemany("INSERT INTO products VALUES (?, ?, ?, ?)",
                         [(i + 1, *p) for i, p in enumerate(PRODUCTS)])  # fmt: skip
        weights = [rng.uniform(0.3, 3.0) for _ in names]  # some customers order more
        rows = []
        for i in range(N_ORDERS):
            customer = rng.choices(range(1, N_CUSTOMERS + 1), weights)[0]
            product = rng.randrange(len(PRODUCTS))
            price = PRODUCTS[product][2]
            if rng.random() < 1 / 6:
                price = round(price * 0.9, 2)
            day = START + timedelta(days=rng.randrange(DAYS))
            rows.append((i + 1, customer, product + 1, rng.randint(1, 9), price, day.isoformat()))
        rows.sort(key=lambda r: (r[5], r[0]))  # ids in date order, as a shop would number them
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)",
                         [(i + 1, *r[1:]) for i, r in enumerate(rows)])  # fmt: skip
        conn.commit()
    finally:
        conn.close()


def _one(conn: sqlite3.Connection, query: str, *args: Any) -> Any:
    return conn.execute(query, args).fetchone()[0]


def _month(m: str) -> str:
    return f"2026-{MONTHS.index(m) + 1:02d}"


# Each kind: (question template, how to draw its parameters, how SQL answers it). An answer of
# None (nothing to ask about) or a tie (two top products) is not asked.
def _orders_in_month(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    return _one(conn, "SELECT COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer_id "
                "WHERE c.name = ? AND substr(o.order_date, 1, 7) = ?", p["customer"],
                _month(p["month"]))  # fmt: skip


def _product_revenue(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    return _one(conn, "SELECT ROUND(SUM(o.quantity * o.unit_price), 2) FROM orders o JOIN "
                "products p ON p.id = o.product_id WHERE p.name = ?", p["product"])  # fmt: skip


def _units_in_month(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    return _one(conn, "SELECT COALESCE(SUM(o.quantity), 0) FROM orders o JOIN products p "
                "ON p.id = o.product_id WHERE p.name = ? AND substr(o.order_date, 1, 7) = ?",
                p["product"], _month(p["month"]))  # fmt: skip


def _customers_in_city(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    return _one(conn, "SELECT COUNT(*) FROM customers WHERE city = ?", p["city"])


def _customer_spend(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    return _one(conn, "SELECT ROUND(SUM(o.quantity * o.unit_price), 2) FROM orders o JOIN "
                "customers c ON c.id = o.customer_id WHERE c.name = ?", p["customer"])  # fmt: skip


def _list_price(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    return _one(conn, "SELECT list_price FROM products WHERE name = ?", p["product"])


def _top_product(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    rows = conn.execute("SELECT p.name, SUM(o.quantity) AS units FROM orders o JOIN products p "
                        "ON p.id = o.product_id WHERE substr(o.order_date, 1, 7) = ? "
                        "GROUP BY p.name ORDER BY units DESC LIMIT 2",
                        (_month(p["month"]),)).fetchall()  # fmt: skip
    if not rows or (len(rows) == 2 and rows[0][1] == rows[1][1]):
        return None
    return rows[0][0]


def _first_order(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    return _one(conn, "SELECT MIN(o.order_date) FROM orders o JOIN customers c "
                "ON c.id = o.customer_id WHERE c.name = ?", p["customer"])  # fmt: skip


def _distinct_buyers(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    return _one(conn, "SELECT COUNT(DISTINCT o.customer_id) FROM orders o JOIN products p "
                "ON p.id = o.product_id WHERE p.name = ?", p["product"])  # fmt: skip


def _city_revenue(conn: sqlite3.Connection, p: dict[str, str]) -> Any:
    return _one(conn, "SELECT ROUND(SUM(o.quantity * o.unit_price), 2) FROM orders o JOIN "
                "customers c ON c.id = o.customer_id WHERE c.city = ? AND "
                "substr(o.order_date, 1, 7) = ?", p["city"], _month(p["month"]))  # fmt: skip


Params = Callable[[random.Random, list[str]], dict[str, str]]
KINDS: dict[str, tuple[str, Params, Callable[[sqlite3.Connection, dict[str, str]], Any]]] = {
    "orders_in_month": (
        "How many orders did customer {customer} place in {month} 2026?",
        lambda r, c: {"customer": r.choice(c), "month": r.choice(MONTHS)}, _orders_in_month),
    "product_revenue": (
        "What is the total revenue of product '{product}' (quantity times unit price, over "
        "all its orders)?", lambda r, c: {"product": r.choice(PRODUCTS)[0]}, _product_revenue),
    "units_in_month": (
        "How many units of product '{product}' were sold in {month} 2026?",
        lambda r, c: {"product": r.choice(PRODUCTS)[0], "month": r.choice(MONTHS)},
        _units_in_month),
    "customers_in_city": (
        "How many customers live in {city}?", lambda r, c: {"city": r.choice(CITIES)},
        _customers_in_city),
    "customer_spend": (
        "How much did customer {customer} spend in total, over all their orders?",
        lambda r, c: {"customer": r.choice(c)}, _customer_spend),
    "list_price": (
        "What is the list price of product '{product}'?",
        lambda r, c: {"product": r.choice(PRODUCTS)[0]}, _list_price),
    "top_product": (
        "Which product sold the most units in {month} 2026?",
        lambda r, c: {"month": r.choice(MONTHS)}, _top_product),
    "first_order": (
        "On what date did customer {customer} place their first order? Give the date as "
        "YYYY-MM-DD.", lambda r, c: {"customer": r.choice(c)}, _first_order),
    "distinct_buyers": (
        "How many different customers bought product '{product}'?",
        lambda r, c: {"product": r.choice(PRODUCTS)[0]}, _distinct_buyers),
    "city_revenue": (
        "What was the total revenue from customers in {city} in {month} 2026?",
        lambda r, c: {"city": r.choice(CITIES), "month": r.choice(MONTHS)}, _city_revenue),
}  # fmt: skip


def make_questions(conn: sqlite3.Connection, rng: random.Random, n: int) -> list[dict[str, Any]]:
    """`n` distinct questions, the kinds taken in turn (a kind with nothing new left to ask
    drops out), each answered by its SQL."""
    customers = [r[0] for r in conn.execute("SELECT name FROM customers ORDER BY id")]
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    kinds = list(KINDS)
    turn = 0
    while len(out) < n:
        if not kinds:
            raise ValueError(f"cannot draw {n} distinct questions from this database")
        kind = kinds[turn % len(kinds)]
        template, draw, answer_of = KINDS[kind]
        for _ in range(50):
            params = draw(rng, customers)
            text = template.format(**params)
            answer = answer_of(conn, params)
            if text not in seen and answer is not None:
                break
        else:
            kinds.remove(kind)
            continue
        turn += 1
        seen.add(text)
        out.append({"id": f"q{len(out):03d}", "question": text, "answer": answer, "kind": kind,
                    "params": params})  # fmt: skip
    return out


def generate(out: Path, seed: int = 0, n: int = 60) -> tuple[Path, Path]:
    """Write DIR/orders.db and DIR/questions.jsonl (replacing any there); their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    db, questions = out / DB_NAME, out / QUESTIONS_NAME
    tmp_db, tmp_q = out / f".{DB_NAME}.tmp", out / f".{QUESTIONS_NAME}.tmp"
    tmp_db.unlink(missing_ok=True)
    build_db(tmp_db, rng)
    conn = sqlite3.connect(f"file:{tmp_db}?mode=ro", uri=True)
    try:
        records = make_questions(conn, rng, n)
    finally:
        conn.close()
    tmp_q.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp_db, db)  # a reader never sees a half-written file
    os.replace(tmp_q, questions)
    return db, questions


def default_out() -> Path:
    return Path(os.environ.get("WHALE_BYO_DATA") or HERE / "data")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="folder (default: $WHALE_BYO_DATA, "
                    "else examples/byo/data)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--questions", type=int, default=60)
    args = ap.parse_args(argv)
    if args.questions < 1:
        ap.error("--questions must be at least 1")
    db, questions = generate(args.out or default_out(), args.seed, args.questions)
    print(f"wrote {db} and {questions} ({args.questions} questions, seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
