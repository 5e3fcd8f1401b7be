"""`fakenvml persistenced`: the node's state for NVML in workload containers.

On a GPU host a container's NVML reaches the driver through the device nodes it was given;
here the "driver" is the node's state directory, which a workload container does not have.
NVIDIA's CDI specs (its DRA driver's, `nvidia-ctk cdi generate`'s) bind the driver root's
`run/nvidia-persistenced/socket` into every GPU container when it exists, as they do for
the real nvidia-persistenced. This daemon listens there and hands each connection an open
descriptor of the state directory (SCM_RIGHTS) after one line, FNV_PERSISTENCED_HELLO; the
library (src/state.c) reads the state through it and shows the container only the GPUs
whose /dev/nvidia<minor> it has, renumbered from 0, as the real driver does.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

SOCKET = "run/nvidia-persistenced/socket"  # under the driver root (src/fake.h)
HELLO = b"fakenvml-state 1"  # FNV_PERSISTENCED_HELLO


def socket_path(root: Path) -> Path:
    return root / SOCKET


def serve(root: Path, state_dir: Path, ready: Path | None = None) -> None:
    """Serves until killed. `ready`: a file touched once the socket listens."""
    if not (state_dir / "state.bin").is_file():
        raise SystemExit(f"fakenvml persistenced: no state in {state_dir} (run `fakenvml init`)")
    path = socket_path(root)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        # Bound through its directory's descriptor: a socket path is limited to 107 bytes,
        # which a driver root deep in a temporary directory can pass.
        where = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            server.bind(f"/proc/self/fd/{where}/{path.name}")
        finally:
            os.close(where)
        path.chmod(0o666)  # any container user may ask, as for the real daemon's socket
        server.listen(64)
    except OSError as e:
        server.close()
        raise SystemExit(f"fakenvml persistenced: cannot listen on {path}: {e.strerror}") from None
    with server:
        if ready is not None:
            ready.touch()
        while True:
            conn, _ = server.accept()
            with conn:
                fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    socket.send_fds(conn, [HELLO], [fd])
                except OSError:
                    pass  # the client went away: its loss
                finally:
                    os.close(fd)
