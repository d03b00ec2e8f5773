"""Verify: the source's published projection against the lakehouse, an independent witness
(invariant 15). An orchestrator (PostgreSQL digests, a Spark job, PostgreSQL again) above
``capture/``, ``hooks/``, ``lakehouse/`` and ``spark/``; ``PgVerifyOperator`` and the demo call it."""
