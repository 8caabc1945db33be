# ci13: a cell that sleeps 30 s; `interrupted` tells the next cell whether the sleep got KeyboardInterrupt.
import time

interrupted = False
try:
    time.sleep(30)
except KeyboardInterrupt:
    interrupted = True
    raise
