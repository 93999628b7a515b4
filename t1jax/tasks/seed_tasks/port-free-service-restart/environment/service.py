#!/usr/bin/env python3
"""A tiny port-free "service" for supervisor tests.

    python3 /app/service.py --state DIR

Each run:
  * increments the run counter in DIR/runs (run k = 1, 2, ...) and appends its pid to DIR/pids;
  * appends "beat <k> <i>" to DIR/heartbeat.log every 0.1 s;
  * reads DIR/crash_plan (whitespace-separated exit codes, may be missing or empty): if it has
    at least k entries, run k exits with the k-th code after 3 beats (0 = clean exit);
    otherwise the run keeps beating until it is signalled;
  * on SIGTERM appends "stopped <k>" to DIR/heartbeat.log and exits with status 0.
"""
import argparse
import os
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--state", required=True)
state = ap.parse_args().state
os.makedirs(state, exist_ok=True)
runs_path = os.path.join(state, "runs")
k = int(open(runs_path).read().strip() or 0) + 1 if os.path.exists(runs_path) else 1
with open(runs_path, "w") as f:
    f.write(f"{k}\n")
with open(os.path.join(state, "pids"), "a") as f:
    f.write(f"{os.getpid()}\n")
plan_path = os.path.join(state, "crash_plan")
plan = open(plan_path).read().split() if os.path.exists(plan_path) else []
beats = os.path.join(state, "heartbeat.log")


def on_term(signum, frame):
    with open(beats, "a") as f:
        f.write(f"stopped {k}\n")
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
i = 0
while True:
    i += 1
    with open(beats, "a") as f:
        f.write(f"beat {k} {i}\n")
    if k <= len(plan) and i >= 3:
        sys.exit(int(plan[k - 1]))
    time.sleep(0.1)
