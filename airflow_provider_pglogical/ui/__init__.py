"""The pipeline view in the Airflow UI: a plugin the provider registers (docs/ui.md).

``history`` is what the pull and apply tasks record for it (light: the operators import it);
``discovery`` finds the pipelines the serialized DAGs run, ``figures`` gathers one pipeline's
figures from its staging root and its publisher, ``api`` serves them as JSON and the page, and
``plugin`` tells Airflow about both. Nothing here is imported until Airflow loads the plugin.
"""
