"""Slurm as a compute backend: a slurmrestd client (rest.py) and the batch job that runs an instance
(job.py). Plain Python below the driver: no Django, no models."""
