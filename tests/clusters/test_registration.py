"""registration.dropped: the kubelet's own lines decide whether a plugin's newest
registration was dropped (a v1.34 kubelet closing the new client, a v1.37 one refusing it),
from lines as the labs' kubelets wrote them."""

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


def test_the_old_stream_ending_before_the_register_is_no_drop() -> None:
    assert registration.dropped([EOF_OLD, ASKED], GPU) == []


def test_the_old_stream_ending_after_the_register_closes_the_new_client() -> None:
    # CI of 6ce3276 (kubelet v1.34.0): Register, the old stream's EOF, the new one closed.
    lines = [ASKED, EOF_OLD, CLOSED]
    assert registration.dropped(lines, GPU) == lines


def test_a_refused_register_is_a_drop() -> None:
    assert registration.dropped([EOF_OLD, ASKED, REFUSED], GPU) == [ASKED, REFUSED]


def test_a_later_register_stands_after_a_drop() -> None:
    assert registration.dropped([ASKED, EOF_OLD, CLOSED, ASKED], GPU) == []


def test_another_resource_and_no_register_are_no_drop() -> None:
    other = CLOSED.replace('"nvidia.com/gpu"', '"nvidia.com/mig-1g.10gb"')
    assert registration.dropped([ASKED, other], GPU) == []
    assert registration.dropped([CLOSED], GPU) == []
    assert registration.dropped([ASKED, CLOSED.replace(GPU, f"{GPU}.shared")], GPU) == []
