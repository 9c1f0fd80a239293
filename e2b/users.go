package e2b

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/bench"
)

// A Bench's accounts are root and the ones its Workshop declares ([[account]]); its default user is
// the Workshop's `user` (root when it names none). envd takes the user of a request from its Basic
// auth username (process and filesystem RPCs) or the username query field (/files); no user is the
// default one. The sandbox keeps what its Bench's record says of them from its creation, so a
// request resolves its user without reading anything.

// basicUser is the user an envd RPC names: its Basic auth username, "" when it names none.
func basicUser(h http.Header) string {
	a, ok := strings.CutPrefix(h.Get("Authorization"), "Basic ")
	if !ok {
		return ""
	}
	raw, err := base64.StdEncoding.DecodeString(a)
	if err != nil {
		return ""
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return name
}

// account is the Bench's account that user names ("" its default user).
func (sb *sandbox) account(user string) (bench.Account, error) {
	rec := bench.Record{Name: sb.id, User: sb.defaultUser, Accounts: sb.accounts}
	return rec.Account(user)
}

// userError is an unknown user as envd answers one (Unauthenticated), with what the Bench has.
func userError(err error) error {
	e := app.Classify(err)
	msg := "invalid username: " + e.Error()
	if e.Hint != "" {
		msg += " (hint: " + e.Hint + ")"
	}
	return connect.NewError(connect.CodeUnauthenticated, errors.New(msg))
}

// rpcPath makes a path of an RPC absolute for its user, as envd does: relative to the user's home.
func (sb *sandbox) rpcPath(h http.Header, p string) (string, error) {
	a, err := sb.account(basicUser(h))
	if err != nil {
		return "", userError(err)
	}
	abs, err := app.InHome(p, a.Home)
	if err != nil {
		return "", connectError(err)
	}
	return abs, nil
}

// filePath is rpcPath for /files, whose user is the username query field; the error is the answer's.
func (sb *sandbox) filePath(r *http.Request, p string) (string, int, error) {
	a, err := sb.account(r.URL.Query().Get("username"))
	if err != nil {
		e := app.Classify(err)
		return "", http.StatusUnauthorized, fmt.Errorf("invalid username: %v (hint: %s)", e, e.Hint)
	}
	abs, err := app.InHome(p, a.Home)
	if err != nil {
		return "", http.StatusBadRequest, err
	}
	return abs, 0, nil
}
