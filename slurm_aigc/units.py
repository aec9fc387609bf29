"""Units shared by every layer (pure, no imports).

NVML and the agents' samples count GPU memory in MiB; the policy, tags and inventory in GiB.
"""

MIB_PER_GIB = 1024.0
