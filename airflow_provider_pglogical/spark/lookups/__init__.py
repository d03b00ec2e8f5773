"""Reading a few rows of a lakehouse table by value, through Iceberg's own readers."""
