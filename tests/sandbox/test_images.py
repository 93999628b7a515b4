"""Task image tests: FROM parsing, offline base mapping, the content-hash cache, build errors.

Building needs a Docker engine (the `docker_backend` fixture skips without one, fails in CI);
every image or tag a test creates is removed again, public-looking tags only if the test made them.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import docker.errors
import docker.models.images
import pytest

from t1jax.sandbox import images
from t1jax.sandbox.base import SandboxError
from t1jax.sandbox.docker_backend import DockerBackend
from t1jax.tasks.task import load_task

BASE = images.LOCAL_BASE_IMAGE


# --- base_images: what a Dockerfile builds FROM -------------------------------------------------

def test_base_images_single_stage():
    assert images.base_images("FROM ubuntu:24.04\nRUN true\n") == ["ubuntu:24.04"]


def test_base_images_multi_stage_excludes_stage_aliases():
    text = """
# syntax=docker/dockerfile:1
ARG VERSION=3.12
FROM --platform=linux/amd64 python:3.12-slim-bookworm AS builder
RUN pip wheel . -w /wheels
FROM builder as tester
RUN pytest
from   golang:1.22  AS  Tools
FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624
COPY --from=builder /wheels /wheels
FROM --platform=$BUILDPLATFORM alpine:3.20 AS Fetch
COPY --from=tools /go/bin/x /usr/bin/x
FROM TESTER
FROM python:${VERSION}
"""
    assert images.base_images(text) == [
        "python:3.12-slim-bookworm", "golang:1.22",
        "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", "alpine:3.20"]


def test_base_images_alias_only_counts_after_its_stage():
    # a stage alias that shadows an image name only counts from its own definition on
    text = "FROM base AS base2\nFROM base2\nFROM debian:bookworm AS base\nFROM base\n"
    assert images.base_images(text) == ["base", "debian:bookworm"]


def test_base_images_ignores_from_inside_other_instructions():
    text = "FROM debian:bookworm\nRUN echo FROM evil:1 && true\n"
    assert images.base_images(text) == ["debian:bookworm"]


# --- building ------------------------------------------------------------------------------------

def write_task(root: Path, name: str, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    d = root / name
    for rel, text in {"task.toml": 'schema_version = "1.1"\n',
                      "instruction.md": "Do it.\n",
                      "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
                      "environment/Dockerfile": dockerfile,
                      **{f"environment/{k}": v for k, v in (files or {}).items()}}.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def _exists(client, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


@pytest.fixture
def cleanup(docker_backend):
    """Register image refs to remove after the test (ignored if already gone)."""
    refs: list[str] = []
    yield refs
    for ref in reversed(refs):
        try:
            docker_backend.client.images.remove(ref, force=False, noprune=False)
        except docker.errors.APIError:
            pass


@pytest.fixture
def unique():
    return uuid.uuid4().hex[:10]


def test_public_base_builds_offline_via_base_map(docker_backend, tmp_path, cleanup, unique):
    """An absent public base is replaced by the mapped image in the Dockerfile the build runs
    (never tagged with the public name: a later online run must pull the real one), and the
    build needs no registry. A unique public-looking name keeps this independent of what else
    is present."""
    client = docker_backend.client
    public = f"example.org/t1jax-test/ubuntu-{unique}:24.04"
    backend = DockerBackend(base_map={public: BASE})
    task = load_task(write_task(tmp_path, f"mapped-{unique}",
                                f"FROM {public}\nRUN echo built > /built.txt\n"))
    assert not _exists(client, public)
    tag = backend.build(task)
    cleanup.append(tag)
    assert tag.startswith(f"t1jax-task/mapped-{unique}:")
    assert not _exists(client, public)  # the daemon's names are left as they were
    built = client.images.get(tag)
    assert built.labels.get("t1jax.owner") == "t1jax"
    assert built.labels.get("t1jax.task") == task.task_id
    out = client.containers.run(tag, ["cat", "/built.txt"], remove=True, network_mode="none")
    assert out.strip() == b"built"


def test_default_stand_ins_never_take_official_names(docker_backend, tmp_path, cleanup, unique):
    """Public bases of the default map build offline, and afterwards no official name of the
    map points anywhere it did not before (the daemon's tags, read before and after), and the
    task's Dockerfile is untouched."""
    client = docker_backend.client

    def tags() -> dict:
        return {t: image.id for image in client.images.list() for t in image.tags}
    before = tags()
    body = "FROM ubuntu:24.04 AS build\nWORKDIR /app\nFROM python:3.13-slim-bookworm\n" \
           "COPY --from=build /app /app\nRUN python --version\n"
    d = write_task(tmp_path, f"official-{unique}", body)
    tag = docker_backend.build(load_task(d))
    cleanup.append(tag)
    assert (d / "environment" / "Dockerfile").read_text() == body
    after = tags()
    assert tag in after
    official = {ref if ":" in ref.split("/")[-1] else f"{ref}:latest"
                for ref in images.DEFAULT_BASE_MAP}  # (other tests may build beside this one)
    assert {t: after.get(t) for t in official} == {t: before.get(t) for t in official}


def test_unmapped_base_fails_naming_dockerfile_and_image(docker_backend, tmp_path, unique):
    missing = f"example.invalid/t1jax-missing-{unique}:1"
    backend = DockerBackend(base_map={"ubuntu:24.04": BASE})  # no "*" fallback
    task = load_task(write_task(tmp_path, f"unmapped-{unique}",
                                f"FROM {BASE} AS first\nFROM {missing}\n"))
    with pytest.raises(SandboxError) as info:
        backend.build(task)
    message = str(info.value)
    assert str(task.dockerfile) in message and missing in message
    assert "base_map" in message


def test_wildcard_base_map_maps_any_base(docker_backend, tmp_path, cleanup, unique):
    public = f"example.org/t1jax-test/anything-{unique}"  # no tag: means :latest
    backend = DockerBackend(base_map={"*": BASE})
    task = load_task(write_task(tmp_path, f"wildcard-{unique}", f"FROM {public}\n"))
    tag = backend.build(task)
    cleanup.append(tag)
    assert not _exists(docker_backend.client, f"{public}:latest")


def test_base_mapped_to_missing_image_fails(docker_backend, tmp_path, unique):
    public = f"example.org/t1jax-test/gone-{unique}:1"
    backend = DockerBackend(base_map={public: f"t1jax/not-built-{unique}:x"})
    task = load_task(write_task(tmp_path, f"gone-{unique}", f"FROM {public}\n"))
    with pytest.raises(SandboxError, match=f"t1jax/not-built-{unique}:x"):
        backend.build(task)


def test_ubuntu_2404_builds_on_ubuntu_2404_with_its_python(docker_backend, tmp_path, cleanup,
                                                           unique):
    """ubuntu:24.04 (and TB2's own ubuntu-24-04 image) stand on t1jax/base:noble, built by
    scripts/setup.sh from Ubuntu's archive: Ubuntu 24.04 with its Python 3.12 and pytest, the
    Python TB2's test.sh files ask for (`uv venv -p 3.12`), not Debian 12's 3.11. Skipped where
    setup could not reach archive.ubuntu.com (then bookworm stands in, tested below), except
    with T1JAX_REQUIRE_NOBLE=1."""
    import os
    if not _exists(docker_backend.client, images.NOBLE_BASE_IMAGE):
        if os.environ.get("T1JAX_REQUIRE_NOBLE") == "1":
            pytest.fail(f"{images.NOBLE_BASE_IMAGE} missing: run scripts/setup.sh")
        pytest.skip(f"{images.NOBLE_BASE_IMAGE} not built here (archive.ubuntu.com unreachable)")
    assert images.DEFAULT_BASE_MAP["ubuntu:24.04"] == images.NOBLE_BASE_IMAGE
    body = ("FROM ubuntu:24.04\nRUN . /etc/os-release && test \"$VERSION_ID\" = 24.04 \\\n"
            " && python --version | grep -q 'Python 3.12' && python3 -m pytest --version\n")
    tag = docker_backend.build(load_task(write_task(tmp_path, f"noble-{unique}", body)))
    cleanup.append(tag)
    out = docker_backend.client.containers.run(
        tag, ["sh", "-c", ". /etc/os-release; echo $PRETTY_NAME; python3 --version"],
        remove=True, network_mode="none").decode()
    assert "Ubuntu 24.04" in out and "Python 3.12" in out, out


def test_without_the_ubuntu_stand_in_bookworm_stands_in_with_a_warning(
        docker_backend, tmp_path, cleanup, unique, monkeypatch, caplog):
    """Where setup could not build the Ubuntu stand-in, ubuntu:24.04 builds on bookworm and the
    build says so (a warning naming both); an image mapped to a missing one elsewhere still
    fails (above)."""
    missing = f"t1jax/base:noble-not-built-{unique}"
    monkeypatch.setattr(images, "NOBLE_BASE_IMAGE", missing)
    backend = DockerBackend(base_map={"ubuntu:24.04": missing})
    task = load_task(write_task(tmp_path, f"no-noble-{unique}",
                                "FROM ubuntu:24.04\nRUN python --version | grep -q 'Python 3.11'\n"))
    with caplog.at_level("WARNING"):
        cleanup.append(backend.build(task))
    assert any(missing in r.getMessage() and images.LOCAL_BASE_IMAGE in r.getMessage()
               for r in caplog.records), caplog.text


def test_build_is_cached_by_content(docker_backend, tmp_path, cleanup, unique, monkeypatch):
    client = docker_backend.client
    d = write_task(tmp_path, f"cached-{unique}", f"FROM {BASE}\nCOPY data.txt /data.txt\n",
                   {"data.txt": "one\n"})
    task = load_task(d)
    first = docker_backend.build(task)
    cleanup.append(first)
    image_id = client.images.get(first).id

    def no_build(self, **kwargs):
        raise AssertionError(f"rebuilt a cached image: {kwargs.get('tag')}")

    monkeypatch.setattr(docker.models.images.ImageCollection, "build", no_build)
    assert docker_backend.build(task) == first  # a cache hit: no build call
    assert docker_backend.build(load_task(d)) == first  # same content, freshly loaded
    assert client.images.get(first).id == image_id

    # any change to the context gives a new tag (and so a real build)
    (d / "environment" / "data.txt").write_text("two\n")
    with pytest.raises(AssertionError, match="rebuilt a cached image"):
        docker_backend.build(load_task(d))
    monkeypatch.undo()
    second = docker_backend.build(load_task(d))
    cleanup.append(second)
    assert second != first and second.startswith(f"t1jax-task/cached-{unique}:")
    out = client.containers.run(second, ["cat", "/data.txt"], remove=True, network_mode="none")
    assert out == b"two\n"


def test_context_hash_covers_files_modes_dockerfile_and_base_map(tmp_path):
    ctx = tmp_path / "ctx"
    (ctx / "sub").mkdir(parents=True)
    dockerfile = ctx / "Dockerfile"
    dockerfile.write_text("FROM debian:bookworm\n")
    (ctx / "sub" / "a.sh").write_text("echo a\n")
    h = images.context_hash(ctx, dockerfile, {})
    assert h == images.context_hash(ctx, dockerfile, {})
    (ctx / "sub" / "a.sh").chmod(0o755)
    h2 = images.context_hash(ctx, dockerfile, {})
    assert h2 != h
    assert images.context_hash(ctx, dockerfile, {"debian:bookworm": BASE}) != h2
    (ctx / "sub" / "b.txt").write_text("")
    h3 = images.context_hash(ctx, dockerfile, {})
    assert h3 != h2
    (ctx / "sub" / "b.txt").rename(ctx / "b.txt")
    assert images.context_hash(ctx, dockerfile, {}) != h3


def test_failing_run_raises_with_task_id_and_log_tail(docker_backend, tmp_path, unique):
    name = f"broken-build-{unique}"
    task = load_task(write_task(tmp_path, name,
                                f'FROM {BASE}\nRUN echo "marker-$((40 + 2))" && exit 3\n'))
    with pytest.raises(SandboxError) as info:
        docker_backend.build(task)
    message = str(info.value)
    assert f"task {name}" in message and str(task.dockerfile) in message
    assert "marker-42" in message  # the command's own output, from the build log's tail
    assert "build_network" not in message  # nothing here asked for the network
    assert not any(t.startswith(f"t1jax-task/{name}:")
                   for img in docker_backend.client.images.list() for t in img.tags)


def test_a_build_that_needs_the_network_says_which_key_gives_it(docker_backend, tmp_path,
                                                                 unique):
    """Builds get no network by default; apt's resolver errors alone do not say why, so the
    error names --config.sandbox.build_network=host."""
    name = f"apt-build-{unique}"
    task = load_task(write_task(tmp_path, name, f"FROM {BASE}\nRUN apt-get update && "
                                "apt-get install -y --no-install-recommends sl\n"))
    with pytest.raises(SandboxError) as info:
        docker_backend.build(task)
    message = str(info.value)
    assert f"task {name}" in message and "--config.sandbox.build_network=host" in message
    assert "Temporary failure resolving" in message  # apt's own words stay in the tail


def test_base_map_from_the_run_config():
    """config.sandbox.base_map adds to (or overrides) the default map; a malformed entry is a
    usage error naming the key and the form."""
    from t1jax.jobs import UsageError
    from t1jax.jobs.build import base_map
    got = base_map(" node:20=my/node:20 ,*=t1jax/base:bookworm")
    assert got["node:20"] == "my/node:20" and got["*"] == BASE
    assert got["ubuntu:24.04"] == images.DEFAULT_BASE_MAP["ubuntu:24.04"]
    assert base_map("") == images.DEFAULT_BASE_MAP
    with pytest.raises(UsageError, match=r"config\.sandbox\.base_map: 'node:20' is not "
                                         r"PUBLIC=LOCAL"):
        base_map("node:20")


def test_docker_image_task_uses_the_named_image(docker_backend, tmp_path):
    d = tmp_path / "prebuilt"
    d.mkdir()
    (d / "task.toml").write_text(f'schema_version = "1.1"\n[environment]\ndocker_image = "{BASE}"\n')
    (d / "instruction.md").write_text("Do it.\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n")
    task = load_task(d)
    assert task.dockerfile is None
    assert docker_backend.build(task) == BASE
    missing = f"example.invalid/t1jax-prebuilt-{uuid.uuid4().hex[:8]}:1"
    (d / "task.toml").write_text(f'schema_version = "1.1"\n[environment]\ndocker_image = "{missing}"\n')
    with pytest.raises(SandboxError, match="docker_image"):
        DockerBackend(base_map={}).build(load_task(d))


def test_a_stand_in_left_under_a_public_name_is_not_taken_for_it(docker_backend, tmp_path,
                                                                   cleanup, unique):
    """t1jax before issue #45 tagged stand-ins with public names. Such a tag is not taken for
    the public image: offline the build substitutes the stand-in as for an absent base; with
    the registry it is pulled (here a closed loopback registry: the pull fails, named)."""
    client = docker_backend.client
    public = f"localhost:1/t1jax-test/stale-{unique}:1"
    client.images.get(BASE).tag(public.rsplit(":", 1)[0], "1")
    cleanup.append(public)
    d = write_task(tmp_path, f"stale-{unique}", f"FROM {public}\nRUN echo ok > /ok.txt\n")
    tag = DockerBackend(base_map={public: BASE}).build(load_task(d))
    cleanup.append(tag)
    assert tag.startswith("t1jax-task/")
    with pytest.raises(SandboxError, match=r"pulling 'localhost:1/t1jax-test/stale-"):
        DockerBackend(registry=True).build(load_task(d))


def test_registry_mode_uses_prebuilt_images_and_pulls(docker_backend, tmp_path, cleanup, unique):
    """sandbox.registry=True is Harbor's way where the registry is reachable: a task's prebuilt
    docker_image is used as it is (the Dockerfile beside it is not built), and one that is absent
    is pulled; a failed pull names the image and the offline way. The registry here is a closed
    loopback port: nothing leaves the machine."""
    import io
    client = docker_backend.client
    prebuilt = f"localhost:1/t1jax-test/prebuilt-{unique}:1"
    # an image of its own (the stand-in itself under this name would be taken for a tag an
    # older t1jax left: test_a_stand_in_left_under_a_public_name_is_not_taken_for_it)
    client.images.build(fileobj=io.BytesIO(f"FROM {BASE}\nLABEL t1jax.test={unique}\n".encode()),
                        tag=prebuilt, rm=True, network_mode="none")
    cleanup.append(prebuilt)
    d = write_task(tmp_path, f"prebuilt-{unique}", f"FROM {BASE}\nRUN echo built > /built.txt\n")
    (d / "task.toml").write_text(f'schema_version = "1.1"\n[environment]\n'
                                 f'docker_image = "{prebuilt}"\n')
    task = load_task(d)
    assert DockerBackend(registry=True).build(task) == prebuilt
    built = DockerBackend().build(task)  # offline: the Dockerfile, on the local base
    cleanup.append(built)
    assert built.startswith("t1jax-task/") and built != prebuilt
    missing = f"localhost:1/t1jax-test/missing-{unique}:1"
    (d / "task.toml").write_text(f'schema_version = "1.1"\n[environment]\n'
                                 f'docker_image = "{missing}"\n')
    with pytest.raises(SandboxError, match=r"pulling 'localhost:1/.*registry=False"):
        DockerBackend(registry=True).build(load_task(d))
