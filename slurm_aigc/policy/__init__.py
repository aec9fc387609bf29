"""The job_submit hook's policy: typed model, strict loader, Lua renderer, installer, Lua runtime."""
