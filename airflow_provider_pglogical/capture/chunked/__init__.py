"""The chunked initial load: each table read in key chunks, each in its own short transaction (docs/snapshots.md)."""
