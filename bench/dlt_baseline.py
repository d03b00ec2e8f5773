"""dlt's sql_database source into local Parquet (run by bench_snapshot.py in dlt's own venv)."""

import os
import sys

import dlt
from dlt.sources.sql_database import sql_table

backend, out = sys.argv[1:3]
uri = os.environ["DLT_SOURCE_URI"].replace("postgres://", "postgresql+psycopg2://", 1)
pipeline = dlt.pipeline(pipeline_name=f"bench_{backend}", destination=dlt.destinations.filesystem(f"file://{out}"),
                        dataset_name="bench", pipelines_dir=f"{out}/.dlt")
source = sql_table(credentials=uri, table="bench", backend=backend, chunk_size=100_000)
info = pipeline.run(source, loader_file_format="parquet")
info.raise_on_failed_jobs()
