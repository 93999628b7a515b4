#!/usr/bin/env python3
"""Start a small process tree and keep it running.

    python3 /app/launcher.py            # the root; prints "READY <pid>" once the tree is complete
    python3 /app/launcher.py --role X   # internal: one node of the tree

Tree (command lines in brackets):
    root      [python3 /app/launcher.py]
      ingest  [python3 /app/launcher.py --role ingest]
        reader  [python3 /app/launcher.py --role reader]
          [bash -c sleep 3602; true]
            [sleep 3602]
        parser  [python3 /app/launcher.py --role parser --ignore-term]   (ignores SIGTERM)
          [sleep 3600]
      api     [python3 /app/launcher.py --role api]
        [sleep 3601]
      cron    [python3 /app/launcher.py --role cron]

If the environment variable LAUNCHER_SIGNAL_LOG names a file, every python node appends the line
"<role> <pid> TERM" to it when it receives SIGTERM (then exits, except the parser, which ignores it).
"""
import os
import signal
import subprocess
import sys
import time

CHILDREN = {
    "root": [["--role", "ingest"], ["--role", "api"], ["--role", "cron"]],
    "ingest": [["--role", "reader"], ["--role", "parser", "--ignore-term"]],
    "reader": [("bash", "-c", "sleep 3602; true")],
    "parser": [("sleep", "3600")],
    "api": [("sleep", "3601")],
    "cron": [],
}
TOTAL_DESCENDANTS = 9


def descendants(pid):
    kids = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def main():
    args = sys.argv[1:]
    role = args[args.index("--role") + 1] if "--role" in args else "root"
    ignore = "--ignore-term" in args

    def on_term(signum, frame):
        log = os.environ.get("LAUNCHER_SIGNAL_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{role} {os.getpid()} TERM\n")
        if not ignore:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    for spec in CHILDREN[role]:
        if isinstance(spec, list):  # another node of the tree
            subprocess.Popen(["python3", "/app/launcher.py", *spec])
        else:  # a plain command (tuple of argv)
            subprocess.Popen(list(spec))
    if role == "root":
        deadline = time.time() + 20
        while len(descendants(os.getpid())) < TOTAL_DESCENDANTS and time.time() < deadline:
            time.sleep(0.05)
        print(f"READY {os.getpid()}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
