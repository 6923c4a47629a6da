"""ResourceConfig strings, op tags, and the dagster-k8s config they carry."""

from __future__ import annotations

import json

import pytest
from dagster_k8s.job import get_user_defined_k8s_config
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_dagster.iris import (
    GPU_TYPES,
    K8S_CONFIG_TAG,
    RESOURCES_TAG,
    TPU_GENERATIONS,
    CpuConfig,
    GpuConfig,
    ResourceConfig,
    ResourceConfigError,
    TpuConfig,
)
from marin_dagster.iris.resource_config import GPUS_PER_HOST


@pytest.mark.parametrize(
    "text, device, cpu, count",
    [
        ("cpu", CpuConfig(), 1, 0),
        ("cpu:4", CpuConfig(), 4, 0),
        ("gpu:1", GpuConfig("any", 1), 1, 1),
        ("gpu:h100", GpuConfig("h100", 1), 1, 1),
        ("gpu:h100x8", GpuConfig("h100", 8), 1, 8),
        ("tpu:v5e-8", TpuConfig("v5e-8"), 1, 8),
        ("tpu:v6e-4", TpuConfig("v6e-4"), 1, 4),
        ("tpu:v4-8", TpuConfig("v4-8"), 1, 4),  # v4 names count TensorCores, 2 per chip
    ],
)
def test_parse(text, device, cpu, count):
    rc = ResourceConfig.parse(text)
    assert rc.device == device
    assert rc.cpu == cpu
    assert rc.accelerator_count == count
    assert rc.needs_accelerator == (count > 0)
    assert rc.to_string() == text


def test_options_and_aliases():
    rc = ResourceConfig.parse("gpu:a100-80gbx4 cpu=8 ram=64g disk=200g preemptible=false")
    assert (rc.cpu, rc.ram, rc.disk, rc.preemptible) == (8, "64g", "200g", False)
    assert rc.device == GpuConfig("a100-80gb", 4)
    assert ResourceConfig.parse("tpu:v5litepod-8") == ResourceConfig.parse("tpu:v5e-8")
    assert ResourceConfig(ram="4096Mi") == ResourceConfig(ram="4g")


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("gpu:x100", ["unknown GPU type 'x100'", "h100", "a100"]),
        ("tpu:v9-8", ["unknown TPU type", "v5e", "v6e"]),
        ("fpga:1", ["unknown device 'fpga'", "cpu[:N]"]),
        ("gpu:h100 ram=lots", ["ram='lots' is not a size"]),
        ("gpu:h100 colour=red", ["option 'colour=red'"]),
        ("cpu:-1", ["cpu must be positive"]),
        ("tpu:v4-7", ["multiple of 2"]),
        ("tpu:v5e-6", ["not a power of two"]),
        ("tpu", ["name the TPU slice"]),
        ("tpu:v5e-0", ["at least one chip", "tpu:v5e-4"]),
        ("tpu:v4-0", ["at least one chip", "tpu:v4-8"]),
        ("gpu:h100x0", ["GPU count must be at least 1"]),
        ("cpu replicas=2", ["replicas=2", "CPU-only", "cpu=N"]),
        ("gpu:h100x9", ["at most 8 H100 GPUs", "'gpu:h100x8 replicas=2'"]),
        ("gpu:t4x5", ["at most 4 T4 GPUs", "'gpu:t4x4 replicas=2'"]),
        ("gpu:17", ["at most 16 GPUs", "'gpu:16 replicas=2'"]),
        ("cpu ram=0", ["ram='0' must be more than nothing", "ram=4g"]),
        ("gpu:1 disk=0g", ["disk='0g' must be more than nothing", "disk=10g"]),
        ("tpu:v5e-8 replicas=2", ["2 TPU slices (multislice)", "tpu:v5e-16"]),
        ("tpu:v4-8 replicas=4", ["4 TPU slices", "tpu:v4-32"]),
        ("", ["expected a string"]),
    ],
)
def test_bad_strings_say_what_and_where(text, fragments):
    with pytest.raises(ResourceConfigError) as e:
        ResourceConfig.parse(text)
    assert str(e.value).startswith(f"resources={text!r}")
    for fragment in fragments:
        assert fragment in str(e.value)


@pytest.mark.parametrize(
    "text, selector, limit, topology",
    [
        (
            "gpu:h100x8",
            {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
            ("nvidia.com/gpu", "8"),
            None,
        ),
        ("gpu:2", {}, ("nvidia.com/gpu", "2"), None),
        (
            "tpu:v5e-8",
            {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"},
            ("google.com/tpu", "8"),
            "2x4",
        ),
        (
            "tpu:v6e-4",
            {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"},
            ("google.com/tpu", "4"),
            "2x2",
        ),
        (
            "tpu:v4-8",
            {"cloud.google.com/gke-tpu-accelerator": "tpu-v4-podslice"},
            ("google.com/tpu", "4"),
            "2x2x1",
        ),
    ],
)
def test_op_tags_carry_k8s_config(text, selector, limit, topology):
    rc = ResourceConfig.parse(text)
    tags = rc.to_op_tags()
    assert tags[RESOURCES_TAG] == text
    assert ResourceConfig.from_op_tags(tags) == rc
    # dagster-k8s itself accepts the tag (it validates against its schema).
    parsed = get_user_defined_k8s_config(tags)
    resources = parsed.container_config["resources"]
    assert resources["limits"][limit[0]] == limit[1]
    assert resources["requests"]["memory"] == "4Gi"
    node_selector = parsed.pod_spec_config["node_selector"] if selector or topology else {}
    for k, v in selector.items():
        assert node_selector[k] == v
    if topology:
        assert node_selector["cloud.google.com/gke-tpu-topology"] == topology
    keys = {t["key"] for t in parsed.pod_spec_config["tolerations"]}
    assert limit[0] in keys and "cloud.google.com/gke-spot" in keys


def test_cpu_and_not_preemptible_k8s_config():
    config = json.loads(
        ResourceConfig.parse("cpu:2 preemptible=false").to_op_tags()[K8S_CONFIG_TAG]
    )
    assert config["container_config"]["resources"]["requests"]["cpu"] == "2"
    assert "nvidia.com/gpu" not in config["container_config"]["resources"]["limits"]
    terms = config["pod_spec_config"]["affinity"]["node_affinity"][
        "required_during_scheduling_ignored_during_execution"
    ]["node_selector_terms"]
    assert {"key": "cloud.google.com/gke-spot", "operator": "DoesNotExist"} in terms[0][
        "match_expressions"
    ]
    assert ResourceConfig.from_op_tags({}) == ResourceConfig()


def test_multi_host_tpu_shape():
    device = ResourceConfig.parse("tpu:v5e-16").device
    assert (device.chips, device.hosts, device.chips_per_host, device.topology) == (16, 4, 4, "4x4")
    device = ResourceConfig.parse("tpu:v5p-16").device
    assert (device.chips, device.hosts, device.topology) == (8, 2, "2x2x2")


devices = st.one_of(
    st.just(CpuConfig()),
    st.sampled_from(["any", *GPU_TYPES]).flatmap(
        lambda variant: st.builds(
            GpuConfig,
            st.just(variant),
            st.integers(1, GPUS_PER_HOST.get(variant, 8)),
        )
    ),
    st.builds(
        lambda gen, chips: TpuConfig(
            f"{gen}-{chips * TPU_GENERATIONS[gen].cores_per_chip_in_name}"
        ),
        st.sampled_from(sorted(TPU_GENERATIONS)),
        st.sampled_from([1, 2, 4, 8, 16, 32]),
    ),
)


@settings(max_examples=25, deadline=None)
@given(
    device=devices,
    cpu=st.sampled_from([1, 2, 0.5, 16]),
    ram=st.sampled_from(["4g", "512m", "1t", "3g"]),
    preemptible=st.booleans(),
    replicas=st.integers(1, 4),
)
def test_canonical_string_round_trips(device, cpu, ram, preemptible, replicas):
    if not isinstance(device, GpuConfig):
        replicas = 1  # several replicas are GPU hosts; refused on CPU and TPU (multislice)
    rc = ResourceConfig(cpu=cpu, ram=ram, device=device, preemptible=preemptible, replicas=replicas)
    assert ResourceConfig.parse(rc.to_string()) == rc
    assert ResourceConfig.from_op_tags(rc.to_op_tags()) == rc


def test_marins_constructors_equal_the_strings():
    assert ResourceConfig.with_cpu() == ResourceConfig.parse("cpu")
    assert ResourceConfig.with_cpu(cpu=8, ram="32g") == ResourceConfig.parse("cpu:8 ram=32g")
    assert ResourceConfig.with_gpu("H100", 8, replicas=2) == ResourceConfig.parse(
        "gpu:h100x8 replicas=2"
    )
    assert ResourceConfig.with_gpu() == ResourceConfig.parse("gpu:1")
    assert ResourceConfig.with_tpu("v5e-8") == ResourceConfig.parse("tpu:v5e-8")
    with pytest.raises(ResourceConfigError, match="unknown GPU type"):
        ResourceConfig.with_gpu("h999")


@pytest.mark.parametrize(
    "text, fragments",
    [
        # int(float(...)) once made these 2 and 1 hosts.
        ("gpu:1 replicas=2.7", ["replicas=2.7 is not a whole number", "replicas=2"]),
        ("gpu:1 replicas=1.5", ["replicas=1.5 is not a whole number"]),
        # A bare number was bytes: a 16-byte memory limit kills the pod at once.
        ("gpu:1 ram=16", ["ram='16' has no unit", "ram=16g"]),
        ("gpu:1 disk=200", ["disk='200' has no unit", "disk=200g"]),
        # The last value used to win silently.
        ("gpu:1 replicas=2 replicas=1", ["replicas is given more than once"]),
        ("gpu:1 ram=8g ram=16g", ["ram is given more than once"]),
        ("cpu:4 cpu=8", ["cpu is given more than once"]),
    ],
)
def test_misread_values_are_refused(text, fragments):
    with pytest.raises(ResourceConfigError) as e:
        ResourceConfig.parse(text)
    assert str(e.value).startswith(f"resources={text!r}")
    for fragment in fragments:
        assert fragment in str(e.value)


def test_sizes_need_a_unit_in_python_too():
    with pytest.raises(ResourceConfigError, match=r"ram=16 has no unit.*ram=16g"):
        ResourceConfig(ram=16)
    with pytest.raises(ResourceConfigError, match=r"disk=200 has no unit"):
        ResourceConfig.with_gpu("h100", disk=200)
    # Bytes stay expressible, and a size that is no whole KiB still round-trips.
    rc = ResourceConfig(ram="1536b", disk="1.3g")
    assert rc.ram_bytes == 1536
    assert ResourceConfig.parse(rc.to_string()) == rc


def test_replicas_true_is_not_one_host():
    """Python counts True as the integer 1: ResourceConfig(replicas=True) passed."""
    with pytest.raises(ResourceConfigError, match=r"replicas=True must be a positive integer"):
        ResourceConfig(replicas=True)
