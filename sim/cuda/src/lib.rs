// simulated driver: see sim/cuda/README.md
