"""Operators for PostgreSQL-to-PostgreSQL replication: create and drop a native subscription."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseOperator

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.operators._errors import fail_permanent_errors


if TYPE_CHECKING:
    from airflow.sdk import Context


class PgCreateSubscriptionOperator(BaseOperator):
    """Create a subscription on the subscriber (if it does not exist) to publications on the publisher.

    :param subscription: the subscription's name.
    :param publications: publications to subscribe to.
    :param publisher_conn_id: the publisher's Airflow connection (as the subscriber server reaches it).
    :param postgres_conn_id: the subscriber's Airflow connection. (templated)
    :param options: more ``CREATE SUBSCRIPTION … WITH`` options (``copy_data``, ``streaming``, ``binary``, …).
    """

    template_fields: Sequence[str] = (
        "subscription", "publications", "publisher_conn_id", "postgres_conn_id", "options",
    )

    def __init__(self, *, subscription: str, publications: Sequence[str], publisher_conn_id: str,
                 postgres_conn_id: str = PgLogicalHook.default_conn_name, options: dict | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.subscription = subscription
        self.publications = publications
        self.publisher_conn_id = publisher_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.options = options or {}

    def execute(self, context: Context) -> dict:
        with fail_permanent_errors():
            hook = PgLogicalHook(postgres_conn_id=self.postgres_conn_id)
            created = hook.create_subscription(self.subscription, list(self.publications),
                                               publisher_conn_id=self.publisher_conn_id, **self.options)
            return {"subscription": self.subscription, "created": created}


class PgDropSubscriptionOperator(BaseOperator):
    """Drop a subscription, also when its publisher is unreachable (the remote slot then stays).

    :param subscription: the subscription's name.
    :param keep_remote_slot: leave the publisher's slot in place.
    :param postgres_conn_id: the subscriber's Airflow connection. (templated)
    """

    template_fields: Sequence[str] = ("subscription", "postgres_conn_id")

    def __init__(self, *, subscription: str, keep_remote_slot: bool = False,
                 postgres_conn_id: str = PgLogicalHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.subscription = subscription
        self.keep_remote_slot = keep_remote_slot
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Context) -> None:
        with fail_permanent_errors():
            PgLogicalHook(postgres_conn_id=self.postgres_conn_id).drop_subscription(
                self.subscription, keep_remote_slot=self.keep_remote_slot
            )
