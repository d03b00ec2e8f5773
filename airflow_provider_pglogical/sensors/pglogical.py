"""Sensors: a slot's health before each pull, and a subscription's readiness."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

try:
    from airflow.providers.common.compat.sdk import conf
except ImportError:  # common-compat before 1.8
    from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_pglogical.exceptions import SlotError, SubscriptionError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.triggers.pglogical import SlotHealthTrigger, SubscriptionReadyTrigger
from airflow_provider_pglogical.operators._errors import fail_permanent_errors
from airflow_provider_pglogical.operators.publication import schedule_interval_seconds
from airflow_provider_pglogical.ui.metrics import safely, slot_metrics


if TYPE_CHECKING:
    from airflow.sdk import Context


class PgSlotLagSensor(BaseSensorOperator):
    """Guard a pull: wait while another consumer holds the slot; fail (or warn) when it is unhealthy.

    Fails at once when the slot is missing or was invalidated (``wal_status = lost``: its WAL is
    gone; the message points at the re-snapshot recovery). Before that happens it logs a warning
    naming the fix, and returns it in ``warnings``: when the slot has used 80% of
    ``max_slot_wal_keep_size``, or will have been idle for 80% of ``idle_replication_slot_timeout``
    (18) by the next scheduled run's pull (docs/metrics.md, "Before the slot is lost"). When retained WAL or lag pass their
    thresholds it fails, or with ``fail_on_breach=False`` logs a warning and lets the pull run
    (the pull is what brings the lag down). Returns the slot's metrics.

    :param slot: the slot to watch.
    :param max_retained_wal_bytes: WAL the slot may hold back on the server.
    :param max_lag_bytes: how far the slot's confirmed position may trail the server.
    :param fail_on_breach: fail (True) or warn (False) when a threshold is passed.
    :param deferrable: wait in the triggerer instead of a worker slot; default ``[operators] default_deferrable``.
    :param pipeline: the pipeline the slot feeds: when given, the sensor also exports the slot's figures
        as Airflow metrics tagged with it (docs/metrics.md), so a paused or failing pull still shows. (templated)
    :param postgres_conn_id: the publisher's Airflow connection. (templated)
    """

    template_fields: Sequence[str] = ("slot", "max_retained_wal_bytes", "max_lag_bytes", "pipeline",
                                      "postgres_conn_id")

    def __init__(
        self, *, slot: str, max_retained_wal_bytes: int | None = None, max_lag_bytes: int | None = None,
        fail_on_breach: bool = True,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        pipeline: str | None = None, postgres_conn_id: str = PgLogicalHook.default_conn_name, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.slot = slot
        self.pipeline = pipeline
        self.max_retained_wal_bytes = max_retained_wal_bytes
        self.max_lag_bytes = max_lag_bytes
        self.fail_on_breach = fail_on_breach
        self.deferrable = deferrable
        self.postgres_conn_id = postgres_conn_id

    def _limits(self) -> tuple[int | None, int | None]:
        as_int = lambda v: int(v) if v not in (None, "", "None") else None  # noqa: E731 - templated values
        return as_int(self.max_retained_wal_bytes), as_int(self.max_lag_bytes)

    def _status(self, context: Context) -> dict:
        # the slot idles from this run's pull until the next run's: judged against the idle timeout
        return PgLogicalHook(postgres_conn_id=self.postgres_conn_id).slot_health(
            self.slot, *self._limits(), until_next_pull=schedule_interval_seconds(context))

    def execute(self, context: Context) -> Any:
        with fail_permanent_errors():
            if not self.deferrable:
                return super().execute(context)
            status = self._status(context)
            if status["state"] != "busy":
                return self._conclude(status)
            self.defer(
                trigger=SlotHealthTrigger(self.postgres_conn_id, self.slot, *self._limits(),
                                          poll_interval=self.poke_interval),
                method_name="execute_complete",
                timeout=timedelta(seconds=self.timeout) if self.timeout else None,
            )

    def poke(self, context: Context) -> PokeReturnValue | bool:
        with fail_permanent_errors():
            status = self._status(context)
            if status["state"] == "busy":
                self.log.info(status["message"])
                return False
            return PokeReturnValue(is_done=True, xcom_value=self._conclude(status))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict:
        with fail_permanent_errors():
            return self._conclude(event)

    def _conclude(self, status: dict) -> dict:
        state = status["state"]
        if state in ("missing", "invalidated"):
            if self.pipeline:
                safely("slot", self.pipeline, lambda: slot_metrics(self.pipeline, status), self.log.warning)
            raise SlotError(status["message"], permanent=True)
        if state == "breach":
            if self.fail_on_breach:
                raise SlotError(status["message"])
            self.log.warning(status["message"])
        else:
            self.log.info(status["message"])
        for warning in status.get("warnings") or ():  # before PostgreSQL invalidates the slot: the fix
            self.log.warning(warning)
        if self.pipeline:
            safely("slot", self.pipeline, lambda: slot_metrics(self.pipeline, status), self.log.warning)
        return status


class PgSubscriptionReadySensor(BaseSensorOperator):
    """Wait until every table of a subscription finished its initial copy (``pg_subscription_rel`` state r).

    :param subscription: the subscription's name (on the subscriber).
    :param deferrable: wait in the triggerer instead of a worker slot; default ``[operators] default_deferrable``.
    :param postgres_conn_id: the subscriber's Airflow connection. (templated)
    """

    template_fields: Sequence[str] = ("subscription", "postgres_conn_id")

    def __init__(self, *, subscription: str,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 postgres_conn_id: str = PgLogicalHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.subscription = subscription
        self.deferrable = deferrable
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Context) -> Any:
        with fail_permanent_errors():
            if not self.deferrable:
                return super().execute(context)
            status = PgLogicalHook(postgres_conn_id=self.postgres_conn_id).subscription_health(self.subscription)
            if status["state"] != "waiting":
                return self.execute_complete(context, status)
            self.defer(
                trigger=SubscriptionReadyTrigger(self.postgres_conn_id, self.subscription, poll_interval=self.poke_interval),
                method_name="execute_complete",
                timeout=timedelta(seconds=self.timeout) if self.timeout else None,
            )

    def poke(self, context: Context) -> PokeReturnValue | bool:
        with fail_permanent_errors():
            status = PgLogicalHook(postgres_conn_id=self.postgres_conn_id).subscription_health(self.subscription)
            if status["state"] == "missing":
                raise SubscriptionError(status["message"])
            self.log.info(status["message"])
            return PokeReturnValue(is_done=True, xcom_value=status) if status["state"] == "ready" else False

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict:
        with fail_permanent_errors():
            if event["state"] == "missing":
                raise SubscriptionError(event["message"])
            return event
