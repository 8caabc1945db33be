"""The scripts of the per-user kernel limits' checks (the isolation case is22 and the embedded endpoint's own test,
tests/test_localbox_hardening.py): one takes a user's whole share and holds it, the other asks for one of each."""

import textwrap

HELD = "/tmp/e2b-bench-held"  # where GRAB_USER_LIMITS says how many of each it took, once it holds them (its path)

# Takes every POSIX message queue, queued signal and inotify instance the kernel gives this user, then holds them.
GRAB_USER_LIMITS = textwrap.dedent("""
    import ctypes, os, signal, time
    rt, libc = ctypes.CDLL("librt.so.1", use_errno=True), ctypes.CDLL(None, use_errno=True)
    class Value(ctypes.Union):
        _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]
    queues = 0
    while queues < 10_000 and rt.mq_open(f"/e2b-bench-q{queues}".encode(), os.O_CREAT | os.O_RDWR, 0o600, None) >= 0:
        queues += 1
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
    signals = 0
    while signals < 1_000_000 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, Value(0)) == 0:
        signals += 1
    watches = 0
    while watches < 10_000 and libc.inotify_init1(0) >= 0:
        watches += 1
    open("/tmp/e2b-bench-held", "w").write(f"{queues} {signals} {watches}")
    time.sleep(600)
""")
PROBE_USER_LIMITS = textwrap.dedent("""
    import ctypes, os, signal
    rt, libc = ctypes.CDLL("librt.so.1", use_errno=True), ctypes.CDLL(None, use_errno=True)
    class Value(ctypes.Union):
        _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]
    name = f"/e2b-bench-probe{os.getpid()}".encode()
    queue = rt.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None) >= 0
    queue and rt.mq_unlink(name)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
    queued = libc.sigqueue(os.getpid(), signal.SIGRTMIN, Value(0)) == 0
    watch = libc.inotify_init1(0) >= 0
    print(f"queue={queue} signal={queued} inotify={watch}")
""")
