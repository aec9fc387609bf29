"""GPU telemetry: NVML and simulated backends, topology, process-to-job attribution."""
