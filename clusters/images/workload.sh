#!/bin/sh
# The pod specs' workload: show what the device plugin injected, then stay up.
env | sort
exec sleep 2147483647
