"""The maintenance job's steps: compaction, snapshot expiry, orphan and dead-delete removal."""
