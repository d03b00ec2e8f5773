"""``airflow pglogical …``: operations commands registered by the provider (``get_provider_info()["cli"]``)."""
