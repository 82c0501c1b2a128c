"""``medallion bench``: reproducible throughput, reduction, dedup and scaling figures, with peers."""
