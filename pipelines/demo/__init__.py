"""The demo: the whole pipeline on one machine, its shipped data and synthetic inputs."""
