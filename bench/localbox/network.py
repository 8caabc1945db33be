"""A sandbox's network settings as E2B's API reads them from create's `network` (and `PUT /sandboxes/{id}/network`).

Egress rules are written as nftables rules twice: in the sandbox's network namespace, and in the host's on
the sockets of the sandbox's uplink (slirp4netns), where no frame the sandbox makes can pass around them.
The host's table also keeps every uplink off the host itself: its loopback and its own addresses (whatever is
routed to `lo`), multicast and broadcast; only the resolvers of /etc/resolv.conf answer on port 53, for the
sandbox's DNS (10.0.2.3). An uplink's sockets are told apart by their group: the sandbox's host root gid.

Ingress is enforced by the port proxy (`allowPublicTraffic: false` -> a traffic access token; `maskRequestHost` ->
the Host header the sandbox's server sees).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

TABLE = "e2b_bench_egress"
UPLINKS = "e2b_bench_uplinks"  # the host's table: one chain pair per running uplink, by its gid
REFUSE = "reject with icmpx admin-prohibited"  # answered at once: the uplink holds no half-open socket
DNS_THEN = ("meta skgid vmap @egress", "accept")  # the sandbox's rules, then accepted: DNS is not the host
NOT_OUT = {"ip": "0.0.0.0/8, 127.0.0.0/8, 224.0.0.0/3", "ip6": "::/127, ::ffff:0:0/96, ff00::/8"}
ALL_TRAFFIC = "0.0.0.0/0"
DOMAIN = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", re.I)


TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"
PORT_PLACEHOLDER = "${PORT}"  # in maskRequestHost: the port the request is for
MASK_HOST = re.compile(r"^[A-Za-z0-9.-]+(:\d{1,5})?$")  # host[:port], ASCII, once the placeholder is filled in


class NetworkError(ValueError):
    """A network configuration E2B's API would refuse with 400."""


@dataclass(frozen=True, repr=False)
class Ingress:
    """Who may reach the sandbox's ports through the port proxy, as E2B's proxy decides it: anyone, or (with
    `allowPublicTraffic: false`) only requests carrying the sandbox's traffic access token. The raw token lives
    in memory only, as envd access tokens do; the create and connect answers hand it out. `mask_host` is the
    Host header the sandbox's servers see instead of the caller's (`${PORT}` filled in), envd's port aside."""

    traffic_token: str | None = None
    mask_host: str | None = None

    @classmethod
    def from_create(cls, body: dict[str, Any]) -> Ingress:
        network = body.get("network") or {}
        if not isinstance(network, dict):
            raise NetworkError("'network' must be an object")
        mask = network.get("maskRequestHost")
        if mask is not None and not (isinstance(mask, str) and MASK_HOST.match(mask.replace(PORT_PLACEHOLDER, "1"))):
            raise NetworkError(f"mask request host is not valid: {mask}")
        public = network.get("allowPublicTraffic")
        if public is not None and not isinstance(public, bool):
            raise NetworkError("'allowPublicTraffic' must be a boolean")
        return cls(secrets.token_urlsafe(32) if public is False else None, mask or None)

    def renewed(self) -> Ingress:
        """The same policy with a token of its own (a fork is a sandbox of its own)."""
        return replace(self, traffic_token=secrets.token_urlsafe(32)) if self.traffic_token else self

    def without(self, *, token: bool = False, mask: bool = False) -> Ingress:
        """This policy with the token or the mask left out (an endpoint that accepts and ignores them)."""
        return replace(
            self, traffic_token=None if token else self.traffic_token, mask_host=None if mask else self.mask_host
        )

    def request_host(self, port: int) -> str | None:
        """The Host header a request for `port` reaches the sandbox with, or None to keep the caller's."""
        return self.mask_host.replace(PORT_PLACEHOLDER, str(port)) if self.mask_host else None

    def refusal(self, presented: str) -> str | None:
        """Why a proxied request is refused (E2B's message), or None when it may pass."""
        if self.traffic_token is None:
            return None
        if not presented:
            return f"Sandbox is secured with traffic access token. Token header '{TRAFFIC_TOKEN_HEADER}' is missing"
        if not hmac.compare_digest(presented.encode(), self.traffic_token.encode()):
            return "Sandbox is secured with traffic access token. Provided token is invalid."
        return None

    def wire(self) -> dict[str, Any]:
        """Its members of a sandbox's `network` detail: only a change from the default is shown."""
        public = {} if self.traffic_token is None else {"allowPublicTraffic": False}
        return {**public, **({"maskRequestHost": self.mask_host} if self.mask_host else {})}


@dataclass(frozen=True)
class EgressRules:
    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    rules: dict[str, Any] = field(default_factory=dict)
    egress_proxy: dict[str, Any] | None = None
    internet: bool = True

    @property
    def unrestricted(self) -> bool:
        """Whether these rules let every connection out, as a sandbox without rules does."""
        return self.internet and not self.deny_out and not self.rules and self.egress_proxy is None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> EgressRules:
        """The update's rules; an omitted member clears what it configures."""
        allow = _strings(body, "allowOut")
        deny = _strings(body, "denyOut")
        for entry in allow:
            if not (_is_network(entry) or DOMAIN.match(entry)):
                raise NetworkError(f"'allowOut' entry is neither a CIDR block, an IP address nor a domain: '{entry}'")
        for entry in deny:
            if not _is_network(entry):
                raise NetworkError(f"'denyOut' entry is not a CIDR block or an IP address: '{entry}'")
        rules = body.get("rules") or {}
        proxy = body.get("egressProxy")
        internet = body.get("allow_internet_access", True)
        if not isinstance(rules, dict) or not all(isinstance(v, list) for v in rules.values()):
            raise NetworkError("'rules' must map domains to lists of rules")
        if proxy is not None and not isinstance(proxy, dict):
            raise NetworkError("'egressProxy' must be an object")
        if not isinstance(internet, bool):
            raise NetworkError("'allow_internet_access' must be a boolean")
        return cls(tuple(allow), tuple(deny), rules, proxy, internet)

    @classmethod
    def from_create(cls, body: dict[str, Any]) -> EgressRules:
        """The rules of a create request's `network` (members that are not egress rules play no part here)."""
        network = body.get("network") or {}
        if not isinstance(network, dict):
            raise NetworkError("'network' must be an object")
        return cls.from_body({k: network[k] for k in ("allowOut", "denyOut", "rules", "egressProxy") if k in network})

    @property
    def denied(self) -> tuple[str, ...]:
        """What is denied, `allow_internet_access: false` being a deny of all traffic as E2B documents it."""
        return self.deny_out if self.internet or ALL_TRAFFIC in self.deny_out else (*self.deny_out, ALL_TRAFFIC)

    def unenforced(self) -> str | None:
        """What of these rules this endpoint cannot enforce (a packet filter sees addresses only), if anything."""
        if self.rules:
            return "per-domain transform rules ('rules')"
        if self.egress_proxy is not None:
            return "an egress proxy ('egressProxy')"
        domains = [entry for entry in self.allow_out if not _is_network(entry)]
        if domains and self.denied:
            return f"domains allowed through denied addresses ('allowOut': '{domains[0]}')"
        return None

    def wire(self) -> dict[str, Any] | None:
        """The `network` member of a sandbox's detail (E2B's `SandboxNetworkConfig`); None without rules."""
        found: dict[str, Any] = {"allowOut": list(self.allow_out), "denyOut": list(self.denied)}
        if self.rules:
            found["rules"] = self.rules
        if self.egress_proxy is not None:
            found["egressProxy"] = self.egress_proxy
        return found if self.allow_out or self.denied or len(found) > 2 else None

    def verdicts(self, refuse: str) -> list[str]:
        """The rules' nftables statements: allowed blocks accepted first (allow wins over deny), then denied
        blocks given `refuse`; none without a deny."""
        deny = _blocks(self.denied)
        if not deny:
            return []
        allow = _blocks(entry for entry in self.allow_out if _is_network(entry))
        return [
            *(f"{family} daddr {{ {', '.join(blocks)} }} accept" for family, blocks in allow.items()),
            *(f"{family} daddr {{ {', '.join(blocks)} }} {refuse}" for family, blocks in deny.items()),
        ]

    def nft_script(self) -> str:
        """One nftables transaction replacing the sandbox's egress table; its own loopback is never filtered."""
        lines = [f"table inet {TABLE}", f"delete table inet {TABLE}"]  # create-then-delete: empty either way
        if verdicts := self.verdicts("drop"):
            lines += [
                f"table inet {TABLE} {{",
                "  chain output {",
                "    type filter hook output priority filter; policy accept;",
                '    oifname "lo" accept',
                *(f"    {rule}" for rule in verdicts),
                "  }",
                "}",
            ]
        return "\n".join(lines) + "\n"

    def uplink_script(self, gid: int) -> str:
        """One nftables transaction giving the uplink whose sockets have `gid` these rules in the host's
        table (`uplinks_table`), replacing what it had."""
        table, chain = f"inet {UPLINKS}", f"inet {UPLINKS} egress_{gid}"
        return _lines([
            f"add chain {chain}",
            f"flush chain {chain}",
            *(f"add rule {chain} {rule}" for rule in self.verdicts(REFUSE)),
            f"add element {table} egress {{ {gid} : jump egress_{gid} }}",
        ])  # fmt: skip


def uplinks_table(gids: Iterable[int], resolvers: Iterable[str]) -> str:
    """One nftables transaction (re)writing the host's table that keeps uplinks' sockets (those of `gids`,
    the sandboxes' host root gids) off the host, then through their sandbox's egress chain where it has one.
    Written once per server: a create costs no nftables run, and only a sandbox with rules has a chain."""
    table, output, uplink = f"inet {UPLINKS}", f"inet {UPLINKS} output", f"inet {UPLINKS} uplink"
    dns = _blocks(resolvers)
    to_dns = "meta l4proto { tcp, udp } th dport 53"
    dns_rules = [f"{fam} daddr {{ {', '.join(b)} }} {to_dns} {then}" for then in DNS_THEN for fam, b in dns.items()]
    # Only a packet whose socket has an uplink's gid goes to `uplink`. A packet without a socket (the kernel's
    # own RST or ICMP answer) has no gid: a negated match (`!= @uplinks accept`) would not match it either, and
    # the refusals below would then reject the host's own answers on `lo` (a connect to a closed port on
    # 127.0.0.1 timed out instead of being refused).
    return _lines([
        f"add table {table}",
        f"add set {table} uplinks {{ type gid; }}",
        f"add element {table} uplinks {{ {', '.join(map(str, gids))} }}",
        f"add map {table} egress {{ type gid : verdict; }}",
        f"add chain {uplink}",
        f"flush chain {uplink}",
        *(f"add rule {uplink} {rule}" for rule in dns_rules),
        f'add rule {uplink} oifname "lo" {REFUSE}',
        *(f"add rule {uplink} {family} daddr {{ {blocks} }} {REFUSE}" for family, blocks in NOT_OUT.items()),
        f"add rule {uplink} meta skgid vmap @egress",
        f"add chain {output} {{ type filter hook output priority filter; policy accept; }}",
        f"flush chain {output}",
        f"add rule {output} meta skgid @uplinks jump uplink",
    ])  # fmt: skip


def uplink_release(gid: int) -> str:
    """One nftables transaction removing the egress chain `EgressRules.uplink_script` gave `gid`."""
    table = f"inet {UPLINKS}"
    return _lines(
        [
            f"delete element {table} egress {{ {gid} }}",
            f"flush chain {table} egress_{gid}",
            f"delete chain {table} egress_{gid}",
        ]
    )


def _lines(lines: Iterable[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def resolvers(resolv_conf: str) -> list[str]:
    """The nameserver addresses of a resolv.conf's text (what slirp4netns forwards the sandbox's DNS to)."""
    found = []
    for line in resolv_conf.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver" and _is_network(fields[1].split("%")[0]):
            found.append(fields[1].split("%")[0])
    return found


def _strings(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NetworkError(f"'{key}' must be a list of strings")
    return value


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


def _blocks(entries: Iterable[str]) -> dict[str, list[str]]:
    """CIDR blocks by nftables family (`ip`, `ip6`), overlaps merged (an nftables set refuses them)."""
    networks = [ipaddress.ip_network(entry, strict=False) for entry in entries]
    v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
    merged = {
        "ip": [str(n) for n in ipaddress.collapse_addresses(v4)],
        "ip6": [str(n) for n in ipaddress.collapse_addresses(v6)],
    }
    return {family: blocks for family, blocks in merged.items() if blocks}
