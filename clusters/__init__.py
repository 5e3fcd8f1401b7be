"""clusters: lab specs -> real kind clusters with fake GPUs and the plugin under test."""
