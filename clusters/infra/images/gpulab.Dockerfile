# gpulab's Python package and the fake libnvidia-ml.so.1 (+ its libcuda stub) on the local
# base image.
# The fakenvml DaemonSet copies the library into the node's driver root; plugin pods load
# it from there (the way a driver container provides the real one).
FROM @BASE@
COPY site/ /usr/local/lib/python3.11/dist-packages/
# Bytecode compiled once here, by the image's own python3: with none (PYTHONDONTWRITEBYTECODE
# keeps a container from writing any), every plugin start, fakenvml pod and remote
# `fakenvml inject` compiled grpc, pydantic and the rest again — `import plugin.main` took
# ~1.4 s in a container against ~0.5 s with it. unchecked-hash: the sources never change
# in the image, so no mtime is checked and the bytes do not depend on when it was built.
RUN python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash \
    /usr/local/lib/python3.11/dist-packages >/dev/null
COPY lib/libnvidia-ml.so.1 lib/libcuda.so.1 /usr/lib/fakenvml/
# NVIDIA's nvidia-smi and MPS programs where the build had them (empty otherwise): into
# driver roots.
COPY bin/ /usr/bin/
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    FAKENVML_LIBRARY=/usr/lib/fakenvml/libnvidia-ml.so.1
ENTRYPOINT ["python3", "-m"]
CMD ["fakenvml", "--help"]
