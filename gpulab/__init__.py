"""gpulab: the lab's one command (`gpulab`, gpulab/cli.py), above the labs, the suites and
the kubelet stand-in. A node's own tools are `fakenvml` and `gpulab-plugin`."""
