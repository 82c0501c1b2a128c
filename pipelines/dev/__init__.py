"""Development tools: the bench, the local test services, analysis."""
