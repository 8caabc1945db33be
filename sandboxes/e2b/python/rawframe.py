"""Hand-made TCP SYN frames through the default route's interface, as an attacker with CAP_NET_RAW would send
them: python3 rawframe.py [--until CONTROL] HOST:PORT ... prints one JSON object.

Standard library only: the isolation suite runs it inside sandboxes, the self-tests in a sandbox's network
namespace. Each target gets one SYN frame addressed to the gateway's MAC (so a user-mode NAT such as
slirp4netns opens a connection to whatever address the frame names), and is then reported by the first
answer the gateway sends back: "answered" (SYN-ACK: a listener accepted), "refused" (RST), "unreachable"
(ICMP), or "silent" (none within ANSWER_WITHIN_S or, with --until, once CONTROL, sent last, has answered: the
gateway handles frames in order, so every other target had its chance). `packet_socket` and `raw_inet_socket`
say whether those sockets could be opened at all; no frame is sent when the packet socket is refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import select
import socket
import struct
import sys
import time

ETH_P_ALL, ETH_P_IP, ETH_P_ARP = 0x0003, 0x0800, 0x0806
SIOCGIFADDR, PACKET_OUTGOING = 0x8915, 4
SYN, RST, ACK = 0x02, 0x04, 0x10
ANSWER_WITHIN_S = 10.0
CONTROL_WITHIN_S = 120.0  # a bound for a broken path, never waited on a working one


def opened(family: int, kind: int, proto: int) -> tuple[socket.socket | None, str]:
    try:
        return socket.socket(family, kind, proto), "opened"
    except OSError as exc:
        return None, f"refused: {os.strerror(exc.errno or 0)}"


def default_route() -> tuple[str, str]:
    """(interface, gateway address) of the IPv4 default route."""
    with open("/proc/net/route") as routes:
        for line in routes.read().splitlines()[1:]:
            fields = line.split()
            if fields[1] == "00000000" and int(fields[7], 16) == 0:
                return fields[0], socket.inet_ntoa(struct.pack("<I", int(fields[2], 16)))
    raise SystemExit(json.dumps({"error": "no IPv4 default route"}))


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def syn_frame(dst_mac: bytes, src_mac: bytes, src: str, dst: str, sport: int, dport: int) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", sport, dport, random.getrandbits(32), 0, 5 << 4, SYN, 64240, 0, 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", checksum(pseudo + tcp)) + tcp[18:]
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), random.getrandbits(16), 0, 64, socket.IPPROTO_TCP, 0,
        socket.inet_aton(src), socket.inet_aton(dst),
    )  # fmt: skip
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    return dst_mac + src_mac + struct.pack("!H", ETH_P_IP) + ip + tcp


def gateway_mac(sock: socket.socket, own_mac: bytes, own_ip: str, gateway: str) -> bytes:
    """The gateway's MAC, asked with an ARP request on the packet socket."""
    request = struct.pack(
        "!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, 1, own_mac, socket.inet_aton(own_ip), b"\0" * 6, socket.inet_aton(gateway)
    )
    sock.send(b"\xff" * 6 + own_mac + struct.pack("!H", ETH_P_ARP) + request)
    deadline = time.monotonic() + ANSWER_WITHIN_S
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            break
        frame, address = sock.recvfrom(65536)
        if address[2] != PACKET_OUTGOING and frame[12:14] == struct.pack("!H", ETH_P_ARP):
            op, sender_mac, sender_ip = struct.unpack("!6xH6s4s", frame[14:32])
            if op == 2 and socket.inet_ntoa(sender_ip) == gateway:
                return sender_mac
    raise SystemExit(json.dumps({"error": f"the gateway {gateway} answered no ARP request"}))


def answer_to(frame: bytes, pending: dict[tuple[str, int, int], str]) -> tuple[tuple[str, int, int], str] | None:
    """Which pending (host, port, source port) an IPv4 frame answers, and how."""
    if frame[12:14] != struct.pack("!H", ETH_P_IP) or frame[23] not in (socket.IPPROTO_TCP, socket.IPPROTO_ICMP):
        return None
    ip = frame[14:]
    body = ip[(ip[0] & 0xF) * 4 :]
    if ip[9] == socket.IPPROTO_TCP:
        sport, dport = struct.unpack("!HH", body[:4])
        key = (socket.inet_ntoa(ip[12:16]), sport, dport)
        flags = body[13]
        kind = "answered" if flags & (SYN | ACK) == SYN | ACK else "refused" if flags & RST else None
        return (key, kind) if key in pending and kind else None
    if body[0] == 3:  # destination unreachable: the frame it is about follows
        inner = body[8:]
        sport, dport = struct.unpack("!HH", inner[(inner[0] & 0xF) * 4 :][:4])
        key = (socket.inet_ntoa(inner[16:20]), dport, sport)
        return (key, "unreachable") if key in pending else None
    return None


def main(args: list[str]) -> dict:
    control = args[1] if args[:1] == ["--until"] else None
    targets = [*args[2:], args[1]] if control else args
    packet, packet_state = opened(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    raw_inet, raw_state = opened(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    if raw_inet is not None:
        raw_inet.close()
    report: dict = {"packet_socket": packet_state, "raw_inet_socket": raw_state, "seen": {}}
    if packet is None:
        return report
    interface, gateway = default_route()
    packet.bind((interface, ETH_P_ALL))
    own_mac = packet.getsockname()[4]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", interface.encode())
        own_ip = socket.inet_ntoa(fcntl.ioctl(probe, SIOCGIFADDR, request)[20:24])
    gateway_hw = gateway_mac(packet, own_mac, own_ip, gateway)
    pending: dict[tuple[str, int, int], str] = {}
    for target in targets:
        host, _, port = target.rpartition(":")
        sport = random.randrange(40000, 60000)
        pending[(host, int(port), sport)] = target
        packet.send(syn_frame(gateway_hw, own_mac, own_ip, host, sport, int(port)))
    deadline = time.monotonic() + (CONTROL_WITHIN_S if control else ANSWER_WITHIN_S)
    while pending and control not in report["seen"] and (left := deadline - time.monotonic()) > 0:
        if not select.select([packet], [], [], left)[0]:
            break
        frame, address = packet.recvfrom(65536)
        if address[2] != PACKET_OUTGOING and (found := answer_to(frame, pending)):
            report["seen"][pending.pop(found[0])] = found[1]
    report["seen"].update({target: "silent" for target in pending.values()})
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), sort_keys=True))
