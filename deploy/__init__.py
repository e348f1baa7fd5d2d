"""How Braid runs: the embedded stack launcher, Docker and Kubernetes files."""
