"""Squid helpers for Kiln's egress proxy (see squid.conf).

`auth`: basic-auth helper; a user is a sandbox id, its password the token the API wrote for it.
`start`: writes the upstream networks squid may reach despite their private addresses
        (KILN_EGRESS_UPSTREAMS, comma-separated CIDRs, set by the API) and the one address
        that may open connections with a PROXY header (KILN_EGRESS_BRIDGE_SOURCE: the API
        host's, for gVisor sandboxes' bridges), and execs squid.
`acl`:  external ACL helper; given user, client address, host, port and method, answers OK
        when the host matches one of that sandbox's allow patterns for that port and the
        request comes from that sandbox's own address. Anything unreadable is a refusal.
Rules: /run/kiln-egress/rules/<sandbox id>.json, written by the API:
  {"sha256": hex of the token, "ip": "10.231.0.3", "allow": [{"host": "api.example.com",
   "wildcard": false, "ports": [80, 443]}], "revoked": false}
"""
import hashlib
import ipaddress
import hmac
import json
import os
import re
import sys
import time
from urllib.parse import unquote

RULES = "/run/kiln-egress/rules"
USER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def rules_of(user):
    if not USER.match(user):
        return None
    path = os.path.join(RULES, user + ".json")
    # The API replaces a file in place: a read that catches it half-written is retried.
    for attempt in range(5):
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 20)
            rules = json.loads(data)
            return None if rules.get("revoked") else rules
        except FileNotFoundError:
            return None
        except (ValueError, OSError):
            time.sleep(0.01 * (attempt + 1))
    return None


def authenticate(user, password):
    rules = rules_of(user)
    if not rules:
        return False
    digest = hashlib.sha256(password.encode("utf-8", "surrogateescape")).hexdigest()
    return hmac.compare_digest(digest, str(rules.get("sha256", "")))


def allowed(user, src, host, port, method):
    rules = rules_of(user)
    if not rules or src != rules.get("ip"):
        return False
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    try:
        port = int(port)
    except ValueError:
        return False
    for rule in rules.get("allow", []):
        if port not in rule.get("ports", []):
            continue
        name = rule.get("host", "")
        if rule.get("wildcard"):
            if host.endswith("." + name) and len(host) > len(name) + 1:
                return True
        elif host == name:
            return True
    return False


def start():
    nets = [ipaddress.ip_network(n.strip(), strict=False) for n in os.environ.get("KILN_EGRESS_UPSTREAMS", "").split(",") if n.strip()]
    os.makedirs(RULES, exist_ok=True)
    with open("/run/kiln-egress/upstreams", "w") as f:
        # An ACL file with no entry is an error to squid: TEST-NET-1's broadcast address stands in.
        f.write("\n".join(str(n) for n in nets) if nets else "192.0.2.255/32")
        f.write("\n")
    bridge = os.environ.get("KILN_EGRESS_BRIDGE_SOURCE", "").strip()
    with open("/run/kiln-egress/bridge", "w") as f:
        f.write(str(ipaddress.ip_address(bridge)) if bridge else "192.0.2.255")
        f.write("\n")
    os.execvp("squid", ["squid", "-N", "-f", "/etc/squid/kiln.conf"])


def main(mode):
    if mode == "start":
        start()
    for line in sys.stdin:
        fields = [unquote(f) for f in line.split()]
        try:
            if mode == "auth":
                ok = len(fields) == 2 and authenticate(*fields)
            else:
                # Squid appends the ACL's arguments ("-" for none) after the five fields of the format.
                ok = len(fields) >= 5 and allowed(*fields[:5])
        except Exception:  # noqa: BLE001 - a helper that dies would stop the proxy; refuse instead
            ok = False
        sys.stdout.write("OK\n" if ok else "ERR\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "acl")
