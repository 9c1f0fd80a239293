// Package sockdiag asks the kernel who owns a TCP socket on this host (NETLINK_SOCK_DIAG,
// inet_diag), so that a server on loopback, where every local user is 127.0.0.1, can tell its
// clients apart by uid as it does on a Unix socket with SO_PEERCRED.
//
// The uid is the one the kernel recorded when the socket was made (the maker's filesystem uid): a
// user can lend a socket to another only by handing over the descriptor.
package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// ErrNotFound is a socket the kernel does not have (it was closed, or is not on this host).
var ErrNotFound = errors.New("no such socket")

const (
	nlmsgHdrLen      = 16
	diagReqLen       = 56 // struct inet_diag_req_v2
	diagMsgUID       = 64 // offset of idiag_uid in struct inet_diag_msg
	diagMsgLen       = 72
	inetDiagNoCookie = ^uint32(0)
)

// TCPOwner returns the uid of the TCP socket whose own address is local and whose peer is remote.
// For the client of a loopback connection a server accepted, that is the connection's remote address
// as local and its local address as remote.
func TCPOwner(local, remote netip.AddrPort) (uint32, error) {
	l, r := local.Addr(), remote.Addr()
	if l.Is4In6() && r.Is4In6() {
		l, r = l.Unmap(), r.Unmap()
	}
	uid, err := query(l, local.Port(), r, remote.Port())
	if errors.Is(err, ErrNotFound) && l.Is4() && r.Is4() {
		// A client of an IPv6 socket reaching an IPv4 address has IPv4-mapped addresses.
		uid, err = query(netip.AddrFrom16(l.As16()), local.Port(), netip.AddrFrom16(r.As16()), remote.Port())
	}
	return uid, err
}

func query(src netip.Addr, sport uint16, dst netip.Addr, dport uint16) (uint32, error) {
	family := uint8(unix.AF_INET6)
	if src.Is4() {
		family = unix.AF_INET
	}
	if src.Is4() != dst.Is4() {
		return 0, fmt.Errorf("sock_diag: %s and %s are of two families", src, dst)
	}
	req := make([]byte, nlmsgHdrLen+diagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1) // sequence
	d := req[nlmsgHdrLen:]
	d[0], d[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(d[4:], ^uint32(0)) // every state
	id := d[8:]
	binary.BigEndian.PutUint16(id[0:], sport)
	binary.BigEndian.PutUint16(id[2:], dport)
	putAddr(id[4:20], src)
	putAddr(id[20:36], dst)
	ne.PutUint32(id[40:], inetDiagNoCookie)
	ne.PutUint32(id[44:], inetDiagNoCookie)

	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 1}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	buf = buf[:n]
	if len(buf) < nlmsgHdrLen {
		return 0, errors.New("sock_diag: a short answer")
	}
	switch ne.Uint16(buf[4:]) {
	case unix.NLMSG_ERROR:
		if len(buf) >= nlmsgHdrLen+4 {
			if errno := unix.Errno(-int32(ne.Uint32(buf[nlmsgHdrLen:]))); errno == unix.ENOENT {
				return 0, ErrNotFound
			} else if errno != 0 {
				return 0, fmt.Errorf("sock_diag: %w", errno)
			}
		}
		return 0, ErrNotFound
	case unix.SOCK_DIAG_BY_FAMILY:
		m := buf[nlmsgHdrLen:]
		if len(m) < diagMsgLen {
			return 0, errors.New("sock_diag: a short answer")
		}
		// With no connection of these four, the kernel answers with the socket listening on the
		// address, if any: that is not the one asked for.
		if m[0] != family || binary.BigEndian.Uint16(m[4:]) != sport || binary.BigEndian.Uint16(m[6:]) != dport {
			return 0, ErrNotFound
		}
		return ne.Uint32(m[diagMsgUID:]), nil
	}
	return 0, fmt.Errorf("sock_diag: an answer of type %d", ne.Uint16(buf[4:]))
}

func putAddr(b []byte, a netip.Addr) {
	if a.Is4() {
		v := a.As4()
		copy(b, v[:])
		return
	}
	v := a.As16()
	copy(b, v[:])
}
