#!/bin/sh
# The pod specs' workload: show what the device plugin injected, then stay up.
env | sort
# As PID 1 the shell would ignore SIGTERM: a graceful delete (a DRA lab's 1 s grace) then
# waits for the SIGKILL. Ending on it lets the node release the claim at once.
trap 'exit 0' TERM
sleep 2147483647 &
wait
