// simulated NVML: see sim/nvml/README.md
