"""Configuration: settings and their sections, what the layers are configured with, the Spark session."""
