"""Config blocks shared by the jobs that run sandboxes (oracle, audit, synth): one definition,
documented once."""

import ml_collections


def sandbox_config() -> ml_collections.ConfigDict:
    sandbox = ml_collections.ConfigDict()
    sandbox.backend = "docker"  # docker | bwrap (no daemon needed)
    sandbox.concurrency = 4  # sandboxes running at once
    sandbox.allow_network = False  # a task's allow_internet only counts when this is True
    sandbox.runtime = ""  # Docker runtime, e.g. runsc (gVisor); "" = the daemon's default
    sandbox.build_network = "none"  # network for `docker build` (host to apt-get in builds)
    sandbox.pids = 512
    sandbox.max_output_bytes = 10_000  # per command, head + tail kept (Terminus-2: 10 KB)
    sandbox.command_timeout_s = 180.0
    return sandbox
