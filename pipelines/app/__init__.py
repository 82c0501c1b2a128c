"""What users run: the CLI, the Python API, the report, the bundle, maintenance and queries."""
