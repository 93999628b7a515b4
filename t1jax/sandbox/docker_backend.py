"""The Docker backend: task images built from Dockerfiles, sandboxes as containers, snapshots as
committed images, and a reaper for what crashed runs leave behind."""

from __future__ import annotations

from t1jax.sandbox import base, images
from t1jax.sandbox.backend import SandboxSpec
from t1jax.sandbox.base import SandboxError
from t1jax.sandbox.docker import DockerSandbox, docker_client


class DockerBackend:
    name = "docker"

    def __init__(self, base_map: dict | None = None, build_network: str = "none",
                 runtime: str | None = None, network_name: str = "bridge",
                 registry: bool = False):
        """registry=True is Harbor's way on a machine that reaches the registry: a task's
        prebuilt `docker_image` is used (pulled when absent) and missing bases are pulled;
        False builds every Dockerfile, with public bases mapped to local stand-ins."""
        self.client = docker_client()
        self.base_map = images.DEFAULT_BASE_MAP if base_map is None else dict(base_map)
        self.build_network = build_network
        self.runtime = runtime
        self.network_name = network_name
        self.registry = registry

    def build(self, task) -> str:
        where = f"task {task.task_id} ([environment] docker_image)"
        if self.registry and task.environment.docker_image:
            images.pull_missing(self.client, task.environment.docker_image, where)
            return task.environment.docker_image
        if task.dockerfile is None:  # the prebuilt image, or the stand-in for it offline
            image = task.environment.docker_image
            return images.stand_ins(self.client, f"FROM {image}", self.base_map,
                                    where).get(image, image)
        return images.build_task_image(
            self.client, task.task_id, task.environment_dir, task.dockerfile,
            base_map=self.base_map, network_mode=self.build_network,
            timeout_s=task.environment.build_timeout_sec, pull=self.registry)

    def create(self, spec: SandboxSpec) -> DockerSandbox:
        sandbox = DockerSandbox(
            spec.image, limits=spec.limits, workdir=spec.workdir, user=spec.user,
            network=self.network_name if spec.network else None, run_id=spec.run_id,
            runtime=self.runtime, environment=dict(spec.environment), client=self.client,
            readonly_mounts={host: path for host, path in spec.readonly_mounts})
        return sandbox.start()

    def changes(self, sandbox: DockerSandbox) -> list[tuple[str, str]]:
        return sandbox.changes()

    def remove_image(self, image: str) -> None:
        import docker.errors
        try:
            self.client.images.remove(image, force=True, noprune=False)
        except docker.errors.ImageNotFound:
            pass

    def reap(self, run_id: str | None = None) -> int:
        """Remove t1jax containers and snapshots of `run_id`, or of any run whose owning process
        on this host is dead (a run killed with SIGKILL cannot clean up after itself); never
        those of a live process other than this one (`base.reapable`)."""
        import docker.errors

        def abandoned(labels: dict) -> bool:
            return base.reapable(labels.get(base.LABEL_RUN), labels.get(base.LABEL_HOST),
                                 labels.get(base.LABEL_PID), run_id)

        removed = 0
        owner = {"label": f"{base.LABEL_OWNER}=t1jax"}
        # sparse: a container removed by another process mid-listing must not fail the reap
        for container in self.client.containers.list(all=True, filters=owner, sparse=True):
            if abandoned(container.attrs.get("Labels") or {}):
                try:
                    container.remove(force=True, v=True)
                    removed += 1
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as err:
                    if err.status_code != 409:
                        raise
                    # 409: another process's reap or close is removing it already (two jobs,
                    # or two test workers, reaping the same dead run at once)
        for image in self.client.api.images(filters=owner):  # raw list: no per-image inspect
            tags = image.get("RepoTags") or []
            if any(t.startswith("t1jax-snapshot:") for t in tags) and \
                    abandoned(image.get("Labels") or {}):
                try:
                    self.client.images.remove(image["Id"], force=True)
                    removed += 1
                except (docker.errors.ImageNotFound, docker.errors.APIError):
                    pass
        return removed


def reaper_main() -> None:
    """`python -m t1jax.sandbox.docker_backend [RUN_ID]`: remove leftovers of dead runs."""
    import sys
    try:
        count = DockerBackend().reap(sys.argv[1] if len(sys.argv) > 1 else None)
    except SandboxError as err:
        sys.exit(str(err))
    print(f"removed {count} leftover sandbox containers/snapshots")


if __name__ == "__main__":
    reaper_main()
