"""gpulab's device plugin: NVML-driven, kubelet device-plugin API v1beta1.

Runs unchanged on fakenvml and on real GPUs (it only talks to NVML through nvidia-ml-py).
"""
