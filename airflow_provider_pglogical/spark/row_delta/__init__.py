"""Small change batches committed by the driver without a MERGE (row deltas)."""
