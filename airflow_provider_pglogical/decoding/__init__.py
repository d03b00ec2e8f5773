"""The pgoutput wire format decoded into transactions and staged Arrow tables: bytes in, no I/O."""
