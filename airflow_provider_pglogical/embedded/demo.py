"""The embedded end-to-end demo: local PostgreSQL → Airflow DAGs → Spark local → local Iceberg.

    python -m airflow_provider_pglogical.embedded.demo [--ticks 3] [--keep] [--lakehouse local|s3|rest]

1. starts a throwaway PostgreSQL 15 on loopback and loads a demo schema (a row filter, a column
   list, a partitioned table, arrays, jsonb, TOAST-sized values);
2. runs ``pglogical_lakehouse_sync`` with ``airflow dags test``: publication, slot, initial
   snapshot, first apply, then the Iceberg housekeeping (00:00 is one of its 6-hourly runs; the
   later ticks skip it);
3. for each tick: a seeded workload (inserts, updates that cross the row filter, TOAST left
   untouched, deletes, a key change), then the DAG again (slot-lag sensor, pull, apply);
4. runs ``pglogical_backfill`` for one table while the slot keeps its position;
5. verifies the lakehouse against the source and prints a summary.

``--lakehouse s3`` runs the same flow on the production shape (``demo_lakehouse.py``): the warehouse
on a local S3 server, Iceberg's JDBC catalog in the demo's PostgreSQL; staging on the same bucket.
``--lakehouse rest`` does it on Iceberg's REST catalog (its test fixture on loopback, OAuth2 client
credentials) with the warehouse on the same S3 server through Iceberg's S3FileIO.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from airflow_provider_pglogical.embedded import demo_lakehouse
from airflow_provider_pglogical.embedded.postgres import LocalPostgres

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"

SCHEMA = """
CREATE TABLE customers(
    id int PRIMARY KEY, name text NOT NULL, email text, bio text, vip bool DEFAULT false,
    created_at timestamptz DEFAULT now());
CREATE TABLE orders(
    id bigint NOT NULL, customer_id int, region text NOT NULL, status text, total numeric(12,2),
    created_at timestamptz DEFAULT now(), note text, internal_note text);
-- The row filter reads region, so the replica identity must cover it.
CREATE UNIQUE INDEX orders_id_region ON orders(id, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_id_region;
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE products(
    sku text PRIMARY KEY, name text, price numeric(10,2), cost numeric(10,2), tags text[], attributes jsonb);
CREATE TABLE events(
    id bigint NOT NULL, day date NOT NULL, kind text, payload jsonb, PRIMARY KEY (id, day)) PARTITION BY RANGE (day);
CREATE TABLE events_2026_h1 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2026-07-01');
CREATE TABLE events_2026_h2 PARTITION OF events FOR VALUES FROM ('2026-07-01') TO ('2027-01-01');
"""

REGIONS = ["EU", "US", "APAC"]


def big_text(rng: random.Random, size: int = 4000) -> str:
    """Text that PostgreSQL stores out of line (TOAST): over 2 kB even after compression."""
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ") for _ in range(size))


def load(pg: LocalPostgres, db: str, rng: random.Random) -> None:
    pg.execute(SCHEMA, dbname=db)
    conn = pg.connect(db)
    with conn.cursor() as cur:
        for i in range(1, 201):
            cur.execute("INSERT INTO customers(id, name, email, bio) VALUES (%s, %s, %s, %s)",
                        (i, f"Customer {i}", f"c{i}@example.com", big_text(rng) if i % 10 == 0 else f"bio {i}"))
        for i in range(1, 1001):
            cur.execute(
                "INSERT INTO orders(id, customer_id, region, status, total, note, internal_note) "
                "VALUES (%s, %s, %s, 'new', %s, %s, 'secret')",
                (i, rng.randint(1, 200), rng.choice(REGIONS), round(rng.uniform(1, 500), 2),
                 big_text(rng) if i % 25 == 0 else None),
            )
        for i in range(1, 51):
            cur.execute("INSERT INTO products VALUES (%s, %s, %s, %s, %s, %s)",
                        (f"SKU-{i:03d}", f"Product {i}", round(rng.uniform(1, 99), 2), 1.00,
                         [f"tag{i % 3}", "demo"], json.dumps({"weight": i, "colour": rng.choice(["red", "blue"])})))
        for i in range(1, 301):
            cur.execute("INSERT INTO events VALUES (%s, %s, %s, %s)",
                        (i, f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}", rng.choice(["view", "buy"]),
                         json.dumps({"n": i})))
    conn.close()


def workload(pg: LocalPostgres, db: str, rng: random.Random, tick: int) -> dict:
    """One tick of application traffic; returns what it did."""
    conn = pg.connect(db)
    done = {"inserts": 0, "updates": 0, "deletes": 0}
    base = 10_000 * tick
    with conn.cursor() as cur:
        for i in range(200):
            cur.execute("INSERT INTO orders(id, customer_id, region, status, total, note) VALUES (%s, %s, %s, 'new', %s, %s)",
                        (base + i, rng.randint(1, 200), rng.choice(REGIONS), round(rng.uniform(1, 500), 2),
                         big_text(rng) if i % 20 == 0 else None))
            done["inserts"] += 1
        # Status changes leave the TOASTed note untouched (pgoutput sends it as unchanged).
        cur.execute("UPDATE orders SET status = 'paid' WHERE id %% 7 = %s AND status = 'new'", (tick,))
        done["updates"] += cur.rowcount
        # Rows moving into and out of the EU filter arrive as INSERT / DELETE.
        cur.execute("UPDATE orders SET region = 'EU' WHERE region = 'US' AND id %% 11 = %s", (tick,))
        done["updates"] += cur.rowcount
        cur.execute("UPDATE orders SET region = 'APAC' WHERE region = 'EU' AND id %% 13 = %s", (tick,))
        done["updates"] += cur.rowcount
        cur.execute("DELETE FROM orders WHERE id %% 17 = %s", (tick,))
        done["deletes"] += cur.rowcount
        cur.execute("UPDATE customers SET vip = NOT vip WHERE id %% 5 = %s", (tick % 5,))
        done["updates"] += cur.rowcount
        cur.execute("UPDATE customers SET id = id + 1000 WHERE id = %s", (tick,))  # a key change
        done["updates"] += cur.rowcount
        cur.execute("UPDATE products SET price = price + 1, tags = tags || %s::text WHERE sku = %s",
                    (f"t{tick}", f"SKU-{tick:03d}"))
        done["updates"] += cur.rowcount
        cur.execute("INSERT INTO events SELECT id + %s, day, kind, payload FROM events WHERE id <= 20", (base,))
        done["inserts"] += cur.rowcount
        cur.execute("DELETE FROM events WHERE id %% 29 = %s", (tick,))
        done["deletes"] += cur.rowcount
    conn.close()
    return done


def airflow_env(home: Path, pg: LocalPostgres, db: str, lakehouse: Mapping[str, str] | None = None) -> dict:
    """The DAGs' environment; ``lakehouse`` (catalog, warehouse, their connections) replaces the
    embedded warehouse under ``home``."""
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_PGLOGICAL_SOURCE": pg.connection_uri(db),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PGLOGICAL_STAGING": (home / "staging").as_uri(),
        "PGLOGICAL_WAREHOUSE": (home / "warehouse").as_uri(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        # the DAGs, and this very package first (not another copy installed in the environment)
        "PYTHONPATH": os.pathsep.join([str(DAGS), str(REPO)]),
        **(lakehouse or {}),
    }
    return env


def airflow(env: dict, *args: str, redact: Sequence[str] = ()) -> None:
    started = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        output = proc.stdout[-20000:]
        for secret in redact:
            output = output.replace(secret, "***")
        print(output)
        raise SystemExit(f"demo: `airflow {' '.join(args)}` failed (exit {proc.returncode})")
    print(f"  airflow {' '.join(args[:3])} … ok ({time.monotonic() - started:.0f}s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the embedded end-to-end demo")
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--home", default=str(REPO / ".airflow-demo"))
    parser.add_argument("--keep", action="store_true", help="keep PostgreSQL and the warehouse afterwards")
    parser.add_argument("--ui", type=int, nargs="?", const=8080, default=None, metavar="PORT",
                        help="then serve Airflow's UI with the pipeline view on 127.0.0.1:PORT (8080) until Ctrl-C")
    parser.add_argument("--lakehouse", choices=demo_lakehouse.LAKEHOUSES, default="local",
                        help="local: a Hadoop catalog on a local directory (default); s3: the warehouse on a "
                             "local S3 server, Iceberg's JDBC catalog in the demo's PostgreSQL; rest: the warehouse "
                             "on a local S3 server through S3FileIO, Iceberg's REST catalog on loopback")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        demo_lakehouse.check(args.lakehouse)
    except RuntimeError as error:  # nothing is started or removed yet
        raise SystemExit(f"demo: --lakehouse {args.lakehouse}: {error}") from None
    rng = random.Random(args.seed)
    home = Path(args.home)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    pg = LocalPostgres(name="demo", keep=args.keep).start()
    lakehouse = None
    try:
        db = "shop"
        pg.create_database(db)
        print(f"PostgreSQL {pg.query('SHOW server_version')[0][0]} on 127.0.0.1:{pg.port}; loading the demo schema")
        load(pg, db, rng)
        lakehouse = (demo_lakehouse.s3_lakehouse(pg) if args.lakehouse == "s3"
                     else demo_lakehouse.rest_lakehouse(home) if args.lakehouse == "rest"
                     else demo_lakehouse.local_lakehouse(home))
        print(f"lakehouse: {lakehouse.where}")
        env = airflow_env(home, pg, db, lakehouse.env)
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AIRFLOW", "PGLOGICAL", "SPARK"))})

        def run(*command: str) -> None:
            airflow(env, *command, redact=lakehouse.redact)

        run("db", "migrate")
        print("initial sync and first apply")
        run("dags", "test", "pglogical_lakehouse_sync", "2026-01-01T00:00:00+00:00")
        activity = []
        for tick in range(1, args.ticks + 1):
            activity.append(workload(pg, db, rng, tick))
            print(f"tick {tick}: {activity[-1]}")
            run("dags", "test", "pglogical_lakehouse_sync", f"2026-01-01T00:{10 * tick:02d}:00+00:00")
        print("backfill of public.customers while the slot keeps flowing")
        workload(pg, db, rng, args.ticks + 1)
        run("dags", "test", "pglogical_backfill", "2026-01-02T00:00:00+00:00",
            "--conf", json.dumps({"table": "public.customers"}))
        run("dags", "test", "pglogical_lakehouse_sync", "2026-01-02T00:10:00+00:00")
        print("verify")
        result = verify(env)
        summary(pg, db, env, result, activity, time.monotonic() - started, lakehouse)
        if args.ui is not None:
            serve_ui(env, args.ui)
        else:
            print("  pipeline view: run the demo with --ui, then Browse -> Replication pipelines in Airflow's UI at "
                  "http://127.0.0.1:8080/ (docs/ui.md)")
        return 0 if result["equal"] else 1
    finally:
        if lakehouse is not None:
            lakehouse.close(keep=args.keep)
        if not args.keep:
            pg.stop()


def serve_ui(env: dict, port: int) -> None:
    """Airflow's API server on loopback with the demo's DAGs and connections, every visitor an
    admin (a throwaway demo: no login), in the foreground until Ctrl-C; PostgreSQL stays up meanwhile."""
    print(f"\npipeline view: open Airflow at http://127.0.0.1:{port}/ (you are logged in as an admin), then Browse -> "
          f"Replication pipelines, or http://127.0.0.1:{port}/pglogical/ in the same browser; Ctrl-C stops it")
    ui_env = {**env, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}
    try:
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "api-server", "--host", "127.0.0.1",
                        "--port", str(port)], env=ui_env, check=False)
    except KeyboardInterrupt:
        pass


def verify(env: dict) -> dict:
    sys.path.insert(0, str(DAGS))
    import pglogical_settings as settings

    from airflow_provider_pglogical.verification.witness import verify_pipeline

    # The lakehouse and paths of this run's environment: the settings module may have been imported
    # earlier (e.g. by a DagBag parse) with other values.
    return verify_pipeline(
        postgres_conn_id=settings.SOURCE_CONN_ID, publications=[settings.PUBLICATION],
        staging_path=env["PGLOGICAL_STAGING"], pipeline=settings.PIPELINE,
        iceberg=settings.iceberg_config(env), report=lambda message: None,
    )


def summary(pg: LocalPostgres, db: str, env: dict, result: dict, activity: list[dict], seconds: float,
            lakehouse: demo_lakehouse.DemoLakehouse | None = None) -> None:
    from airflow.sdk import ObjectStoragePath

    import pglogical_settings as settings
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from airflow_provider_pglogical.staging.layout import committed_batches

    batches = committed_batches(ObjectStoragePath(env["PGLOGICAL_STAGING"]), settings.PIPELINE)
    slot = PgLogicalHook(postgres_conn_id=settings.SOURCE_CONN_ID).get_slot(settings.SLOT)
    print("\n==== summary ====")
    for table in result["tables"]:
        print(f"  {table['table']:<20} source {table['source_rows']:>6,} rows   lakehouse {table['target_rows']:>6,} rows"
              f"   {'equal' if table['equal'] else 'DIFFERENT'}")
    kinds = {kind: sum(1 for b in batches if b[3] == kind) for kind in ("snapshot", "changes")}
    print(f"  batches: {kinds['snapshot']} snapshot, {kinds['changes']} change; "
          f"LSNs {batches[0][1]} .. {max(b[2] for b in batches)}")
    print(f"  slot {settings.SLOT}: confirmed {slot.confirmed_flush_lsn}, lag {slot.lag_bytes:,} bytes, "
          f"retained WAL {slot.retained_wal_bytes:,} bytes")
    print(f"  workload: {sum(a['inserts'] for a in activity)} inserts, {sum(a['updates'] for a in activity)} updates, "
          f"{sum(a['deletes'] for a in activity)} deletes over {len(activity)} ticks")
    if lakehouse is not None:
        print(f"  lakehouse: {lakehouse.describe()}")
    print(f"  verify: {'PASSED' if result['equal'] else 'FAILED'} (source at LSN {result['source_lsn']})")
    if not result["equal"]:
        print(result["summary"])
    print(f"  time: {seconds:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
