"""The Airflow plugin of the pipeline view, registered in the provider info (``plugins``), so
installing the provider is enough: the API server mounts the app, the UI's menu links the page."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_pglogical.ui.api import URL_PREFIX, app


class PgLogicalPipelinesPlugin(AirflowPlugin):
    """``<base_url>/pglogical/``: the page; ``<base_url>/pglogical/api/pipelines``: its JSON."""

    name = "pglogical"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "pglogical pipelines"}]
    external_views = [{
        "name": "Replication pipelines", "href": f"{URL_PREFIX}/", "destination": "nav", "category": "browse",
        "url_route": "pglogical",
    }]
