"""clusters: lab specs -> real kind clusters with fake GPUs and the plugin under test.

infra/ builds the infrastructure (`make infra`); labs/ brings labs up; subjects/ holds the
plugins under test; charts/ the Helm chart and manifests. Beside them, what all of these
share: versions.py (the pins, versions.env), built.py (the record of what was built),
steps.py and kube.py (StepError, waits, the Kubernetes client)."""
