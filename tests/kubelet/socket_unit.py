#!/usr/bin/env python3
"""What a systemd .socket unit does for its service, for the tests: holds a listening unix socket
(mode 0600) across the service's restarts, and starts the service under systemd-socket-activate
with the socket passed as LISTEN_FDS (fd 3). SIGUSR1 restarts the service (SIGTERM, wait, start
again: connections made meanwhile wait in the socket's backlog); SIGTERM stops it and exits.

  socket_unit.py PATH LOG -- COMMAND ARGS...

Each start appends to LOG; the service's pids are appended to LOG.pids.
"""
import os
import signal
import socket
import subprocess
import sys


def main():
    path, log = sys.argv[1], sys.argv[2]
    assert sys.argv[3] == "--"
    cmd = sys.argv[4:]
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    old = os.umask(0o177)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.umask(old)
    s.listen(1024)
    if s.fileno() != 3:
        os.dup2(s.fileno(), 3)
    os.set_inheritable(3, True)

    child = None
    restart = False
    stop = False

    def start():
        out = open(log, "ab")
        # LISTEN_PID must name the process that reads it: the shell's pid, kept by exec.
        p = subprocess.Popen(["sh", "-c", 'LISTEN_FDS=1 LISTEN_PID=$$ exec "$@"', "sh",
                              "systemd-socket-activate", *cmd],
                             pass_fds=(3,), stdout=out, stderr=out)
        with open(log + ".pids", "a") as f:
            f.write("%d\n" % p.pid)
        return p

    def on_usr1(*_):
        nonlocal restart
        restart = True

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    child = start()
    while True:
        if restart or stop:
            child.send_signal(signal.SIGTERM)
            child.wait()
            if stop:
                break
            restart = False
            child = start()
        try:
            child.wait(timeout=0.2)  # a signal's flag is seen within this
        except subprocess.TimeoutExpired:
            continue
        sys.stderr.write("socket_unit: the service exited (%d)\n" % child.returncode)
        break
    os.unlink(path)


if __name__ == "__main__":
    main()
