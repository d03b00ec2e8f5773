"""The pipeline view's FastAPI app, mounted by Airflow's API server under :data:`URL_PREFIX`.

``GET /api/pipelines`` is the JSON a person's page and a monitoring system read alike; ``GET /``
is the page. The JSON needs an Airflow login (the API server's own token: the UI's cookie, or
``Authorization: Bearer``) and lists only pipelines of DAGs the user may read, as the auth
manager decides. The page itself holds no data.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow_provider_pglogical.ui.discovery import PipelineRef, discover
from airflow_provider_pglogical.ui.figures import pipeline_figures

#: where the API server mounts the app; the page is ``<base_url>/pglogical/``
URL_PREFIX = "/pglogical"
#: pipelines gathered at once (each may wait up to figures.CONNECT_TIMEOUT on its publisher)
WORKERS = 4

app = FastAPI(title="pglogical pipelines", description="Pipelines of airflow-provider-pglogical: slot lag, "
              "retained WAL, pending batches, applied positions and freshness.")


def readable_pipelines(user, session) -> list[PipelineRef]:
    """The pipelines of the DAGs ``user`` may read (their other DAGs left out of ``dag_ids``)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.models.serialized_dag import SerializedDagModel

    allowed = get_auth_manager().get_authorized_dag_ids(user=user, method="GET", session=session)
    if not allowed:
        return []
    rows = SerializedDagModel.get_latest_serialized_dags(dag_ids=sorted(allowed), session=session)
    return discover((row.dag_id, row.data or {}) for row in rows)


def _open_root(uri: str):
    from airflow_provider_pglogical.lakehouse.staging_roots import staging_path

    return staging_path(uri)


def _open_hook(conn_id: str):
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    return PgLogicalHook(postgres_conn_id=conn_id)


@app.get("/api/pipelines")
def list_pipelines(user: GetUserDep, session: SessionDep) -> dict:
    """Every pipeline the user may see, with its figures; a pipeline that cannot be read carries
    ``staging_error`` / ``slot_error`` instead of failing the response."""
    refs = readable_pipelines(user, session)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        pipelines = list(pool.map(lambda ref: pipeline_figures(ref, _open_root, _open_hook), refs))
    return {"generated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "pipelines": pipelines}


def _static(name: str) -> str:
    return resources.files("airflow_provider_pglogical.ui").joinpath("static", name).read_text()


@app.get("/", response_class=HTMLResponse)
def page() -> HTMLResponse:
    """The page: plain HTML and a small script that reads ``api/pipelines`` and draws it."""
    return HTMLResponse(_static("page.html"))


@app.get("/static/page.js")
def script() -> Response:
    return Response(_static("page.js"), media_type="text/javascript")
