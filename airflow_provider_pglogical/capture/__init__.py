"""Sessions on the publisher that produce staged batches: snapshot, initial sync, backfill, pull."""
