from django.contrib.auth.hashers import Argon2PasswordHasher


class CheapArgon2PasswordHasher(Argon2PasswordHasher):
    """Argon2, as in production, with the cost turned down so hundreds of test users hash quickly."""

    time_cost = 1
    memory_cost = 1024
    parallelism = 1
