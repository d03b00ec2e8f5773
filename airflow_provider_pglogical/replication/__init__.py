"""Logical-replication building blocks: LSNs, the pgoutput decoder, publications, staging."""
