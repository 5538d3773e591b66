"""The records of a pipeline of pdeflow commands run into one folder: each stage keyed by the hash of its inputs."""
