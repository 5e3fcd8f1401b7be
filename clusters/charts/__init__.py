"""What gpulab deploys as Kubernetes files: its fake-gpus Helm chart, the manifests/ a lab
applies, and chart.py, which renders a chart with `helm template`."""
