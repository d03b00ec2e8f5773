"""Triggers for the deferrable sensors: they poll PostgreSQL in a worker thread, never on the loop."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent


def _slot_status(conn_id: str, slot: str, max_retained: int | None, max_lag: int | None) -> dict:
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    return PgLogicalHook(postgres_conn_id=conn_id).slot_health(slot, max_retained, max_lag)


def _subscription_status(conn_id: str, subscription: str) -> dict:
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    return PgLogicalHook(postgres_conn_id=conn_id).subscription_health(subscription)


class SlotHealthTrigger(BaseTrigger):
    """Fires once the slot is free of other consumers, or unhealthy (missing, invalidated, over limits)."""

    def __init__(self, postgres_conn_id: str, slot: str, max_retained_wal_bytes: int | None = None,
                 max_lag_bytes: int | None = None, poll_interval: float = 10.0) -> None:
        super().__init__()
        # The trigger's arguments, kept as given: serialize() hands them back to the triggerer as they came.
        self.postgres_conn_id = postgres_conn_id
        self.slot = slot
        self.max_retained_wal_bytes = max_retained_wal_bytes
        self.max_lag_bytes = max_lag_bytes
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_provider_pglogical.triggers.pglogical.SlotHealthTrigger",
            {"postgres_conn_id": self.postgres_conn_id, "slot": self.slot,
             "max_retained_wal_bytes": self.max_retained_wal_bytes, "max_lag_bytes": self.max_lag_bytes,
             "poll_interval": self.poll_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            status = await asyncio.to_thread(
                _slot_status, self.postgres_conn_id, self.slot, self.max_retained_wal_bytes, self.max_lag_bytes
            )
            if status["state"] != "busy":
                yield TriggerEvent(status)
                return
            await asyncio.sleep(self.poll_interval)


class SubscriptionReadyTrigger(BaseTrigger):
    """Fires once every table of a subscription is ready (state ``r``), or it is missing."""

    def __init__(self, postgres_conn_id: str, subscription: str, poll_interval: float = 10.0) -> None:
        super().__init__()
        # The trigger's arguments, kept as given: serialize() hands them back to the triggerer as they came.
        self.postgres_conn_id = postgres_conn_id
        self.subscription = subscription
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_provider_pglogical.triggers.pglogical.SubscriptionReadyTrigger",
            {"postgres_conn_id": self.postgres_conn_id, "subscription": self.subscription,
             "poll_interval": self.poll_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            status = await asyncio.to_thread(_subscription_status, self.postgres_conn_id, self.subscription)
            if status["state"] != "waiting":
                yield TriggerEvent(status)
                return
            await asyncio.sleep(self.poll_interval)
