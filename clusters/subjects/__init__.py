"""Subjects, the plugins under test: subject.py's model and the shipped subject files
beside it (*.yaml, daemonsets/, logs/)."""
