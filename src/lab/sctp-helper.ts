// SCTP for the lab agent. Node has no SCTP sockets, so each agent that needs
// SCTP starts this Python helper in its namespace (python3 -c, on the first
// SCTP request) and relays SCTP requests to it, one JSON line each way. The
// helper speaks real SCTP (socket(AF_INET[6], SOCK_STREAM, IPPROTO_SCTP)):
// a kernel without SCTP makes every SCTP request fail with that error, never
// fall back to TCP.
//
// Requests: listen {host, port}; unlisten {host?, port?, drop}; connect {cid,
// src, dst, port, timeoutMs} -> {client} | {code} | {timeout}; exchange {cid,
// tag, timeoutMs} -> {line} | {code} | {timeout} | {closed}; close {cid}.
// Servers answer each line with the agent's answer line (see agent.ts).
//
// Servers bind one address each, never the wildcard: an association accepted
// on a wildcard socket reports the namespace's primary address as its own,
// not the one the client reached (the DNAT target the lab must see).
//
// Client sockets: IP_RECVERR, or ICMP errors (REJECT, admin-prohibited) only
// count as soft errors and the INIT is retried until the timeout; a 200 ms
// initial RTO (TCP's SYN retry is 1 s; SCTP's 3 s is past the lab's
// timeouts), as an ICMP error that arrives while connect() still holds the
// socket is soft even then and only the retried INIT's error ends it.
export const SCTP_HELPER_PY = String.raw`
import errno, json, os, selectors, socket, struct, sys, threading, time

NAME = sys.argv[1]
IPPROTO_SCTP = 132
SCTP_RTOINFO = 0
out_lock = threading.Lock()

def emit(o):
    with out_lock:
        sys.stdout.write(json.dumps(o) + "\n")
        sys.stdout.flush()

def hostport(a):
    return ("[%s]:%d" if ":" in a[0] else "%s:%d") % (a[0], a[1])

def family(ip):
    return socket.AF_INET6 if ":" in ip else socket.AF_INET

def code(e):
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, "E%d" % e.errno)
    return type(e).__name__

try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_SCTP).close()
except OSError as e:
    emit({"ready": False, "error": "this kernel has no SCTP: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) failed: %s" % e})
    sys.exit(0)

# --- servers: one thread accepts on every listening socket; one thread per association

sel = selectors.DefaultSelector()
wake_r, wake_w = os.pipe()
sel.register(wake_r, selectors.EVENT_READ, None)
jobs = []
jobs_lock = threading.Lock()
servers = {}  # (host, port) -> (socket, set of accepted sockets)

def in_acceptor(fn):
    done = threading.Event()
    box = {}
    def run():
        try:
            box["r"] = fn()
        except BaseException as e:
            box["e"] = e
        done.set()
    with jobs_lock:
        jobs.append(run)
    os.write(wake_w, b"x")
    done.wait()
    if "e" in box:
        raise box["e"]
    return box.get("r")

def answer_loop(c, conns):
    try:
        local, remote = hostport(c.getsockname()), hostport(c.getpeername())
        buf = b""
        while True:
            d = c.recv(4096)
            if not d:
                break
            buf += d
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                tag = line.decode("utf8", "replace").strip()[:32]
                c.sendall(("%s %s %s %s\n" % (local, remote, NAME, tag)).encode())
    except OSError:
        pass
    finally:
        conns.discard(c)
        c.close()

def acceptor():
    while True:
        for key, _ in sel.select():
            if key.data is None:
                os.read(wake_r, 4096)
                with jobs_lock:
                    todo = jobs[:]
                    jobs.clear()
                for j in todo:
                    j()
                continue
            conns = key.data
            try:
                c, _ = key.fileobj.accept()
            except OSError:
                continue
            c.setblocking(True)
            conns.add(c)
            threading.Thread(target=answer_loop, args=(c, conns), daemon=True).start()

threading.Thread(target=acceptor, daemon=True).start()

def listen(r):
    key = (r["host"], r["port"])
    if key in servers:
        return None
    s = socket.socket(family(r["host"]), socket.SOCK_STREAM, IPPROTO_SCTP)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if ":" in r["host"]:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((r["host"], r["port"]))
        s.listen(128)
        s.setblocking(False)
    except OSError as e:
        s.close()
        raise Exception("listen SCTP %s %d: %s" % (r["host"], r["port"], code(e)))
    conns = set()
    servers[key] = (s, conns)
    in_acceptor(lambda: sel.register(s, selectors.EVENT_READ, conns))
    return None

def unlisten(r):
    for key in list(servers):
        if r.get("host") is not None and key[0] != r["host"]:
            continue
        if r.get("port") is not None and key[1] != r["port"]:
            continue
        s, conns = servers.pop(key)
        def stop(s=s):
            sel.unregister(s)
            s.close()
        in_acceptor(stop)
        if r.get("drop"):
            for c in list(conns):
                try:
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    return None

# --- clients: kept associations by id

kept = {}  # cid -> {"s": socket, "buf": bytes, "dead": error code or None}

def connect(r):
    close({"cid": r["cid"]})
    dst = r["dst"]
    s = socket.socket(family(dst), socket.SOCK_STREAM, IPPROTO_SCTP)
    try:
        if ":" in dst:
            s.setsockopt(socket.IPPROTO_IPV6, 25, 1)  # IPV6_RECVERR
        else:
            s.setsockopt(socket.IPPROTO_IP, 11, 1)  # IP_RECVERR
        s.setsockopt(IPPROTO_SCTP, SCTP_RTOINFO, struct.pack("iIII", 0, 200, 1000, 100))
        s.bind((r["src"], 0))
        s.settimeout(max(0.001, r["timeoutMs"] / 1000.0))
        s.connect((dst, r["port"]))
    except socket.timeout:
        s.close()
        return {"timeout": True}
    except OSError as e:
        s.close()
        return {"code": code(e)}
    kept[r["cid"]] = {"s": s, "buf": b"", "dead": None}
    return {"client": hostport(s.getsockname())}

def exchange(r):
    k = kept.get(r["cid"])
    if k is None:
        return {"closed": True, "code": "NOCONN"}
    if k["dead"]:
        return {"closed": True, "code": k["dead"]}
    s, tag = k["s"], r["tag"]
    deadline = time.monotonic() + r["timeoutMs"] / 1000.0
    try:
        s.sendall((tag + "\n").encode())
        while True:
            while b"\n" in k["buf"]:
                line, k["buf"] = k["buf"].split(b"\n", 1)
                line = line.decode("utf8", "replace")
                if line.strip().split(" ")[3:4] == [tag]:
                    return {"line": line}
            left = deadline - time.monotonic()
            if left <= 0:
                return {"timeout": True}
            s.settimeout(left)
            d = s.recv(4096)
            if not d:
                k["dead"] = "CLOSED"
                return {"code": "CLOSED"}
            k["buf"] += d
    except socket.timeout:
        return {"timeout": True}
    except OSError as e:
        k["dead"] = code(e)
        return {"code": k["dead"]}

def close(r):
    k = kept.pop(r["cid"], None)
    if k:
        k["s"].close()
    return None

OPS = {"listen": listen, "unlisten": unlisten, "connect": connect, "exchange": exchange, "close": close}

def handle(req):
    try:
        emit({"id": req["id"], "ok": True, "result": OPS[req["op"]](req)})
    except Exception as e:
        emit({"id": req["id"], "ok": False, "error": str(e)})

emit({"ready": True})
for line in sys.stdin:
    if not line.strip():
        continue
    try:
        req = json.loads(line)
    except ValueError:
        continue
    threading.Thread(target=handle, args=(req,), daemon=True).start()
os._exit(0)
`;
