"""bench/kueue_bench.py and clusters/labs/kueue.py without a cluster: the quota's objects as
Kueue reads them, the Workload watch's bookkeeping (admissions, finishes, each flavor's
peak use against its quota), the checks on where pods went, the CLI's refusals."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from rich.console import Console

from bench import kueue_bench as kb
from clusters.labs import fleet, kueue

A100, T4 = "NVIDIA-A100-SXM4-80GB", "Tesla-T4"


def node(name: str, labels: dict[str, str], gpus: int = 0) -> client.V1Node:
    return client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels),
                         status=client.V1NodeStatus(capacity={kueue.GPU: str(gpus)}))  # fmt: skip


def test_products_are_gfds_labels_with_their_gpus_and_unlabelled_nodes_count_for_none() -> None:
    nodes = [node("a-0", {kueue.PRODUCT: A100, "nvidia.com/gpu.count": "8"}),
             node("a-1", {kueue.PRODUCT: A100}, gpus=8),  # no count label: its capacity
             node("t-0", {kueue.PRODUCT: T4, "nvidia.com/gpu.count": "2"}),
             node("cpu", {})]  # fmt: skip
    assert kueue.products(nodes) == {A100: 16, T4: 2}


def test_a_flavor_is_its_products_nodes_and_tolerates_kwoks_taint() -> None:
    f = kueue.resource_flavor(A100)
    assert f["metadata"]["name"] == "nvidia-a100-sxm4-80gb"
    assert f["spec"]["nodeLabels"] == {kueue.PRODUCT: A100}
    assert f["spec"]["tolerations"] == [fleet.TOLERATION]
    assert kueue.flavor_name("Tesla T4 (PCIe)") == "tesla-t4-pcie"


def test_the_cluster_queue_holds_a_gpu_quota_per_flavor_in_order() -> None:
    cq = kueue.cluster_queue("q", {T4: 1, A100: 4})
    [group] = cq["spec"]["resourceGroups"]
    assert group["coveredResources"] == [kueue.GPU]
    assert group["flavors"] == [
        {"name": "tesla-t4", "resources": [{"name": kueue.GPU, "nominalQuota": 1}]},
        {"name": "nvidia-a100-sxm4-80gb", "resources": [{"name": kueue.GPU, "nominalQuota": 4}]},
    ]
    lq = kueue.local_queue("gpus", "ns", "q")
    assert (lq["metadata"]["namespace"], lq["spec"]["clusterQueue"]) == ("ns", "q")


def test_a_job_is_queued_suspended_asks_its_gpus_and_goes_to_fleet_nodes_only() -> None:
    j = kueue.job("j-1", "gpus", "img", gpus=2)
    assert j["metadata"]["labels"] == {kueue.QUEUE_LABEL: "gpus"}
    assert j["spec"]["suspend"] is True
    pod = j["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"limits": {kueue.GPU: "2"}}
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]  # fmt: skip
    assert term["matchExpressions"] == [{"key": fleet.FLEET_LABEL, "operator": "Exists"}]
    assert "tolerations" not in pod  # the flavor's, added by Kueue at admission


def test_a_job_with_a_command_runs_on_a_kubelets_node() -> None:
    j = kueue.job("j-1", "gpus", "img", command=["sleep", "3"])
    pod = j["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["sleep", "3"]
    assert "affinity" not in pod and j["spec"]["suspend"] is True


class FakeCustom:
    def list_namespaced_custom_object(self, *args: Any, **kw: Any) -> dict:
        return {"metadata": {"resourceVersion": "7"}, "items": []}


def workload(job: str, flavor: str | None = None, finished: bool = False, rv: str = "8") -> dict:
    status: dict = {}
    if flavor:
        status["admission"] = {"podSetAssignments": [{"flavors": {kueue.GPU: flavor}}]}
    if finished:
        status["conditions"] = [{"type": "Finished", "status": "True"}]
    refs = [{"kind": "Job", "name": job}]
    return {"metadata": {"name": f"job-{job}-abcde", "resourceVersion": rv,
                         "ownerReferences": refs}, "status": status}  # fmt: skip


def test_the_watch_takes_admissions_and_finishes_and_each_flavors_peak_use() -> None:
    w = kb.Workloads(FakeCustom(), "ns")  # type: ignore[arg-type]
    w.quota = {"a100": 2}
    for t, (job, flavor, done) in enumerate([
        ("j1", None, False),  # created: queued
        ("j1", "a100", False), ("j2", "a100", False),  # admitted: use 2
        ("j1", "a100", False),  # seen again: counted once
        ("j1", "a100", True),  # finished: its quota back
        ("j3", "a100", False),  # use 2 again, never 3
    ]):  # fmt: skip
        w.seen({"type": "MODIFIED", "object": workload(job, flavor, done, rv=str(10 + t))},
               now=float(t))  # fmt: skip
    assert w.admitted == {"j1": (1.0, "a100"), "j2": (2.0, "a100"), "j3": (5.0, "a100")}
    assert w.finished == {"j1": 4.0}
    assert (w.use, w.peak, w.over) == ({"a100": 2}, {"a100": 2}, [])
    assert w.version == "15"
    w.seen({"type": "ADDED", "object": workload("j4", "a100", rv="16")}, now=6.0)
    assert w.over == ["j4 on a100: 3 > 2"]


def test_the_figures_come_from_when_each_job_was_created_admitted_and_finished() -> None:
    w = kb.Workloads(FakeCustom(), "ns")  # type: ignore[arg-type]
    w.admitted = {"j1": (11.0, "a100"), "j2": (12.0, "t4")}
    w.finished = {"j1": 13.0}
    w.peak = {"a100": 1, "t4": 1}
    r = kb.Result(copies=2, nodes=6, jobs=3,
                  flavors={"a100": kb.Flavor(A100, 16, 8), "t4": kb.Flavor(T4, 4, 2)})  # fmt: skip
    kb.summarize(r, {"j1": 10.0, "j2": 10.0, "j3": 10.0}, w)
    assert (r.admitted, r.finished, r.wall_s) == (2, 1, 3.0)
    assert r.admitted_per_s == 1.0  # two admitted in the 2 s to the last admission
    assert (r.admit_p50_s, r.finish_p99_s) == (kb.pct([1.0, 2.0], 50), 3.0)
    assert r.flavors["a100"].peak == 1
    assert not kb.ok(r)  # one job never admitted, one never finished
    r.admitted = r.finished = 3
    assert kb.ok(r)
    r.over_quota = 1
    assert not kb.ok(r)
    Console(width=200, file=None, quiet=True).print(kb.table(r))
    assert "admitted 3, finished 3 in 3.0 s: 1.0 admitted/s" in kb.summary(r)


def test_a_pod_on_a_node_of_another_product_than_its_flavors_is_wrong() -> None:
    def pod(name: str, job: str, node_name: str | None) -> client.V1Pod:
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels={"job-name": job}),
                            spec=client.V1PodSpec(containers=[], node_name=node_name))  # fmt: skip

    products = {"a-0": A100, "t-0": T4}
    flavors = {"j1": kueue.flavor_name(A100), "j2": kueue.flavor_name(A100), "j3": "tesla-t4"}
    pods = [pod("p1", "j1", "a-0"), pod("p2", "j2", "t-0"), pod("p3", "j3", None)]
    assert kb.wrong_nodes(pods, products, flavors) == [
        f"p2 on t-0 ({T4}), flavor nvidia-a100-sxm4-80gb"
    ]


def test_a_webhook_not_serving_yet_is_retried_and_a_refusal_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    class Api:
        def create_cluster_custom_object(self, *args: Any) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise client.ApiException(status=500, reason="failed calling webhook")
            if len(calls) == 3:
                raise client.ApiException(status=422, reason="Invalid")

    monkeypatch.setattr(kueue, "custom", lambda ctx: Api())
    monkeypatch.setattr(kueue.steps.time, "sleep", lambda s: None)
    kueue.create(None, kueue.resource_flavor(A100))  # type: ignore[arg-type]
    assert len(calls) == 2
    with pytest.raises(client.ApiException, match="Invalid"):
        kueue.create(None, kueue.resource_flavor(T4))  # type: ignore[arg-type]


def test_a_stalled_run_says_where_its_pods_are_and_why_one_is_pending() -> None:
    def pod(name: str, phase: str, said: str = "") -> client.V1Pod:
        conds = [client.V1PodCondition(type="PodScheduled", status="False", message=said)]
        status = client.V1PodStatus(phase=phase, conditions=conds if said else None)
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name), status=status)

    pods = [pod("a", "Succeeded"), pod("b", "Pending", "0/150 nodes are available"),
            pod("c", "Pending", "other"), pod("d", "Succeeded")]  # fmt: skip
    assert kb.stalled(pods) == "2 Pending, 2 Succeeded; b: 0/150 nodes are available"
    assert kb.stalled([]) == "no pods"


@pytest.mark.parametrize("args, says", [
    (["--share", "0"], "--share 0.0: more than 0"),
    (["--share", "1.5"], "at most 1"),
    (["--copies", "0"], "--copies 0, --jobs 1000: 1 or more"),
    (["--qps", "0"], "--qps 0: 1 or more"),
])  # fmt: skip
def test_bad_arguments_are_refused_before_anything_runs(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(kb, "Lab", lambda name: pytest.fail(f"lab {name} made"))
    with pytest.raises(SystemExit) as e:
        kb.main(args)
    assert e.value.code == 2
    assert says in capsys.readouterr().err
