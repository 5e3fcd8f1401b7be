"""Node features in labs: NFD's own chart (rendered by the helm `make infra` built, from the
module `make infra` fetched) and the GFD DaemonSet, as a lab applies them."""

from __future__ import annotations

import yaml

from clusters.labs import features
from clusters.labs.lab import Lab

IMAGE = "gpulab/node-feature-discovery:v0.18.3-abc"


def test_nfd_chart_renders_crds_master_allowing_nvidia_labels_and_no_hooks() -> None:
    docs = features.nfd_docs(IMAGE, "v1.37.0")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("CustomResourceDefinition", "nodefeatures.nfd.k8s-sigs.io") in kinds
    assert {k for k, _ in kinds} >= {"Deployment", "DaemonSet", "ClusterRole"}
    conf = next(d for d in docs if d["metadata"]["name"].endswith("master-conf"))
    assert yaml.safe_load(conf["data"]["nfd-master.conf"]) == {"extraLabelNs": ["nvidia.com"]}
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
    assert {c["image"] for p in pods for c in p["containers"]} == {IMAGE}
    assert not [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]


def test_gfd_runs_the_nvidia_image_with_the_subjects_mig_strategy() -> None:
    for subject, strategy in (("gpulab", "none"), ("nvidia-mig", "mixed")):
        lab = Lab("mig", subject=subject)
        lab.images = {"gpulab": "gpulab/gpulab:1", "gfd": "gpulab/nvidia-device-plugin:v9"}
        docs = features.gfd_docs(lab.ctx, lab.serving.mig_strategy)
        assert "${" not in yaml.safe_dump_all(docs)
        ds = next(d for d in docs if d["kind"] == "DaemonSet")
        c = ds["spec"]["template"]["spec"]["containers"][0]
        assert c["image"] == "gpulab/nvidia-device-plugin:v9"
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["MIG_STRATEGY"] == strategy
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert "/sys/bus/pci/devices" in mounts  # the fake bus ids' PCI class: gpu.mode
