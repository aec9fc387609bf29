"""Trace replay: trace readers, the workload file format, the generator and run metrics."""
