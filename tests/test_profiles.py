"""Device profiles: the bundled files load, carry a source for every number, and bad names or files are explained."""

from __future__ import annotations

import re
import tomllib
from importlib import resources

import pytest

from edge.errors import EdgeError
from edge.memory.budget import GiB
from edge.memory.profiles import KINDS, ProfileError, load_profile, parse_profile, profile_names

EXPECTED = {"cpu-laptop-8gb", "cpu-laptop-16gb", "laptop-rtx3050-4gb", "laptop-rtx4050-6gb", "laptop-rtx4060-8gb",
            "desktop-12gb", "desktop-24gb", "jetson-orin-8gb"}
NOMINAL_GIB = {"cpu-laptop-8gb": 8, "cpu-laptop-16gb": 16, "laptop-rtx3050-4gb": 4, "laptop-rtx4050-6gb": 6,
               "laptop-rtx4060-8gb": 8, "desktop-12gb": 12, "desktop-24gb": 24, "jetson-orin-8gb": 8}


def test_bundled_profiles_are_the_issue_s_devices():
    assert set(profile_names()) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_profile_loads_with_sane_numbers(name):
    p = load_profile(name)
    assert p.name == name and p.kind in KINDS and p.description
    # the budget is what the model may use: less than the device's memory, more than a third of it
    assert NOMINAL_GIB[name] * GiB / 3 < p.memory_bytes < NOMINAL_GIB[name] * GiB
    assert 10e9 <= p.memory_bandwidth <= 2000e9
    assert 0.1e9 <= p.disk_read_bandwidth <= 20e9
    if p.kind == "cuda":
        assert re.fullmatch(r"\d\.\d", p.compute_capability)
        assert p.runtime_overhead_bytes and p.runtime_overhead_bytes > 0
        assert 20e-6 <= p.layer_dispatch_seconds <= 1e-3  # launches bound a GPU's step (planner)
    else:
        assert p.runtime_overhead_bytes is None  # the measured CPU overhead applies
        assert p.layer_dispatch_seconds == 0.0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_number_has_a_source_comment(name):
    """Each key is preceded by a comment that says where its value comes from."""
    lines = (resources.files("edge.profiles") / f"{name}.toml").read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\w+\s*=", line) and not line.startswith(("description", "kind")):
            assert lines[i - 1].startswith("#"), f"{name}.toml: {line!r} has no source comment above it"


def test_known_values():
    gpu = load_profile("laptop-rtx4060-8gb")
    assert gpu.memory_bandwidth == 256e9 and gpu.compute_capability == "8.9" and gpu.kind == "cuda"
    assert load_profile("jetson-orin-8gb").compute_capability == "8.7"
    assert load_profile("cpu-laptop-8gb").memory_bandwidth == 51.2e9


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ProfileError) as err:
        load_profile("raspberry-pi")
    assert isinstance(err.value, EdgeError)
    for name in EXPECTED:
        assert name in str(err.value)


def test_profile_from_a_file(tmp_path):
    path = tmp_path / "my-box.toml"
    path.write_text('kind = "cpu"\nmemory_gib = 3\nmemory_bandwidth_gb_s = 20\ndisk_read_gb_s = 0.5\n'
                    'compute_capability = "neon"\n')
    p = load_profile(str(path))
    assert (p.name, p.memory_bytes, p.memory_bandwidth, p.disk_read_bandwidth) == ("my-box", 3 * GiB, 20e9, 0.5e9)
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(str(tmp_path / "missing.toml"))
    path.write_text("kind = \n")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(str(path))


@pytest.mark.parametrize("change,message", [
    ({"kind": "tpu"}, "kind"), ({"memory_gib": 0}, "memory_gib"), ({"disk_read_gb_s": "fast"}, "disk_read_gb_s"),
    ({"layer_dispatch_us": -1}, "layer_dispatch_us"),
])
def test_malformed_profiles_are_explained(change, message):
    data = tomllib.loads((resources.files("edge.profiles") / "cpu-laptop-8gb.toml").read_text()) | change
    with pytest.raises(ProfileError, match=message):
        parse_profile(data, "x")


def test_missing_field_is_named():
    data = tomllib.loads((resources.files("edge.profiles") / "cpu-laptop-8gb.toml").read_text())
    del data["compute_capability"]
    with pytest.raises(ProfileError, match="lacks compute_capability"):
        parse_profile(data, "x")
