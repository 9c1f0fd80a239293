package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// Signed file URLs (the SDK's downloadUrl and uploadUrl, src/sandbox/signature.ts): a /files request
// without the access token may carry signature=v1_BASE64(SHA-256("PATH:OPERATION:USER:TOKEN[:EXPIRY]")),
// the path and user as the query has them, the operation read for GET and write for POST, and the
// optional signature_expiration, in Unix seconds. envd's checks, in its order and with its messages:
// the signature first (so a forger never learns whether the expiry was the problem), then the expiry.
var (
	errBadSignature = errors.New("invalid signature")
	errExpired      = errors.New("signature is already expired")
)

// fileSignature is the signature the SDK makes for path, operation, user and token.
func fileSignature(path, operation, user, token string, expiration *int64) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != nil {
		raw += ":" + strconv.FormatInt(*expiration, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// bySignature is the sandbox whose token signed r, a /files request without the token: the one its
// E2b-Sandbox-Id names (the SDK's URL on 49983-ID.DOMAIN says it), else the one whose token makes
// the signature (a URL on E2B_SANDBOX_URL names no sandbox). One hash per sandbox, each compared in
// constant time.
func (s *Server) bySignature(r *http.Request) (*sandbox, int, error) {
	q := r.URL.Query()
	op := map[string]string{http.MethodGet: "read", http.MethodPost: "write"}[r.Method]
	if op == "" {
		return nil, http.StatusMethodNotAllowed, errors.New("a signed URL is for GET (read) or POST (write)")
	}
	var exp *int64
	if q.Has("signature_expiration") {
		v, err := strconv.ParseInt(q.Get("signature_expiration"), 10, 64)
		if err != nil {
			return nil, http.StatusBadRequest, errors.New("signature_expiration: Unix seconds")
		}
		exp = &v
	}
	got := []byte(q.Get("signature"))
	id := r.Header.Get("E2b-Sandbox-Id")
	s.mu.Lock()
	var cands []*sandbox
	for sid, sb := range s.sandboxes {
		if id == "" || sid == id {
			cands = append(cands, sb)
		}
	}
	s.mu.Unlock()
	var found *sandbox
	for _, sb := range cands {
		want := fileSignature(q.Get("path"), op, q.Get("username"), sb.token, exp)
		if subtle.ConstantTimeCompare([]byte(want), got) == 1 {
			found = sb
		}
	}
	if found == nil || !s.keyLive(found.keyID) {
		return nil, http.StatusUnauthorized, errBadSignature
	}
	if exp != nil && *exp < time.Now().Unix() {
		return nil, http.StatusUnauthorized, errExpired
	}
	return found, 0, nil
}

// dataAuth authenticates a data-plane request that does not carry the access token, before guard
// reads anything else: a /files request by its signature, and a request for a sandbox made with
// secure false (E2B answers it without a token) when it comes from the sandbox's owner, as the
// kernel names the client of a loopback connection. Either then goes on as the token's holder (the
// header is set on this process's copy of the request only). status is 0, or the refusal's.
func (s *Server) dataAuth(r *http.Request) (status int, err error) {
	if r.Header.Get("X-Access-Token") != "" || !(isConnect(r.URL.Path) || r.URL.Path == "/files" || r.URL.Path == "/health") {
		return 0, nil
	}
	if r.URL.Path == "/files" && r.URL.Query().Has("signature") {
		sb, status, err := s.bySignature(r)
		if err != nil {
			return status, err
		}
		r.Header.Set("X-Access-Token", sb.token)
		r.Header.Set("E2b-Sandbox-Id", sb.id)
		return 0, nil
	}
	s.mu.Lock()
	sb := s.sandboxes[r.Header.Get("E2b-Sandbox-Id")]
	s.mu.Unlock()
	if sb == nil || sb.secure {
		return 0, nil // the token's check refuses it
	}
	if uid, local := peerUID(r); local && (uid == 0 || uid == ownerUID(sb.user)) {
		r.Header.Set("X-Access-Token", sb.token)
	}
	return 0, nil
}
