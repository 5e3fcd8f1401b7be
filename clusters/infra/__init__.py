"""Building the infrastructure (`make infra`): infra.py's steps, infracache.py's CI caches,
and the shell trees they run (scripts/, nodeimage/, images/). It writes what it built to
clusters/built.py's record; it imports no lab code."""
