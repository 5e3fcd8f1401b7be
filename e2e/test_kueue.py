"""Kueue (sigs.k8s.io/kueue, clusters/labs/kueue.py), the batch queue users run above the
scheduler, on the `operator` lab: its GPU node's H100s served by the plugin the GPU Operator
deployed and labelled by its GFD. A ResourceFlavor from GFD's product label and a
ClusterQueue with a quota of fewer GPUs than the node has: Kueue admits Jobs within the
quota and keeps the rest queued, a free GPU on the node notwithstanding; each admitted
Job's pod gets one of the node's GPUs from the operator's plugin and ends, its quota comes
back and the next Job is admitted. `make bench-kueue` runs the same objects with 1,000
Jobs on a KWOK fleet (docs/fleet.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from clusters import built
from clusters.labs import kueue, spec
from clusters.labs.lab import Lab
from e2e.fixtures import lab_fixture
from e2e.verdict import Verdict

# The platform above the node, on the operator's lab: `make test`'s platform lane.
pytestmark = pytest.mark.platform

LAB = spec.load("operator")
NODE = LAB.gpu_nodes[0].name
GPUS = LAB.gpu_nodes[0].gpu_count
NS = "gpulab-kueue"
QUEUE, CLUSTER_QUEUE = "gpus", "gpulab-gpus"
QUOTA = GPUS - 1  # below the node's GPUs: the quota, not the node, holds the rest back
JOBS = QUOTA + 2
HOLD_S = 4  # each Job's pod holds its GPU this long: a use past the quota would be seen


@lab_fixture(LAB.name, scope="module")
def queued(labs: Callable[..., Lab]) -> Iterator[Lab]:
    """The operator lab with Kueue running, and a namespace for the Jobs; all of it gone
    afterwards (a kept lab's next run installs it again; 5 s here)."""
    lab = labs(LAB.name)
    try:
        image = kueue.image(lab.ctx)
    except built.InfraMissing as e:
        pytest.fail(str(e), pytrace=False)
    kueue.install(lab.ctx, image)
    lab.ensure_namespace(NS)
    yield lab
    batch = client.BatchV1Api(lab.kube.api)
    batch.delete_collection_namespaced_job(NS, propagation_policy="Background")
    kueue.uninstall(lab.ctx, image)
    lab.core.delete_namespace(NS)


def gpu_nodes(listing: str) -> set[str]:
    """The GPU device nodes (nvidia<minor>) in a container's `ls /dev`."""
    return {e for e in listing.split() if re.fullmatch(r"nvidia\d+", e)}


def workloads(lab: Lab) -> list[dict]:
    return kueue.custom(lab.ctx).list_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, NS, "workloads")["items"]  # fmt: skip


def test_jobs_are_admitted_within_the_gpu_quota_and_the_rest_queued(
    queued: Lab, verdict: Verdict
) -> None:
    """JOBS one-GPU Jobs at once in a queue with a quota of QUOTA GPUs on the node's
    product: QUOTA admitted and JOBS - QUOTA queued at first; never more than QUOTA admitted
    and unfinished (sampled every 0.25 s; a pod holds its GPU HOLD_S); every Job admitted
    on the product's flavor and finished; each pod ran on the node with one of its GPUs."""
    labels = queued.core.read_node(NODE).metadata.labels or {}
    product = labels[kueue.PRODUCT]
    flavor = kueue.flavor_name(product)
    # A GPU's device node, as the nvidia runtime gives it to the container (its CDI spec);
    # the container's NVIDIA_VISIBLE_DEVICES is `void` there once the runtime has read it.
    minors = {f"nvidia{g.minor if g.minor >= 0 else g.index}"
              for g in queued.fake_gpus(NODE).node().gpus}  # fmt: skip
    verdict.expect(f"{QUOTA} admitted, {JOBS - QUOTA} queued; at most {QUOTA} at a time; all "
                   f"{JOBS} finished on {flavor}, each with one of {NODE}'s GPUs")  # fmt: skip
    for doc in (kueue.resource_flavor(product),
                kueue.cluster_queue(CLUSTER_QUEUE, {product: QUOTA}),
                kueue.local_queue(QUEUE, NS, CLUSTER_QUEUE)):  # fmt: skip
        kueue.create(queued.ctx, doc)
    batch = client.BatchV1Api(queued.kube.api)
    hold = ["sh", "-c", f"ls /dev; sleep {HOLD_S}"]
    names = [f"gpu-job-{i}" for i in range(JOBS)]
    for name in names:
        batch.create_namespaced_job(NS, kueue.job(name, QUEUE, queued.images["workload"],
                                                  command=hold))  # fmt: skip
    peak, first, flavors = 0, None, {}
    end = time.monotonic() + 60 + JOBS * (HOLD_S + 30)
    while time.monotonic() < end:
        seen = workloads(queued)
        running = [w for w in seen if kueue.condition(w, "Admitted")
                   and not kueue.condition(w, "Finished")]  # fmt: skip
        peak = max(peak, len(running))
        for w in seen:
            if (f := kueue.admitted_flavor(w)) is not None:
                flavors[w["metadata"]["ownerReferences"][0]["name"]] = f
        if first is None and len(seen) == JOBS and running:
            first = (len(running), JOBS - len(running))
        if len(seen) == JOBS and all(kueue.condition(w, "Finished") for w in seen):
            break
        time.sleep(0.25)
    finished = sum(kueue.condition(w, "Finished") for w in workloads(queued))
    pods = queued.core.list_namespaced_pod(NS).items
    ran = {p.metadata.labels["job-name"]: (p.spec.node_name, p.status.phase, gpu_nodes(
               queued.core.read_namespaced_pod_log(p.metadata.name, NS)))
           for p in pods}  # fmt: skip
    verdict.saw(
        f"at first {first} (admitted, queued); peak {peak}; {finished} of {JOBS} "
        f"finished; flavors {sorted(set(flavors.values()))}; pods {sorted(ran.values())}"
    )
    verdict.property("admitted at once (peak)", peak)
    assert first == (QUOTA, JOBS - QUOTA)
    assert peak == QUOTA and finished == JOBS
    assert flavors == dict.fromkeys(names, flavor)
    assert sorted(ran) == names
    assert all(node == NODE and phase == "Succeeded" and len(gpus) == 1 and gpus <= minors
               for node, phase, gpus in ran.values()), ran  # fmt: skip
