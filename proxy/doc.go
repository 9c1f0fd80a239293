// Package proxy is the allowlisting forward proxy that gives a sandbox its only way out.
//
// A sandbox (a build step or a Bench) has a network namespace with nothing but loopback. Shed binds a
// listening socket inside that namespace and serves it from the host namespace with [Proxy.Serve]: HTTP
// requests in absolute form (as apt and pip send them to a proxy) and HTTPS through CONNECT are let through
// to the destinations of the allowlist and nowhere else. The proxy resolves names itself, refuses names and
// IP literals that lead to loopback, private, link-local and similar addresses (unless the sandbox is
// allowed a local mirror), and dials exactly the address it checked. Every request yields one [Decision].
//
// The package imports no other package of this project.
package proxy
