"""What a soak judges beyond its requests: the embedded endpoint's holdings on the host before and after a
run (`census`: processes, network namespaces, mounts, loop devices, cgroups) and its memory through the run
(`memory`: sampled, judged flat or growing). In: a server's pid and state directory. Out: counts and
verdicts for `load.json` (`bench/load.py`)."""
