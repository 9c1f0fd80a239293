package proxy

import "net/netip"

// forbiddenV4 are the IPv4 ranges a sandbox must not reach unless AllowPrivate: they lead to the host, its
// networks, its cloud metadata service, or nowhere useful.
var forbiddenV4 = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network": Linux connects 0.0.0.0 to the host itself
	netip.MustParsePrefix("10.0.0.0/8"),     // RFC 1918
	netip.MustParsePrefix("100.64.0.0/10"),  // CGNAT (RFC 6598), used by some clouds and VPNs for internal services
	netip.MustParsePrefix("127.0.0.0/8"),    // loopback
	netip.MustParsePrefix("169.254.0.0/16"), // link-local, including 169.254.169.254 (cloud metadata)
	netip.MustParsePrefix("172.16.0.0/12"),  // RFC 1918
	netip.MustParsePrefix("192.168.0.0/16"), // RFC 1918
	netip.MustParsePrefix("224.0.0.0/4"),    // multicast
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, including the limited broadcast address
}

var forbiddenV6 = []netip.Prefix{
	netip.MustParsePrefix("::/96"),          // unspecified, loopback and the deprecated IPv4-compatible forms
	netip.MustParsePrefix("fc00::/7"),       // unique local
	netip.MustParsePrefix("fe80::/10"),      // link-local
	netip.MustParsePrefix("fec0::/10"),      // deprecated site-local: still routed locally by some stacks
	netip.MustParsePrefix("ff00::/8"),       // multicast
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64 (RFC 8215): translates into the site's own IPv4
}

// nat64 is the well-known NAT64 prefix (RFC 6052): a gateway translates it to the IPv4 address in the last
// 32 bits, so that embedded address is what gets checked.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// forbidden reports whether a is an address a sandbox may not reach unless AllowPrivate is set.
func forbidden(a netip.Addr) bool {
	if !a.IsValid() {
		return true
	}
	// Zoned addresses never match a prefix, so the zone goes first; the IPv4-mapped form (::ffff:a.b.c.d)
	// reaches the IPv4 address, so it is checked as one.
	a = a.WithZone("").Unmap()
	if a.Is4() {
		for _, p := range forbiddenV4 {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	if nat64.Contains(a) {
		b := a.As16()
		return forbidden(netip.AddrFrom4([4]byte(b[12:])))
	}
	for _, p := range forbiddenV6 {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
