"""The kernel-enforced storage quota, on a Docker daemon of its own whose data sits on a
loop-mounted btrfs file (what `T1JAX_STORAGE_QUOTA=1 scripts/setup.sh` starts): a burst of writes
stops at the cap however fast it is, and the sandbox reports the quota. The default daemon
(overlay2) has only the watchdog (tests/sandbox/test_sandbox_docker.py).
"""

import os
import shutil
import subprocess
import time

import pytest

from conftest import _unavailable

from t1jax.sandbox.base import Limits, StorageQuotaExceeded
from t1jax.sandbox.images import LOCAL_BASE_IMAGE

pytestmark = pytest.mark.slow
docker_sdk = pytest.importorskip("docker")


@pytest.fixture(scope="module")
def btrfs_client(tmp_path_factory, docker_client):
    """A second dockerd (storage driver btrfs, qgroups on) with the base image loaded."""
    missing = [t for t in ("dockerd", "mkfs.btrfs", "btrfs", "losetup") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        _unavailable(f"a btrfs Docker daemon needs root and {missing or 'loop devices'}")
    root = tmp_path_factory.mktemp("btrfs")
    image, mnt, sock = root / "docker.btrfs", root / "mnt", root / "docker.sock"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "8G", str(image)], check=True)
    subprocess.run(["mkfs.btrfs", "-q", "-f", str(image)], check=True, capture_output=True)
    if subprocess.run(["mount", "-o", "loop", str(image), str(mnt)]).returncode != 0:
        _unavailable("cannot loop-mount a btrfs file here")
    subprocess.run(["btrfs", "quota", "enable", str(mnt)], check=True)
    args = ["dockerd", "--data-root", str(mnt / "docker"), "--exec-root", str(root / "exec"),
            "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{sock}",
            "--storage-driver", "btrfs", "--bridge=none", "--iptables=false", "--ip-masq=false"]
    if os.path.exists("/var/lib/t1jax/daemon.json"):  # the runsc runtime, as setup registers it
        args += ["--config-file", "/var/lib/t1jax/daemon.json"]
    log = open(root / "dockerd.log", "w")
    daemon = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = None
        for _ in range(120):
            try:
                client = docker_sdk.DockerClient(base_url=f"unix://{sock}", timeout=120)
                client.ping()
                break
            except docker_sdk.errors.DockerException:  # not up yet
                time.sleep(0.5)
        if client is None:
            pytest.fail(f"the btrfs dockerd did not start: {(root / 'dockerd.log').read_text()}")
        # by name: the base carries other tags too (the public bases mapped onto it), and
        # Image.save(named=True) would export only the first of them
        client.images.load(b"".join(docker_client.api.get_image(LOCAL_BASE_IMAGE)))
        client.images.get(LOCAL_BASE_IMAGE)
        yield client
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        subprocess.run(["umount", str(mnt)])


def test_a_burst_of_writes_stops_at_the_kernel_cap(btrfs_client, runtime):
    from t1jax.sandbox.docker import (BTRFS_IMAGE_FACTOR, BTRFS_SLACK_BYTES, DockerSandbox,
                                      storage_enforcement)
    assert storage_enforcement(btrfs_client) == "kernel"
    image_bytes = btrfs_client.images.get(LOCAL_BASE_IMAGE).attrs["Size"]
    with DockerSandbox(LOCAL_BASE_IMAGE, limits=Limits(storage_mb=64), client=btrfs_client,
                       run_id="test-quota", runtime=runtime) as sb:
        size = int(sb.container.attrs["HostConfig"]["StorageOpt"]["size"])
        assert size == int(image_bytes * BTRFS_IMAGE_FACTOR) + 64 * 2**20 + BTRFS_SLACK_BYTES
        # 3 GB in 30 MB files, faster than any watchdog looks: the kernel stops it
        burst = "for i in $(seq 1 100); do head -c 30000000 /dev/zero > /app/f$i || break; done"
        with pytest.raises(StorageQuotaExceeded, match="storage quota of 64 MiB") as stopped:
            result = sb.exec(burst, timeout=120)
            pytest.fail(f"the burst was not stopped: {result}; the daemon counts "
                        f"{sb.disk_usage_bytes()} bytes against a baseline of {sb._baseline}, "
                        f"cap {size}")
        written = sb.disk_usage_bytes()
        if written is None:  # the daemon failed to count (SizeRw -1 on every try; seen in CI)
            written = int(sb._root_exec(["du", "-sb", "/app"]).split()[0])
        assert 64 * 2**20 <= written <= 64 * 2**20 + (BTRFS_IMAGE_FACTOR - 1) * image_bytes + \
            BTRFS_SLACK_BYTES, (written, str(stopped.value))
        assert sb.exec("rm -f /app/f*; echo ok").output == "ok\n"  # it lives on, under quota

        # where the daemon's count lags the kernel's (it says nothing was written), the kernel's
        # refusal still ends the command as over quota, not as a silent "disk full"
        sb.disk_usage_bytes = lambda: sb._baseline
        with pytest.raises(StorageQuotaExceeded, match="kernel cap on its writes"):
            sb.exec(burst, timeout=120)
