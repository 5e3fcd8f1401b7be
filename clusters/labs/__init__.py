"""Bringing labs up: the lab specs (spec.py and the *.yaml beside it), kind's config, the
actions that make a cluster, and the Lab a suite holds. It reads what was built through
clusters/built.py and never imports clusters/infra/."""
