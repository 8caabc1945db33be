"""What a soak judges beyond its requests: the embedded endpoint's holdings on the host before and after a
run (`census`: processes, network namespaces, mounts, loop devices, cgroups), its memory through the run
(`memory`: sampled, judged flat or growing), and the pace of its creates held to what the endpoint makes
(`pace`: cut by its 429s, the retries counted). In: a server's pid and state directory, the users' refusals.
Out: counts and verdicts for `load.json` (`bench/load.py`)."""
