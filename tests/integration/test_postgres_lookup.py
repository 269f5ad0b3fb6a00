"""``PostgresLookup`` against the session's real PostgreSQL server: one query per batch of keys, a pool per
instance, rows as dicts, errors that follow ``on_error``."""

from __future__ import annotations

import re
import socket

import pytest

import streamlet as sl
from tests.support.postgres import sql

CUSTOMERS = [(1, "Ada Lovelace", "gold"), (2, "Bob Kahn", "silver"), (3, "Cy Young", "gold")]
ORDERS = [(1, 30), (9, 5), (2, 12), (1, 7), (3, 1), (9, 2)] * 50  # (customer id, amount): one batch


@pytest.fixture
def customers(postgres_dsn: str) -> str:
    """A customers table (id, name, tier) with three rows; the database's DSN."""
    sql(postgres_dsn, "CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, tier text NOT NULL)")
    for row in CUSTOMERS:
        sql(postgres_dsn, "INSERT INTO customers VALUES ($1, $2, $3)", *row)
    return postgres_dsn


def orders(lookup: sl.PostgresLookup, **options: object) -> sl.Topology:
    """Orders (customer id, amount) -> lookup_join 'customer' -> CollectSink 'out'."""
    topology = sl.Topology("orders")
    source = topology.add_source("orders", ORDERS)
    joined = topology.lookup_join("customer", lookup, **options).set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    return topology


def test_a_left_lookup_join_enriches_every_order_from_the_table(customers: str) -> None:
    """Each order gets its customer's row as a dict; the unknown customer 9 gets None; order kept."""
    lookup = sl.PostgresLookup(customers, "SELECT id, name, tier FROM customers", key="id")
    result = sl.run(orders(lookup, how="left"))
    rows = {id_: {"id": id_, "name": name, "tier": tier} for id_, name, tier in CUSTOMERS}
    expected = [(key, (amount, rows.get(key))) for key, amount in ORDERS]
    assert [(r.key, r.value) for r in result.sink("out")] == expected
    statistics = result.statistics.nodes["customer"]
    assert (statistics.lookups, statistics.cache_hits) == (1, 0)  # one query for the batch's 4 distinct keys


def test_inner_with_two_instances_and_fn_keeps_each_keys_order(customers: str) -> None:
    """parallelism=2 (a pool per instance), inner, fn: customer 9 dropped, each key's orders in order."""
    lookup = sl.PostgresLookup(customers, "SELECT id, name, tier FROM customers WHERE tier = 'gold'", key="id")

    def label(key: int, amount: int, row: dict[str, object]) -> str:
        return f"{row['name']}: {amount}"

    result = sl.run(orders(lookup, fn=label, parallelism=2, cache_size=0))
    by_key: dict[int, list[str]] = {}
    for record in result.sink("out"):
        by_key.setdefault(record.key, []).append(record.value)
    assert by_key == {1: ["Ada Lovelace: 30", "Ada Lovelace: 7"] * 50, 3: ["Cy Young: 1"] * 50}


async def test_the_lookup_called_directly_answers_the_keys_it_has(customers: str) -> None:
    lookup = sl.PostgresLookup(customers, "SELECT id, name FROM customers", key="id")
    assert await lookup([3, 4, 1]) == {3: {"id": 3, "name": "Cy Young"}, 1: {"id": 1, "name": "Ada Lovelace"}}


def test_an_unknown_column_fails_the_lookup_naming_it(customers: str) -> None:
    """A key column the query lacks: the server refuses the statement; on_error='fail' names it."""
    lookup = sl.PostgresLookup(customers, "SELECT id, name FROM customers", key="customer_id")
    with pytest.raises(sl.TaskError, match=re.escape("column streamlet_lookup.customer_id does not exist")):
        sl.run(orders(lookup))


def test_a_key_with_two_rows_is_a_lookup_error_that_skip_dead_letters(customers: str) -> None:
    """Rows that repeat a key cannot be told apart: the batch's records are dead letters under skip."""
    lookup = sl.PostgresLookup(customers, "SELECT tier AS id, name FROM customers", key="id")
    topology = sl.Topology("tiers")
    source = topology.add_source("s", [("gold", 1), ("silver", 2)])
    joined = topology.lookup_join("tier", lookup, on_error="skip").set_input(source, partitioning=sl.SAME_KEY)
    topology.add_sink("out", sl.CollectSink()).set_input(joined)
    result = sl.run(topology)
    assert result.sink("out") == []
    assert [(d.record.key, d.error) for d in result.dead_letters] == [
        (key, "ConnectorError: PostgresLookup 'SELECT tier AS id, name FROM customers': key 'gold' has more than one "
         "row (column 'id' must be unique among the query's rows)") for key in ("gold", "silver")
    ]  # fmt: skip


def test_postgres_lookup_refuses_an_empty_query_and_a_bound_that_is_no_time() -> None:
    with pytest.raises(
        ValueError, match=r"^PostgresLookup: query must be a SELECT statement or a table name, got ' '$"
    ):
        sl.PostgresLookup("postgresql://x", " ", key="id")
    with pytest.raises(ValueError, match=r"^PostgresLookup: reconnect_within must be seconds above 0, got 0$"):
        sl.PostgresLookup("postgresql://x", "users", key="id", reconnect_within=0)


async def test_a_table_name_is_a_query_of_all_its_rows(customers: str) -> None:
    """'customers' as PostgresSource takes it (before: a SQL syntax error)."""
    lookup = sl.PostgresLookup(customers, "customers", key="id")
    assert await lookup([2]) == {2: {"id": 2, "name": "Bob Kahn", "tier": "silver"}}


def test_a_database_out_of_reach_fails_the_join_naming_it_the_database_and_the_bound() -> None:
    """Nothing listens at the DSN's port: after reconnect_within (0.5 s here, tried again meanwhile) the job fails
    with a TaskError naming the join and its instance, the database (password masked) and the cause (before: a
    bare ConnectionRefusedError after 30 s, naming neither)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        dsn = f"postgresql://app:S3cret@127.0.0.1:{port}/shop"
        lookup = sl.PostgresLookup(dsn, "customers", key="id", reconnect_within=0.5)
        with pytest.raises(sl.TaskError) as failed:
            sl.run(orders(lookup))
    assert re.fullmatch(
        rf"task 'customer' instance 0 could not open its lookup: ConnectorError: PostgresLookup 'customers': "
        rf"PostgreSQL at postgresql://app:\*\*\*@127\.0\.0\.1:{port}/shop not reachable within 0\.5 s: "
        r"ConnectionRefusedError: .*",
        str(failed.value),
    ), str(failed.value)
    assert "S3cret" not in str(failed.value)
