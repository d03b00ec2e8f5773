"""The apply job's planning and MERGE paths: which steps each table needs, and applying them."""
