"""Whether ``rewrite_position_delete_files`` can run on a table with the Iceberg runtime in use.

Iceberg 1.10's reader of the ``position_deletes`` metadata table (``PositionDeletesRowReader``)
builds an identity partition spec over every primitive field of the rows it reads, the elements
of lists and maps included, and Iceberg 1.10 refuses a partition source nested in a list or map:
on a table with such a column the procedure fails with ``Invalid partition field parent:
list<int>`` before it rewrites anything (apache/iceberg#14619, fixed in Iceberg 1.11 by
apache/iceberg#15079). Housekeeping and the apply's delete compaction skip that one step on such
tables and say so; ``rewrite_data_files`` still folds every delete into the data files it applies
to, so no delete is left applying to a live file.
"""

from __future__ import annotations

#: why the step is skipped, as the maintenance summary reports it
SKIPPED = ("skipped: Iceberg 1.10's rewrite_position_delete_files fails on a table with a list or map "
           "column (apache/iceberg#14619; rewrite_data_files already applied its deletes)")


def collection_columns(data_type, path: str = "") -> list[str]:
    """Dotted paths of the list and map columns in a Spark type (a table's schema), nested ones too."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, (ArrayType, MapType)):
        return [path]
    if isinstance(data_type, StructType):
        return [found for field in data_type.fields
                for found in collection_columns(field.dataType, f"{path}.{field.name}" if path else field.name)]
    return []


def rewrite_blocked(spark, table_name: str) -> str | None:
    """:data:`SKIPPED` when ``table_name`` (quoted, catalog-qualified) has a list or map column, else None."""
    return SKIPPED if collection_columns(spark.table(table_name).schema) else None
