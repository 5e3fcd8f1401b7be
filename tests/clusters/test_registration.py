"""registration.newest: the kubelet's own lines decide whether a plugin's newest
registration was dropped (a v1.34 kubelet closing or forgetting the new client, a v1.37 one
refusing it), from lines as the labs' kubelets wrote them."""

from __future__ import annotations

from clusters.labs import registration

GPU = "nvidia.com/gpu"
EOF_OLD = ('E1207 05:59:47.568224     660 client.go:90] "ListAndWatch ended unexpectedly for '
           'device plugin" err="rpc error: code = Unavailable desc = error reading from server: '
           'EOF" resource="nvidia.com/gpu"')  # fmt: skip
ASKED = ('I1207 05:59:47.572518     660 server.go:160] "Got registration request from device '
         'plugin with resource" resourceName="nvidia.com/gpu"')  # fmt: skip
CLOSED = ('E1207 05:47:24.450251     765 client.go:90] "ListAndWatch ended unexpectedly for '
          'device plugin" err="rpc error: code = Canceled desc = grpc: the client connection '
          'is closing" resource="nvidia.com/gpu"')  # fmt: skip
# v1.37.0's pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go, as its klog writes it.
REFUSED = ('E1206 11:02:03.100000     701 handler.go:85] "Failed to connect to new client" '
           'err="device plugin already connected: /var/lib/kubelet/device-plugins/'
           'nvidia-gpu.sock" resource="nvidia.com/gpu" '
           'socketPath="/var/lib/kubelet/device-plugins/nvidia-gpu.sock"')  # fmt: skip


def dropped(lines: list[str]) -> list[str]:
    asked, shown = registration.newest(lines, GPU)
    assert asked == sum("registration request" in x and GPU + '"' in x for x in lines)
    return shown


def test_the_old_stream_ending_before_the_register_is_no_drop() -> None:
    assert dropped([EOF_OLD, ASKED]) == []


def test_the_old_stream_ending_after_the_register_closes_the_new_client() -> None:
    # CI of 6ce3276 (kubelet v1.34.0): Register, the old stream's EOF, the new one closed.
    lines = [ASKED, EOF_OLD, CLOSED]
    assert dropped(lines) == lines


def test_the_old_stream_ending_after_the_register_alone_is_a_drop() -> None:
    # CI of f9507d7 (kubelet v1.34.0, cold run): Register at .614093, the older stream's EOF
    # at .615097 and nothing more: the new client was still connecting, the kubelet forgot
    # it, and `nvidia.com/gpu` stayed allocatable after the plugin stopped serving it.
    lines = [EOF_OLD, ASKED, ASKED, EOF_OLD]
    assert dropped(lines) == [ASKED, EOF_OLD]


def test_a_refused_register_is_a_drop() -> None:
    assert dropped([EOF_OLD, ASKED, REFUSED]) == [ASKED, REFUSED]


def test_a_later_register_stands_after_a_drop() -> None:
    assert dropped([ASKED, EOF_OLD, CLOSED, ASKED]) == []


def test_another_resource_and_no_register_are_no_drop() -> None:
    other = CLOSED.replace('"nvidia.com/gpu"', '"nvidia.com/mig-1g.10gb"')
    assert dropped([ASKED, other]) == []
    assert dropped([CLOSED]) == []
    assert dropped([ASKED, CLOSED.replace(GPU, f"{GPU}.shared")]) == []
