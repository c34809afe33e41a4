"""Run one piece of work from several threads released at the same moment, as racing requests or task
deliveries would arrive, each on its own database connection."""

import threading

from django.db import connection


def at_once(work, count: int = 2, timeout: float = 60) -> tuple[list, list[Exception]]:
    """Calls work() from `count` threads released together; returns (what the calls returned, what they
    raised), each in the order the threads finished."""
    together = threading.Barrier(count)
    results, errors = [], []

    def run():
        try:
            together.wait(timeout=timeout)
            results.append(work())
        except Exception as error:  # noqa: BLE001 - handed back to the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return results, errors
