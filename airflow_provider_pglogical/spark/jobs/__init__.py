"""The spark-submit main files: apply, maintenance, verify (``spark/launch.py`` names them)."""
