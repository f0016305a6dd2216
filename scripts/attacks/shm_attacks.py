"""#8: shm:// rendezvous (abstract Unix socket `\\0topspin-shm:NAME`)."""
import fcntl, os, select, socket, struct, time, threading
from common import *

F_ADD_SEALS = 1033; F_SEAL_SEAL = 1; F_SEAL_SHRINK = 2; F_SEAL_GROW = 4
R = 2 << 20

def unix_connect(name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(b"\0topspin-shm:" + name.encode())
    return s

def hello(s):
    fd = os.memfd_create("attack", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096 + 2 * R)
    fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
    socket.send_fds(s, [b"TSSHM\0\0\x02" + struct.pack("<II", R, 0)], [fd])
    return fd

class UnixCutWatcher(CutWatcher):
    def run(self):
        while not self.stop:
            for i, s in enumerate(self.socks):
                if self.cut[i] is None:
                    try:
                        r, _, _ = select.select([s], [], [], 0)
                        if r:
                            while True:
                                d = s.recv(65536, socket.MSG_DONTWAIT)
                                if not d:
                                    self.cut[i] = time.monotonic() - self.t0; break
                    except BlockingIOError:
                        pass
                    except OSError:
                        self.cut[i] = time.monotonic() - self.t0
            time.sleep(0.1)

def attack_shm(srv, dur=20):
    """100 clients connect and send nothing; 50 send a valid hello (sealed memfd, 2 MiB rings)
    and then never write their topspin preface into the ring nor read."""
    name = srv.address[len("shm://"):]
    t0 = time.monotonic()
    silent = []; fds = []; hello_only = []; refused = 0
    for i in range(100):
        try: silent.append(unix_connect(name))
        except OSError: refused += 1
    for i in range(50):
        try:
            s = unix_connect(name); fds.append(hello(s)); hello_only.append(s)
        except OSError:
            refused += 1
    w1 = UnixCutWatcher(silent, t0); w2 = UnixCutWatcher(hello_only, t0)
    time.sleep(max(0, dur - (time.monotonic() - t0)))
    note = "connect refused %d; silent x100: %s; hello then silent x50: %s" % (refused, w1.summary(), w2.summary())
    w1.close_all(); w2.close_all()
    for fd in fds: os.close(fd)
    return {"notes": note, "t0": t0}
