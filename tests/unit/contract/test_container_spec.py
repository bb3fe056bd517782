"""A profile's `container:` key: every bad value is refused naming the key and what is allowed, and the job
script's MULTINODE_CONTAINER_* variables read back into the same spec (the launcher's side:
tests/unit/launching/test_container.py)."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.contract import protocol
from snakemake_executor_multinode.contract.container_spec import (
    ContainerError,
    ContainerSpec,
    describe,
    parse,
    read_variables,
    variables,
)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("podman", "t.container: must be a mapping"),
        (
            {"runtime": "docker", "image": "x"},
            "t.container.runtime: 'docker' is not a container runtime; allowed: pyxis",
        ),
        ({"runtime": "podman"}, "t.container.image: None is invalid"),
        ({"runtime": "podman", "image": "-x"}, "t.container.image: '-x' is invalid"),
        ({"runtime": "podman", "image": "a b"}, "t.container.image: 'a b' is invalid"),
        ({"runtime": "podman", "image": "x", "volumes": []}, "unknown key(s) ['volumes']; allowed: runtime, image"),
        ({"runtime": "podman", "image": "x", "mounts": "/a"}, "t.container.mounts: must be a list of strings"),
        ({"runtime": "podman", "image": "x", "mounts": ["data:/d"]}, "t.container.mounts: 'data:/d' is invalid"),
        ({"runtime": "podman", "image": "x", "mounts": ["/a:/b:z"]}, "SRC[:DST[:ro|rw]]"),
        ({"runtime": "podman", "image": "x", "mounts": ["/a,b:/b"]}, "without spaces, ',' or ':'"),
        ({"runtime": "podman", "image": "x", "flags": ["x"]}, "t.container.flags: 'x' is invalid: one option"),
        ({"runtime": "podman", "image": "x", "flags": ["--network=none"]}, "--network is set by the launcher"),
        ({"runtime": "podman", "image": "x", "flags": ["-v=/a:/a"]}, "use the key `mounts`"),
        ({"runtime": "apptainer", "image": "x", "flags": ["--nv"]}, "use the key `gpus`"),
        ({"runtime": "pyxis", "image": "x", "flags": ["--nodes=3"]}, "only srun's --container-*/--no-container-*"),
        ({"runtime": "pyxis", "image": "x", "flags": ["--container-image=y"]}, "use the key `image`"),
        (
            {"runtime": "pyxis", "image": "x", "gpus": "none"},
            "gpus: 'none' is invalid for runtime pyxis; allowed: auto",
        ),
        ({"runtime": "apptainer", "image": "x", "gpus": "cdi"}, "allowed: auto, none"),
        ({"runtime": "podman", "image": "x", "gpus": True}, "gpus: True is invalid for runtime podman"),
        ({"runtime": "podman", "image": "x", "workdir": "rel"}, "t.container.workdir: 'rel' is invalid"),
        ({"runtime": "podman", "image": "x", "python": "py thon"}, "t.container.python: 'py thon' is invalid"),
        ({"runtime": "podman", "image": "x", "env": ["A-B"]}, "t.container.env: 'A-B' is invalid"),
        ({"runtime": "apptainer", "image": "x", "env": ["A"]}, "only for runtime podman"),
    ],
)
def test_every_bad_value_is_refused_naming_the_key_and_what_is_allowed(value, message):
    with pytest.raises(ContainerError) as err:
        parse(value, "t.container")
    assert message in str(err.value)


def test_the_variables_read_back_into_the_spec_and_bad_ones_are_a_container_error():
    box = parse(
        {"runtime": "podman", "image": "localhost/t:1", "mounts": ["/d"], "flags": ["--annotation=a b"], "env": ["X"]},
        "t",
    )
    assert box is not None and read_variables(variables(box)) == box
    assert variables(box)[protocol.CONTAINER_FLAGS_VAR] == "'--annotation=a b'"  # shell words
    assert read_variables({}) is None
    with pytest.raises(ContainerError, match="MULTINODE_CONTAINER_\\* variables: container.runtime: 'docker'"):
        read_variables({protocol.CONTAINER_RUNTIME_VAR: "docker", protocol.CONTAINER_IMAGE_VAR: "x"})
    assert describe(ContainerSpec("pyxis", "nvcr.io#x")) == "pyxis image nvcr.io#x"
