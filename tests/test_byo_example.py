"""examples/byo/, the bring-your-own example: its data generator, grader, read-only sql tool,
seed harness and config, then (a model test) run.py end to end on the embedded models."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import whale
from tests.conftest import require_model
from whale import grading
from whale.evaluation import EvalConfig
from whale.harness import Budget, Runtime
from whale.harness.contract import run_contract_fault
from whale.harness.tools import parse_tools
from whale.harness.tools.spec import describe_callable
from whale.metaharness.run import SearchConfig
from whale.models.base import Completion
from whale.revise.run import AdaptConfig
from whale.tasks import check_disjoint, split

ROOT = Path(__file__).resolve().parents[1]
BYO = ROOT / "examples" / "byo"
sys.path.insert(0, str(BYO))
import grader as byo_grader  # noqa: E402
import make_data  # noqa: E402
import tools as byo_tools  # noqa: E402

MONTH = {m: f"2026-{i:02d}" for i, m in enumerate(make_data.MONTHS, 1)}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("byo-data")
    make_data.generate(out)
    return out


@pytest.fixture
def db(data, monkeypatch) -> Path:
    """The sql tool reads the generated database (as the tools process does, by the env)."""
    monkeypatch.setenv("WHALE_BYO_DATA", str(data))
    return data / "orders.db"


def records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "questions.jsonl").read_text().splitlines()]


def dump(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


# --- make_data.py -------------------------------------------------------------------------------


def test_make_data_is_deterministic_and_the_seed_changes_it(data, tmp_path):
    again = make_data.generate(tmp_path / "again")
    assert again[1].read_bytes() == (data / "questions.jsonl").read_bytes()
    assert dump(again[0]) == dump(data / "orders.db")
    other = make_data.generate(tmp_path / "other", seed=1)
    assert other[1].read_bytes() != again[1].read_bytes()
    assert dump(other[0]) != dump(again[0])


def test_make_data_writes_a_few_hundred_rows_and_sixty_distinct_questions(data):
    conn = sqlite3.connect(data / "orders.db")
    try:
        counts = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                  for t in ("customers", "products", "orders")}  # fmt: skip
    finally:
        conn.close()
    assert counts == {"customers": 24, "products": 12, "orders": 360}
    rs = records(data)
    assert len(rs) == 60
    assert len({r["id"] for r in rs}) == 60 and len({r["question"] for r in rs}) == 60
    assert {r["kind"] for r in rs} == set(make_data.KINDS)


# The test's own SQL for each kind, written apart from make_data.py's: a wrong reference in the
# generator (a join, a month, a rounding) shows here.
def expected(conn: sqlite3.Connection, kind: str, p: dict[str, str]) -> Any:
    def one(q: str, *a: Any) -> Any:
        return conn.execute(q, a).fetchone()[0]

    cust = "(SELECT id FROM customers WHERE name = ?)"
    prod = "(SELECT id FROM products WHERE name = ?)"
    month = "order_date LIKE ? || '-%'"
    if kind == "orders_in_month":
        return one(f"SELECT COUNT(*) FROM orders WHERE customer_id = {cust} AND {month}",
                   p["customer"], MONTH[p["month"]])  # fmt: skip
    if kind == "product_revenue":
        return one(f"SELECT SUM(quantity * unit_price) FROM orders WHERE product_id = {prod}",
                   p["product"])  # fmt: skip
    if kind == "units_in_month":
        return one(f"SELECT TOTAL(quantity) FROM orders WHERE product_id = {prod} AND {month}",
                   p["product"], MONTH[p["month"]])  # fmt: skip
    if kind == "customers_in_city":
        return one("SELECT COUNT(*) FROM customers WHERE city = ?", p["city"])
    if kind == "customer_spend":
        return one(f"SELECT SUM(quantity * unit_price) FROM orders WHERE customer_id = {cust}",
                   p["customer"])  # fmt: skip
    if kind == "list_price":
        return one("SELECT list_price FROM products WHERE name = ?", p["product"])
    if kind == "top_product":
        units: dict[str, int] = {}
        for name, q in conn.execute(f"SELECT p.name, o.quantity FROM orders o, products p "
                                    f"WHERE p.id = o.product_id AND {month}",
                                    (MONTH[p["month"]],)):  # fmt: skip
            units[name] = units.get(name, 0) + q
        best = max(units.values())
        assert list(units.values()).count(best) == 1, "a tie was asked"
        return max(units, key=units.__getitem__)
    if kind == "first_order":
        return one(f"SELECT order_date FROM orders WHERE customer_id = {cust} "
                   "ORDER BY order_date LIMIT 1", p["customer"])  # fmt: skip
    if kind == "distinct_buyers":
        return len(conn.execute(f"SELECT customer_id FROM orders WHERE product_id = {prod} "
                                "GROUP BY customer_id", (p["product"],)).fetchall())  # fmt: skip
    if kind == "city_revenue":
        return one("SELECT SUM(o.quantity * o.unit_price) FROM orders o, customers c WHERE "
                   f"c.id = o.customer_id AND c.city = ? AND o.{month}", p["city"],
                   MONTH[p["month"]])  # fmt: skip
    raise AssertionError(kind)


def test_every_reference_answer_is_what_sql_says(data):
    conn = sqlite3.connect(data / "orders.db")
    try:
        for r in records(data):
            want = expected(conn, r["kind"], r["params"])
            for value in r["params"].values():
                assert value in r["question"], r
            if isinstance(want, float):
                assert r["answer"] == pytest.approx(want, abs=0.005), r
                assert round(r["answer"], 2) == r["answer"], r  # to the cent
            else:
                assert r["answer"] == want and type(r["answer"]) is type(want), r
    finally:
        conn.close()


def test_the_task_loads_from_the_config_and_splits_into_dev_and_held_out(data):
    cfg = tomllib.loads((BYO / "whale.toml").read_text())
    task = whale.load_task(f"jsonl:{data / 'questions.jsonl'}", size=60,
                           config=cfg["task"]["config"])  # fmt: skip
    questions = task.questions()
    assert len(questions) == 60 and "env.tools.sql" in task.description
    parts = split(questions, {"dev": 20, "eval": 40}, random.Random(0))
    check_disjoint(parts)
    assert len(parts["dev"]) == 20 and len(parts["eval"]) == 40


# --- grader.py ----------------------------------------------------------------------------------

ACCEPT = [("$1,234.50", 1234.5), ("1234.5", 1234.5), ("Answer: 1234.50 USD", 1234.5),
          ("**12**", 12), ("12.", 12), ("1234.51", 1234.5), ("€ 8.40", 8.4), ("-3", -3),
          ("Teapot.", "teapot"), ("Answer: teapot", "teapot"), ("2026-01-07", "2026-01-07"),
          ("`2026-01-07`", "2026-01-07"), ("1,000", 1000)]  # fmt: skip
REJECT = [("about 1234", 1234), ("1234.5 or 1240", 1234.5), ("12 orders", 12),
          ("1234.52", 1234.5), ("the teapot", "teapot"), ("", 0), ("9" * 50, 1), ("1e5", 100000),
          ("nan", 1), ("inf", 1), ("1,23", 123), ("2026-01-08", "2026-01-07"),
          ("__import__('os').getpid()", 1), ("6*2", 12), ("{'a': 1}", 1)]  # fmt: skip


@pytest.mark.parametrize("answer, reference", ACCEPT)
def test_the_grader_accepts_the_answer(answer, reference):
    assert byo_grader.grade("q", answer, reference) == 1.0


@pytest.mark.parametrize("answer, reference", REJECT)
def test_the_grader_rejects_the_answer(answer, reference):
    assert byo_grader.grade("q", answer, reference) == 0.0


def test_the_grader_never_evaluates_the_answer():
    """Its source calls no eval/exec/compile/__import__ and imports the standard library only
    (the grading jail holds this one file)."""
    tree = ast.parse((BYO / "grader.py").read_text())
    called = {n.func.id for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}  # fmt: skip
    assert not called & {"eval", "exec", "compile", "__import__"}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_the_grader_runs_in_whales_grading_jail(data):
    """As a run grades: out of process (the default for `py:` graders), right and wrong."""
    cfg = tomllib.loads((BYO / "whale.toml").read_text())["task"]["config"]
    cfg = {**cfg, "grader": {**cfg["grader"], "name": f"py:{BYO / 'grader.py'}:grade"}}
    task = whale.load_task(f"jsonl:{data / 'questions.jsonl'}", size=60, config=cfg)
    try:
        q = next(q for q in task.questions() if isinstance(q.reference, float))
        right = f"${q.reference:,.2f}"
        assert task.jailed_grading(q, right) is not None  # not graded in this process
        assert grading.grade(task, q, right).correct
        assert not grading.grade(task, q, f"{q.reference + 1:.2f}").correct
    finally:
        grading.close_all()


# --- tools.py: the read-only sql tool --------------------------------------------------------


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_sql_tool_answers_a_select(db):
    got = byo_tools.sql("SELECT COUNT(*) AS n FROM orders;")
    assert got == {"columns": ["n"], "rows": [[360]], "truncated": False}
    got = byo_tools.sql("WITH t AS (SELECT city FROM customers) SELECT COUNT(DISTINCT city) FROM t")
    assert got["rows"][0][0] <= len(make_data.CITIES)
    assert byo_tools.sql("SELECT ';' AS x -- a comment")["rows"] == [[";"]]


REFUSED = [
    "DELETE FROM orders", "UPDATE orders SET quantity = 0", "INSERT INTO customers VALUES "
    "(99, 'x', 'y')", "DROP TABLE orders", "CREATE TABLE t (x)",
    "SELECT 1; DELETE FROM orders", "SELECT 1; SELECT 2", "ATTACH DATABASE ':memory:' AS m",
    "PRAGMA writable_schema = ON", "PRAGMA table_info(orders)",
    "SELECT * FROM pragma_table_info('orders')", "WITH x AS (SELECT 1) DELETE FROM orders",
    "SELECT load_extension('/tmp/x')", "VACUUM INTO '/tmp/copy.db'", "", "   ",
    "/* SELECT */ DELETE FROM orders", "REPLACE INTO customers VALUES (1, 'x', 'y')",
]  # fmt: skip


@pytest.mark.parametrize("query", REFUSED)
def test_the_sql_tool_refuses_all_but_one_select_and_never_writes(db, query):
    before = digest(db)
    with pytest.raises(ValueError):
        byo_tools.sql(query)
    assert digest(db) == before


def test_the_database_is_opened_read_only_beneath_the_query_check(db, monkeypatch):
    """With the text check out of the way, the connection itself still refuses to write."""
    before = digest(db)
    monkeypatch.setattr(byo_tools, "check_query", lambda q: q)
    for query in ("DELETE FROM orders", "ATTACH DATABASE ':memory:' AS m", "PRAGMA query_only=0"):
        with pytest.raises(ValueError, match="SQL error"):
            byo_tools.sql(query)
    assert digest(db) == before


def test_the_sql_tool_caps_rows_characters_and_time(db, monkeypatch):
    got = byo_tools.sql("SELECT * FROM orders")
    assert len(got["rows"]) == byo_tools.MAX_ROWS and got["truncated"]
    wide = byo_tools.sql("SELECT group_concat(customers.name, ', ') FROM customers, products")
    assert len(wide["rows"][0][0]) <= byo_tools.MAX_CELL_CHARS + 3
    chars = byo_tools.sql("SELECT o.id, c.name, p.name, o.order_date FROM orders o, customers c, "
                          "products p WHERE c.id = o.customer_id AND p.id = o.product_id")  # fmt: skip
    assert chars["truncated"] and sum(len(str(v)) for r in chars["rows"] for v in r) <= 4000
    with pytest.raises(ValueError, match="too big"):
        byo_tools.sql("SELECT zeroblob(100000000)")
    monkeypatch.setattr(byo_tools, "TIME_S", 0.3)
    with pytest.raises(TimeoutError):
        byo_tools.sql("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                      "SELECT COUNT(*) FROM c")  # fmt: skip
    assert json.dumps(byo_tools.sql("SELECT 1e999, x'00ff'"), allow_nan=False)


def test_the_sql_tool_says_where_the_database_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("WHALE_BYO_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make_data.py"):
        byo_tools.sql("SELECT 1")


def test_the_proposer_reads_the_tools_signature_and_tables():
    spec = describe_callable("sql", byo_tools.sql, 8, 10)
    line = spec.describe()
    assert line.startswith("- `env.tools.sql(query: str) -> dict`")
    for table in ("customers(", "products(", "orders("):
        assert table in spec.doc


# --- the seed harness, through the real jail, broker and tools process -------------------------

SEED = (BYO / "seed_harness.py").read_text()


def test_the_seed_harness_keeps_the_run_contract():
    assert run_contract_fault(SEED) is None
    ast.parse(SEED)


class RepeatingSolver:
    """A test double of the 0.5B solver as measured: it calls sql, then calls it again with
    the same query once the result is in, then (no tools offered) answers from the result."""

    name = "repeating-solver"

    def __init__(self, query: str) -> None:
        self.query = query
        self.sent: list[tuple[list[dict[str, Any]], Any]] = []

    def chat(self, messages, sampling, timeout=None):
        self.sent.append((messages, sampling))
        if sampling.tools is None:
            found = re.search(r"Result: (\{.*\})", messages[-1]["content"])
            value = json.loads(found.group(1))["rows"][0][0] if found else "unknown"
            return Completion(f"Answer: {value}", "stop")
        call = {"id": "x", "name": "sql", "arguments": json.dumps({"query": self.query})}
        return Completion("", "tool_calls", tool_calls=[call])


class ChattySolver:
    """Calls no tool: the harness answers from its text."""

    name = "chatty-solver"

    def chat(self, messages, sampling, timeout=None):
        return Completion("I think there are\nAnswer: 7", "stop")


def seed_run(model: Any, monkeypatch, data: Path):
    monkeypatch.setenv("WHALE_BYO_DATA", str(data))
    tools = tomllib.loads((BYO / "whale.toml").read_text())["runtime"]["tools"]
    rt = Runtime(model=model, budget=Budget(run_timeout_s=60), tools=parse_tools(tools))
    try:
        return rt.run(SEED, "How many customers live in Lyon?", "q")
    finally:
        rt.close()


def test_the_seed_harness_runs_the_tool_loop(data, monkeypatch):
    model = RepeatingSolver("SELECT COUNT(*) FROM customers WHERE city = 'Lyon'")
    t = seed_run(model, monkeypatch, data)
    conn = sqlite3.connect(data / "orders.db")
    lyon = conn.execute("SELECT COUNT(*) FROM customers WHERE city = 'Lyon'").fetchone()[0]
    conn.close()
    assert t.status == "ok" and t.answer == str(lyon), (t.error, t.answer)
    tool_events = [e for e in t.events if e["kind"] == "tool"]
    assert [e["name"] for e in tool_events] == ["sql", "sql"]
    assert tool_events[0]["result"]["rows"] == [[lyon]]
    assert len(model.sent) == 3  # call, the same call again (the loop stops), the answer
    second = model.sent[1][0]
    assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"]
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "call_0_0"


def test_a_refused_query_goes_back_to_the_model_as_an_error(data, monkeypatch):
    model = RepeatingSolver("DELETE FROM customers")
    t = seed_run(model, monkeypatch, data)
    tool_events = [e for e in t.events if e["kind"] == "tool"]
    assert tool_events and "only a single SELECT" in tool_events[0]["error"]
    assert model.sent[1][0][-1]["content"].startswith("error: ")


def test_the_seed_harness_answers_from_the_text_without_a_tool_call(data, monkeypatch):
    t = seed_run(ChattySolver(), monkeypatch, data)
    assert t.status == "ok" and t.answer == "7"
    assert not [e for e in t.events if e["kind"] == "tool"]


# --- the config and run.py ----------------------------------------------------------------------


def test_one_config_serves_eval_adapt_and_search():
    from whale import config as cfgmod

    path = BYO / "whale.toml"
    for cls in (EvalConfig, AdaptConfig, SearchConfig):
        cfg = cfgmod.load(cls, path, [])
        assert cfg.harness == "examples/byo/seed_harness.py"
        assert cfg.runtime.tools["sql"]["function"] == "examples.byo.tools:sql"
    for rel in ("examples/byo/seed_harness.py", "examples/byo/grader.py"):
        assert (ROOT / rel).is_file()


def test_run_py_calls_the_api_as_it_is_and_overrides_keys_the_config_has():
    source = (BYO / "run.py").read_text()
    tree = ast.parse(source)
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id == "whale"}  # fmt: skip
    assert {"evaluate", "adapt", "search"} <= names <= set(whale.__all__)
    paths = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", "") == "PATHS")  # fmt: skip
    assert isinstance(paths, ast.Dict)
    cfg = tomllib.loads((BYO / "whale.toml").read_text())
    for key in paths.keys:
        node: Any = cfg
        for part in ast.literal_eval(key).split("."):  # type: ignore[arg-type]
            node = node[part]  # a key the config does not have would be a new setting


def test_generated_data_is_git_ignored():
    assert "/examples/byo/data/" in (ROOT / ".gitignore").read_text().splitlines()


# --- end to end, on the embedded models ---------------------------------------------------------


@pytest.mark.model
@pytest.mark.slow
def test_the_byo_example_runs_on_the_embedded_models_and_resumes(tmp_path):
    """examples/byo/run.py at its small budget: the 0.5B solver calls the sql tool, the seed
    is evaluated, adapted and searched (135M proposer), and a second start resumes each run
    and pays for nothing (but the new evaluate)."""
    require_model("qwen-coder-0.5b")
    require_model("smollm2-135m")
    env = {**os.environ, "WHALE_EXAMPLE_SMALL": "1", "WHALE_EXAMPLE_OUT": str(tmp_path / "runs"),
           "WHALE_BYO_DATA": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}  # fmt: skip
    for start in range(2):
        r = subprocess.run([sys.executable, str(BYO / "run.py")], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=1200)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        assert re.search(r"^seed: \d+/3 ", r.stdout, re.M), r.stdout
        adapt = re.search(r"^adapt: \d+/3 .* -> \d+/3 .* paid (\d+)$", r.stdout, re.M)
        search = re.search(r"^search: \d+/3 .* -> \d+/3 .* paid (\d+)$", r.stdout, re.M)
        assert adapt and search, r.stdout
        if start == 1:
            assert adapt.group(1) == "0" and search.group(1) == "0", r.stdout
        assert "resumed adapt paid 0 rollouts" in r.stdout
    assert (tmp_path / "data" / "orders.db").is_file()
    runs = tmp_path / "runs"
    for name in ("byo-adapt", "byo-search"):
        assert json.loads((runs / name / "summary.json").read_text())
    assert (runs / "byo-search" / "archive").is_dir()
    evals = sorted(runs.glob("byo-eval-*"))
    assert len(evals) == 2
    events = [e for line in (evals[0] / "trajectories.jsonl").read_text().splitlines()
              for e in json.loads(line)["events"]]  # fmt: skip
    sql = [e for e in events if e["kind"] == "tool" and e["name"] == "sql"]
    assert sql and any("result" in e and e.get("error") is None for e in sql), events


def test_the_examples_readme_links_resolve_and_names_its_files():
    from tests.test_readme import relative_links

    readme = BYO / "README.md"
    assert [t for t in relative_links(readme) if not (BYO / t).resolve().is_file()] == []
    text = readme.read_text()
    for f in ("make_data.py", "grader.py", "tools.py", "seed_harness.py", "whale.toml", "run.py"):
        assert f"`{f}`" in text and (BYO / f).is_file()
