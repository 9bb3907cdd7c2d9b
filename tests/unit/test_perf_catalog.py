"""GPU catalog: lookup by SKU and node label, file extension, calibration."""

import json

import pytest

from specpilot.perf.catalog import DEFAULT_CATALOG, GpuCatalog, GpuSpec, UnknownGpuError, sku_for_node_label

BUILTIN_SKUS = {"A100-80GB-SXM", "H100-SXM", "H200", "B200", "L40S", "MI300X"}


def test_builtin_skus_and_datasheet_ceilings():
    assert set(DEFAULT_CATALOG.skus) == BUILTIN_SKUS
    h100 = DEFAULT_CATALOG.resolve("H100-SXM")
    assert (h100.hbm_bandwidth_gb_s, h100.bf16_dense_tflops) == (3350.0, 989.0)
    assert DEFAULT_CATALOG.resolve("MI300X").vendor == "amd"
    for spec in DEFAULT_CATALOG:
        assert spec.default_price_per_gpu_hour > 0
        assert spec.product_labels


@pytest.mark.parametrize(
    ("label", "sku"),
    [
        ("NVIDIA-H100-80GB-HBM3", "H100-SXM"),
        ("NVIDIA-H100-SXM5-80GB", "H100-SXM"),
        ("nvidia-h100-80gb-hbm3", "H100-SXM"),
        ("h100-sxm", "H100-SXM"),
        ("NVIDIA-H100-80GB-HBM3-SHARED", "H100-SXM"),
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB-SXM"),
        ("nvidia-h200-141gb", "H200"),
        ("NVIDIA-H200", "H200"),
        ("NVIDIA-B200", "B200"),
        ("NVIDIA-L40S", "L40S"),
        ("AMD_Instinct_MI300X", "MI300X"),
    ],
)
def test_node_labels_map_to_sku(label, sku):
    assert sku_for_node_label(label) == sku
    assert label in DEFAULT_CATALOG


@pytest.mark.parametrize(
    "label",
    ["NVIDIA-H100-PCIe", "NVIDIA-H100-NVL", "NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
     "NVIDIA-L4", "Tesla-T4"],
)
def test_other_products_are_not_guessed(label):
    with pytest.raises(UnknownGpuError) as excinfo:
        DEFAULT_CATALOG.resolve(label)
    message = str(excinfo.value)
    assert label in message and "H100-SXM" in message and "extend_from_file" in message
    assert isinstance(excinfo.value, KeyError)


def test_extend_from_yaml_file_adds_and_resolves(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "- sku: H100-PCIE\n"
        "  productLabels: [NVIDIA-H100-PCIe]\n"
        "  memoryGib: 79.6\n"
        "  hbmBandwidthGBs: 2000\n"
        "  bf16DenseTflops: 756\n"
        "  pricePerGpuHour: 2.0\n"
    )
    extended = DEFAULT_CATALOG.extend_from_file(path)
    spec = extended.resolve("nvidia-h100-pcie")
    assert spec.sku == "H100-PCIE" and spec.hbm_bandwidth_gb_s == 2000
    assert extended.resolve("NVIDIA-H100-80GB-HBM3").sku == "H100-SXM"
    assert "H100-PCIE" not in DEFAULT_CATALOG.skus  # the default catalog is untouched


def test_extend_from_json_file_replaces_same_sku(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{"sku": "L40S", "productLabels": ["NVIDIA-L40S"], "memoryGib": 45,
                                 "hbmBandwidthGBs": 864, "bf16DenseTflops": 366, "pricePerGpuHour": 0.7}]))
    extended = DEFAULT_CATALOG.extend_from_file(path)
    assert extended.resolve("L40S").default_price_per_gpu_hour == 0.7
    assert len(extended) == len(DEFAULT_CATALOG)


def test_extend_from_file_names_missing_keys(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text("- sku: X1\n  memoryGib: 10\n")
    with pytest.raises(ValueError, match=r"\[0\].*hbmBandwidthGBs.*bf16DenseTflops.*pricePerGpuHour"):
        DEFAULT_CATALOG.extend_from_file(path)


def test_with_calibration_replaces_ceilings_in_a_new_catalog():
    calibrated = DEFAULT_CATALOG.with_calibration("NVIDIA-H100-80GB-HBM3", bandwidth_gb_s=2900.0, bf16_tflops=700.0)
    spec = calibrated.resolve("H100-SXM")
    assert (spec.hbm_bandwidth_gb_s, spec.bf16_dense_tflops) == (2900.0, 700.0)
    assert spec.product_labels == DEFAULT_CATALOG.resolve("H100-SXM").product_labels
    assert DEFAULT_CATALOG.resolve("H100-SXM").hbm_bandwidth_gb_s == 3350.0
    with pytest.raises(ValueError, match="bandwidth_gb_s"):
        DEFAULT_CATALOG.with_calibration("H100-SXM", bandwidth_gb_s=0, bf16_tflops=700.0)


def test_spec_validation_names_the_field():
    with pytest.raises(ValueError, match="hbm_bandwidth_gb_s"):
        GpuSpec(sku="X", product_labels=(), memory_gib=1, hbm_bandwidth_gb_s=0, bf16_dense_tflops=1,
                default_price_per_gpu_hour=1)


def test_catalog_of_custom_specs():
    catalog = GpuCatalog([GpuSpec(sku="X9", product_labels=("ACME-X9-64GB",), memory_gib=64,
                                  hbm_bandwidth_gb_s=1000, bf16_dense_tflops=100, default_price_per_gpu_hour=1)])
    assert catalog.resolve("acme-x9-64gb").sku == "X9"
    assert "H100-SXM" not in catalog
