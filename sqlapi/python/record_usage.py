#!/usr/bin/env python3
"""Record usage through aurora's SQL API from Python (psycopg 3), in the
application's own transaction.

    python3 record_usage.py postgres://postgres@127.0.0.1:5432/mydb

It creates a table app_orders (the application's own fact), then:
  1. commits an order and its usage in one transaction,
  2. rolls back a second order and its usage (neither exists afterwards),
  3. makes a bad call (a negative quantity) and reports the named error.
It prints one JSON object with what happened.
"""
import datetime
import json
import sys

import psycopg


def main(dsn):
    now = datetime.datetime.now(datetime.timezone.utc)
    out = {}
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS app_orders (id text PRIMARY KEY, tenant text NOT NULL, units bigint NOT NULL)")
        conn.commit()

        # 1. The order and its usage commit together.
        with conn.transaction():
            conn.execute("INSERT INTO app_orders (id, tenant, units) VALUES (%s, %s, %s)", ("order-1", "org_py", 3))
            item_id, key, state, created = conn.execute(
                "SELECT item_id, idempotency_key, state, created FROM aurora.record_usage(%s, %s, %s, %s, %s)",
                ("org_py", "order-1", "api_calls", 3, now),
            ).fetchone()
        out["committed"] = {"event_id": "order-1", "item_id": item_id, "idempotency_key": key, "state": state, "created": created}

        # 2. The twin rolls back: neither the order nor its usage exists.
        try:
            with conn.transaction():
                conn.execute("INSERT INTO app_orders (id, tenant, units) VALUES (%s, %s, %s)", ("order-2", "org_py", 5))
                conn.execute("SELECT aurora.record_usage(%s, %s, %s, %s, %s)", ("org_py", "order-2", "api_calls", 5, now))
                raise Rollback()
        except Rollback:
            pass
        out["rolled_back"] = {"event_id": "order-2"}

        # 3. A bad call: a named error (SQLSTATE, column, message); the
        # transaction it ran in is aborted, so it runs in its own.
        try:
            with conn.transaction():
                conn.execute("SELECT aurora.record_usage(%s, %s, %s, %s, %s)", ("org_py", "order-3", "api_calls", -1, now))
            out["bad_call"] = {"error": None}
        except psycopg.Error as e:
            out["bad_call"] = {"sqlstate": e.sqlstate, "column": e.diag.column_name, "message": e.diag.message_primary}
    json.dump(out, sys.stdout)
    print()


class Rollback(Exception):
    pass


if __name__ == "__main__":
    main(sys.argv[1])
