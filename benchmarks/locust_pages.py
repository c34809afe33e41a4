"""Locust users for benchmarks/bench_pages.py: people who keep the portal open while they launch.

Each simulated user is one of the seeded developers, logged in (a session made by the bench, passed in
the file named by BENCH_PAGES_USERS), with one running instance. Like a person in the browser it opens
the dashboard and the instance list now and then, and while its launch page is open it polls the status
JSON the page polls (templates/instances/detail.html). Run by the bench, not by hand:

    locust -f benchmarks/locust_pages.py --headless -u 50 -r 25 -t 30s --host http://127.0.0.1:PORT
"""

import itertools
import json
import os

from locust import FastHttpUser, between, task

with open(os.environ["BENCH_PAGES_USERS"]) as handle:
    _PEOPLE = json.load(handle)
_NEXT = itertools.count()


class Developer(FastHttpUser):
    # A person reads a page for a moment before the next click; the launch page polls every second.
    wait_time = between(0.5, 1.5)

    def on_start(self):
        person = _PEOPLE[next(_NEXT) % len(_PEOPLE)]
        self.headers = {"Cookie": f"{person['cookie_name']}={person['session']}"}
        self.status_url = f"/instances/{person['instance']}/status.json"

    @task(1)
    def dashboard(self):
        self.client.get("/", name="dashboard", headers=self.headers)

    @task(1)
    def instance_list(self):
        self.client.get("/instances/", name="instance list", headers=self.headers)

    @task(3)
    def status(self):
        self.client.get(self.status_url, name="status JSON", headers=self.headers)
